"""The tokens a step's verification rounds sample, a state-free draft's rows in one call.

``Scheduler.update`` verifies drafts in rounds: round ``j`` samples each sequence still
in play at the logits row after its ``j``-th draft token, with the sequence's state as of
the tokens accepted so far. When nothing in that state can change the choice (greedy, no
penalties, no grammar, ``min_tokens`` already reached), each row gives the token it would
give in its round, so all of a draft's rows are sampled at its first: one sampler call for
a 17-row draft instead of up to 17 (~0.05 ms each). Other sequences go round by round, and
so do those asking for logprobs (a log-softmax a row is not worth spending on rows a
rejection may leave unread).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from inhouse.engine.sampler import SampledToken
from inhouse.engine.sequence import Sequence

Token = SampledToken | Exception
# Samples one token for each (logit row, sequence): the sampler over the step's logits.
SampleRows = Callable[[list[int], list[Sequence]], list[Token]]


def state_free(seq: Sequence) -> bool:
    """Whether the sequence's next tokens do not depend on the tokens it accepts first (and
    cost no more than an argmax a row to sample)."""
    p = seq.sampling_params
    return (
        p.greedy
        and p.logprobs is None
        and not p.has_penalties
        and seq.guide is None
        and seq.num_output_tokens >= p.min_tokens
    )


class RoundTokens:
    """The token of each ``(row, j)`` a round asks for: logits row ``offsets[row] + j``."""

    def __init__(
        self,
        sample: SampleRows,
        offsets: list[int],
        drafts: Mapping[int, list[int]],
        seq_of: Callable[[int], Sequence],
    ) -> None:
        self._sample, self._offsets, self._drafts, self._seq_of = sample, offsets, drafts, seq_of
        self._whole = {row for row in drafts if state_free(seq_of(row))}
        self._known: dict[tuple[int, int], Token] = {}

    def __call__(self, positions: list[tuple[int, int]]) -> list[Token]:
        wanted: list[tuple[int, int]] = []
        for row, j in positions:
            if (row, j) in self._known:
                continue
            last = len(self._drafts[row]) if row in self._whole else j
            wanted += [(row, k) for k in range(j, last + 1)]
        if wanted:
            rows = [self._offsets[row] + j for row, j in wanted]
            tokens = self._sample(rows, [self._seq_of(row) for row, _ in wanted])
            self._known.update(zip(wanted, tokens, strict=True))
        return [self._known[position] for position in positions]
