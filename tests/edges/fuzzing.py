"""A bounded schemathesis run (stateless, schema-valid and schema-breaking bodies) over
every operation of a server's /openapi.json, and the check every answer must pass: no
5xx, and every error body in OpenAI's shape. Used by `test_fuzz` and
`benchmarks/hostile_suite.py`."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import requests
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

if TYPE_CHECKING:
    from stack import Target

EMBEDDING_PATHS = {"/v1/embeddings"}
GENERATING_PATHS = {"/v1/chat/completions", "/v1/completions"}
SHORT_OUTPUT = 16
ERROR_FIELDS = {"message", "type", "param", "code"}


def shape_problem(status: int, text: str) -> str | None:
    """What is wrong with an error answer's body (not `{"error": {message, type, param,
    code}}`), or None; answers under 400 have no error body to check."""
    if status < 400:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return f"{status} is not JSON: {text[:300]}"
    error = body.get("error") if isinstance(body, dict) and set(body) == {"error"} else None
    if not isinstance(error, dict) or set(error) != ERROR_FIELDS:
        return f"{status} not OpenAI-shaped: {text[:300]}"
    return None


@dataclass
class Tally:
    """Status classes seen, answers that broke the rules, and how many of each kind."""

    statuses: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    five_xx: int = 0
    not_openai: int = 0

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    def add(self, label: str, status: int, text: str, check_shape: bool = True) -> None:
        self.statuses[f"{status // 100}xx"] += 1
        shape = shape_problem(status, text) if check_shape else None
        self.five_xx += status >= 500
        self.not_openai += shape is not None
        if status >= 500 or shape is not None:
            self.problems.append(f"{label}: {shape or f'{status}: {text[:300]}'}")

    def timed_out(self, label: str) -> None:
        self.statuses["timeout"] += 1
        self.problems.append(f"{label}: no answer in time")


def _aim(case: Any, target: Target, aim: int) -> None:
    """Leave a third of the generated bodies as they are; point the rest at a model the
    target serves, with an output short enough to fit the context (set where the body has
    none, so no request runs to the end of a long context), and half of those at a plain
    conversation too (a random model name is a 404, a random max_tokens or message list a
    400, that test nothing past the first check; sampling values stay as generated)."""
    body = case.body
    if aim == 0 or not isinstance(body, dict):
        return
    if "model" in body:
        body["model"] = (
            target.embedding_model if case.path in EMBEDDING_PATHS else target.chat_model
        )
    caps = [name for name in ("max_tokens", "max_completion_tokens") if name in body]
    for name in caps:
        if not isinstance(body[name], int) or body[name] > SHORT_OUTPUT:
            body[name] = SHORT_OUTPUT
    if not caps and case.path in GENERATING_PATHS:
        body["max_tokens"] = SHORT_OUTPUT
    if aim == 2 and "messages" in body:
        body["messages"] = [{"role": "user", "content": "Say hi."}]


def fuzz(
    target: Target, examples: int, fixed_seed: int | None = None, timeout: float = 120
) -> Tally:
    """Run every operation of the target's /openapi.json, `examples` per operation and
    generation mode (with `fixed_seed`, the same bodies each run)."""
    schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    tally = Tally()

    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.data())
    def run(data: st.DataObject, strategy: st.SearchStrategy[Any], label: str) -> None:
        case = data.draw(strategy)
        _aim(case, target, data.draw(st.integers(0, 2)))
        try:
            response = case.call(base_url=target.url, headers=target.headers, timeout=timeout)
        except requests.Timeout:  # schemathesis calls through requests
            tally.timed_out(label)
            return
        tally.add(label, response.status_code, response.text)

    if fixed_seed is not None:
        run = seed(fixed_seed)(run)
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in GenerationMode:
            try:
                run(strategy=operation.as_strategy(mode), label=f"{operation.label} {mode.value}")
            except Unsatisfiable:  # no schema-breaking input exists (a GET without parameters)
                continue
    return tally
