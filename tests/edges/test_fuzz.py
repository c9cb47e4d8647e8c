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
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from fuzzing import fuzz, shape_problem
from hypothesis import given, settings
from hypothesis import strategies as st

if TYPE_CHECKING:  # the fixture's types; conftest is not a module to import at run time
    from conftest import Edges

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("INHOUSE_FUZZ_EXAMPLES", "5"))


@pytest.mark.parametrize("via", ["serve", "gateway"])
def test_fuzzed_requests_get_no_5xx_and_openai_shaped_errors(edges: Edges, via: str) -> None:
    target = getattr(edges, via)
    tally = fuzz(target, EXAMPLES)
    print(f"fuzz {via}: {tally.sent} requests, {dict(sorted(tally.statuses.items()))}")
    assert not tally.problems, "\n".join(tally.problems[:20])
    assert tally.statuses["2xx"] > 0 and tally.statuses["4xx"] > 0
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
        problem = shape_problem(response.status_code, response.text)
        if problem is None and response.status_code != 400:
            problem = f"{response.status_code}, not 400"
        if problem is not None:
            problems.append(f"{path} {raw[:80]!r}: {problem}")

    run()
    assert len(posts) >= 5
    assert not problems, "\n".join(problems[:20])
