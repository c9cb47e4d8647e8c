"""Earlier requests' outputs, the second source of suffix decoding's drafts.

vLLM's ``suffix`` method (Arctic Inference's SuffixDecoding) drafts from the request's own
prompt and output and from the outputs of earlier requests, so a reply that goes the way
earlier ones went (a fixed format, a recurring phrase, a document summarised again) is
drafted from them. This holds the second part: the outputs of the last ``max_requests``
finished requests, at most ``MAX_TOKENS`` tokens in all (the oldest leave first), indexed by
every window of ``KEY`` tokens (the ``PER_KEY`` most recent places each occurs). Outputs
are shared only among requests of the same ``cache_salt``, as prefix-cache blocks are:
each salt's windows are keys of their own, so one tenant's replies never draft another's
(which the timing would tell).

A draft looks the sequence's last ``KEY`` tokens up once, extends each place's match
backwards (to at most ``max_depth`` tokens) and keeps the places with the longest. From
there it drafts, position by position, the token most of the remaining places continue
with (the most recent on a tie), while the product of those shares (the continuation's
estimated probability, as in a suffix tree's counts) stays at least ``min_token_prob``,
and at most ``max_spec_factor`` times the match's length.
"""

from __future__ import annotations

from collections import deque

KEY = 4
PER_KEY = 16
MAX_TOKENS = 1 << 18
_BITS = 20  # token ids below 2**20: a window of KEY ids packs into one int exactly
_POS = 32  # an index entry: the output's serial << _POS | where the continuation starts


def _key(tokens: list[int], end: int, tag: int) -> int:
    """The window ``tokens[end - KEY:end]`` of the salt numbered ``tag`` as one int."""
    key = tag
    for token in tokens[end - KEY : end]:
        key = key << _BITS | token
    return key


class OutputHistory:
    """Finished outputs, searchable by their windows of ``KEY`` tokens."""

    def __init__(self, max_requests: int, max_depth: int, factor: float, min_prob: float) -> None:
        self.max_requests = max_requests
        self.max_depth = max_depth
        self.factor = factor
        self.min_prob = min_prob
        self._outputs: deque[tuple[str | None, int, list[int]]] = deque()  # salt, tag, output
        self._first = 0  # the serial of _outputs[0]
        self._tokens = 0
        self._index: dict[int, list[int]] = {}  # lists: an empty deque is 760 bytes
        self._tags: dict[str | None, tuple[int, int]] = {}  # salt: (tag, outputs held)
        self._next_tag = 0

    def __len__(self) -> int:
        """How many outputs it holds."""
        return len(self._outputs)

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def add(self, output: list[int], salt: str | None = None) -> None:
        """Take a finished output of a request salted ``salt`` (one too short to hold a
        window, or out of the vocabulary a window packs, is left out), then drop the
        oldest past either bound."""
        if self.max_requests == 0 or len(output) <= KEY or max(output) >> _BITS:
            return
        output = output[-MAX_TOKENS:]
        tag, held = self._tags.get(salt) or (self._new_tag(), 0)
        self._tags[salt] = (tag, held + 1)
        serial = self._first + len(self._outputs)
        self._outputs.append((salt, tag, output))
        self._tokens += len(output)
        index = self._index
        for at in range(KEY, len(output)):
            place = serial << _POS | at
            places = index.get(key := _key(output, at, tag))
            if places is None:
                index[key] = [place]
            else:
                places.append(place)
                if len(places) > PER_KEY:
                    del places[0]
        while len(self._outputs) > self.max_requests or self._tokens > MAX_TOKENS:
            self._drop_oldest()

    def _new_tag(self) -> int:
        self._next_tag += 1
        return self._next_tag

    def _drop_oldest(self) -> None:
        salt, tag, output = self._outputs.popleft()
        serial = self._first
        self._first += 1
        self._tokens -= len(output)
        held = self._tags[salt][1] - 1
        if held:
            self._tags[salt] = (tag, held)
        else:
            del self._tags[salt]
        for at in range(KEY, len(output)):
            key = _key(output, at, tag)
            places = self._index.get(key)
            while places and places[0] >> _POS == serial:
                del places[0]
            if places is not None and not places:
                del self._index[key]

    def draft(
        self, token_ids: list[int], k: int, longer_than: int = 0, salt: str | None = None
    ) -> tuple[int, list[int]]:
        """How long a match ``token_ids``'s ending has among the outputs salted ``salt``
        (0: none, or not longer than ``longer_than``) and the draft it gives, at most ``k``
        tokens."""
        held = self._tags.get(salt)
        if held is None or len(token_ids) < KEY or max(token_ids[-KEY:]) >> _BITS:
            return 0, []
        places = self._index.get(_key(token_ids, len(token_ids), held[0]))
        if not places:
            return 0, []
        longest, found = self._longest(token_ids, places)
        if longest <= longer_than:
            return 0, []
        return longest, self._follow(found, min(k, int(self.factor * longest)))

    def _longest(
        self, token_ids: list[int], places: list[int]
    ) -> tuple[int, list[tuple[list[int], int]]]:
        """The longest backward match among ``places`` and every place that has it, the
        most recent first, as (output, where its continuation starts)."""
        longest, found = 0, []
        reach = min(self.max_depth, len(token_ids))
        for place in reversed(places):
            output = self._outputs[(place >> _POS) - self._first][2]
            at = place & ((1 << _POS) - 1)
            n = KEY
            while n < reach and n < at and output[at - n - 1] == token_ids[-n - 1]:
                n += 1
            if n > longest:
                longest, found = n, [(output, at)]
            elif n == longest:
                found.append((output, at))
        return longest, found

    def _follow(self, found: list[tuple[list[int], int]], limit: int) -> list[int]:
        """The tokens most of ``found`` continue with, while their share's product holds."""
        draft: list[int] = []
        probability = 1.0
        while len(draft) < limit and found:
            counts: dict[int, int] = {}
            for output, at in found:  # most recent first: a tie goes to the first counted
                if at + len(draft) < len(output):
                    token = output[at + len(draft)]
                    counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            token = max(counts, key=counts.__getitem__)
            probability *= counts[token] / len(found)
            if probability < self.min_prob:
                break
            found = [
                (output, at)
                for output, at in found
                if at + len(draft) < len(output) and output[at + len(draft)] == token
            ]
            draft.append(token)
        return draft
