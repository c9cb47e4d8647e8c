"""A bounded schemathesis run (stateless, schema-valid and schema-breaking bodies) against
a real `inhouse serve` and a real gateway in front of it: no 5xx, every error body in
OpenAI's shape, and the server healthy afterwards.

The long run is the same test with more examples per operation and mode, e.g.
``INHOUSE_FUZZ_EXAMPLES=50 pytest tests/edges/test_fuzz.py -s --timeout=0`` (it prints its
counts; pytest-timeout's 600 s would stop it).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

if TYPE_CHECKING:  # the fixture's types; conftest is not a module to import at run time
    from conftest import Edges, Target

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("INHOUSE_FUZZ_EXAMPLES", "5"))
EMBEDDING_PATHS = {"/v1/embeddings"}
SHORT_OUTPUT = 16


def _aim(case: Any, target: Target, aim: int) -> None:
    """Leave a third of the generated bodies as they are; point the rest at a model the
    target serves, with an output short enough to fit the context, and half of those at a
    plain conversation too (a random model name is a 404, a random max_tokens or message
    list a 400, that test nothing past the first check; sampling values stay as generated)."""
    body = case.body
    if aim == 0 or not isinstance(body, dict):
        return
    if "model" in body:
        body["model"] = (
            target.embedding_model if case.path in EMBEDDING_PATHS else target.chat_model
        )
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(name), int) and body[name] > SHORT_OUTPUT:
            body[name] = SHORT_OUTPUT
    if aim == 2 and "messages" in body:
        body["messages"] = [{"role": "user", "content": "Say hi."}]


def _check(response: Any) -> str | None:
    """What is wrong with a response, or None."""
    if response.status_code >= 500:
        return f"{response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            return f"{response.status_code} is not JSON: {response.text[:300]}"
        error = body.get("error") if isinstance(body, dict) else None
        if set(body) != {"error"} or not isinstance(error, dict):
            return f"{response.status_code} not OpenAI-shaped: {response.text[:300]}"
        if set(error) != {"message", "type", "param", "code"}:
            return f"{response.status_code} not OpenAI-shaped: {response.text[:300]}"
    return None


def fuzz(target: Target, examples: int) -> tuple[Counter[str], list[str]]:
    """Run every operation of the target's /openapi.json; status classes seen and problems."""
    schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    statuses: Counter[str] = Counter()
    problems: list[str] = []

    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.data())
    def run(data: st.DataObject, strategy: st.SearchStrategy[Any], label: str) -> None:
        case = data.draw(strategy)
        _aim(case, target, data.draw(st.integers(0, 2)))
        response = case.call(base_url=target.url, headers=target.headers, timeout=120)
        statuses[f"{response.status_code // 100}xx"] += 1
        problem = _check(response)
        if problem is not None:
            problems.append(f"{label}: {problem}")

    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in GenerationMode:
            try:
                run(strategy=operation.as_strategy(mode), label=f"{operation.label} {mode.value}")
            except Unsatisfiable:  # no schema-breaking input exists (a GET without parameters)
                continue
    return statuses, problems


@pytest.mark.parametrize("via", ["serve", "gateway"])
def test_fuzzed_requests_get_no_5xx_and_openai_shaped_errors(edges: Edges, via: str) -> None:
    target = getattr(edges, via)
    statuses, problems = fuzz(target, EXAMPLES)
    print(f"fuzz {via}: {sum(statuses.values())} requests, {dict(sorted(statuses.items()))}")
    assert not problems, "\n".join(problems[:20])
    assert statuses["2xx"] > 0 and statuses["4xx"] > 0
    assert httpx.get(f"{target.url}/health", timeout=10).status_code == 200


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
NOT_AN_OBJECT = JSON_SCALARS | st.lists(JSON_VALUES, max_size=4)


@pytest.mark.parametrize("via", ["serve", "gateway"])
def test_fuzzed_bodies_that_are_not_objects_get_a_400_on_every_post(edges: Edges, via: str) -> None:
    """Schemathesis sends objects (its negative mode rarely anything else): a top-level
    null, number, string or array, on every POST route of /openapi.json."""
    target = getattr(edges, via)
    paths = httpx.get(f"{target.url}/openapi.json", timeout=30).json()["paths"]
    posts = sorted(path for path, item in paths.items() if "post" in item)
    headers = {**target.headers, "Content-Type": "application/json"}
    problems: list[str] = []

    @settings(max_examples=max(EXAMPLES, 10) * 4, deadline=None, database=None)
    @given(path=st.sampled_from(posts), body=NOT_AN_OBJECT)
    def run(path: str, body: Any) -> None:
        raw = json.dumps(body).encode()  # NaN and Infinity as JS writes them: not JSON
        response = httpx.post(f"{target.url}{path}", content=raw, headers=headers, timeout=60)
        problem = _check(response)
        if problem is None and response.status_code != 400:
            problem = f"{response.status_code}, not 400"
        if problem is not None:
            problems.append(f"{path} {raw[:80]!r}: {problem}")

    run()
    assert len(posts) >= 5
    assert not problems, "\n".join(problems[:20])
