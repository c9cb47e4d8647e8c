"""Engine logprobs to OpenAI's two shapes (chat and legacy completions)."""

from __future__ import annotations

from inhouse.api.chat import ChoiceLogprobs, TokenLogprobEntry, TopLogprob
from inhouse.api.completions import CompletionLogprobs
from inhouse.engine.outputs import TokenLogprob


def _finite(value: float) -> float:
    # JSON has no -inf; OpenAI reports very unlikely tokens as -9999.0.
    return value if value > -9999.0 else -9999.0


def chat_logprobs(entries: list[TokenLogprob], top: int) -> ChoiceLogprobs:
    """``choices[i].logprobs`` of a chat response: chosen token and ``top`` alternatives."""
    return ChoiceLogprobs(
        content=[
            TokenLogprobEntry(
                token=e.token,
                logprob=_finite(e.logprob),
                bytes=list(e.token.encode()),
                top_logprobs=[
                    TopLogprob(token=t, logprob=_finite(lp), bytes=list(t.encode()))
                    for _, t, lp in e.top[:top]
                ],
            )
            for e in entries
        ]
    )


def completion_logprobs(entries: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """Legacy logprobs; ``offset`` is the text length before the first of these tokens."""
    out = CompletionLogprobs()
    for e in entries:
        out.tokens.append(e.token)
        out.token_logprobs.append(_finite(e.logprob))
        out.top_logprobs.append({t: _finite(lp) for _, t, lp in e.top} or None)
        out.text_offset.append(offset)
        offset += len(e.token)
    return out
