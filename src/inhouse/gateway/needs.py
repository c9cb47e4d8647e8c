"""What a request needs of an upstream (features, prompt, output, choices), and whether an
upstream has it: read from the body by `parsing`, matched against replicas by `routing`."""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.gateway.config import Upstream


@dataclass(frozen=True, slots=True)
class Needs:
    """Features, prompt estimate and bound, and the output the request asks for.

    `choices` counts the completions generated, each up to the output cap: `n` per prompt
    (a completions batch of 100 prompts with `n` 2 generates 200)."""

    features: frozenset[str]
    prompt_tokens: int
    max_output: int | None
    choices: int
    prompt_bound: int = 0
    batch_longest: tuple[int, int] | None = None  # a batch's longest prompt: estimate, bound
    images: int = 0  # image parts of a chat request (`images`)

    def longest(self) -> tuple[int, int]:
        """Estimate and bound of the longest single prompt (the whole prompt unless a batch)."""
        return self.batch_longest or (self.prompt_tokens, self.prompt_bound)

    def output_cap(self, default: int, limit: int | None) -> int:
        """The output cap sent upstream: the request's, else `default` within `limit`."""
        if self.max_output is not None:
            return self.max_output
        return default if limit is None else min(default, limit)

    def reserve(self, prompt: int, output_cap: int) -> int:
        """Tokens to reserve at admission: the prompt + the output cap per choice."""
        return prompt + output_cap * self.choices


def missing_capability(upstream: Upstream, needs: Needs) -> str | None:
    """Why this upstream cannot serve the request, or None if it can."""
    caps = upstream.capabilities
    missing = sorted(needs.features - caps.features)
    if missing:
        return f"model does not support {', '.join(missing)}"
    out = needs.max_output
    if caps.max_output is not None and out is not None and out > caps.max_output:
        return f"max_tokens {needs.max_output} exceeds the model's output limit {caps.max_output}"
    prompt = needs.longest()[0]
    if caps.max_context is not None and prompt + (out or 0) > caps.max_context:
        return (
            f"prompt (~{prompt} tokens) + max_tokens ({out or 0})"
            f" exceeds the model's context of {caps.max_context} tokens"
        )
    return None
