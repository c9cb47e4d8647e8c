"""Prefix-aware routing end to end (`gateway.affinity`): `inhouse up --replicas 2` on the
bundled model, the official openai client. A document's questions go back to the replica
that computed it, whose own prefix cache then answers the document; another tenant's
identical prompt is never routed by that prefix (the gateway's counter says which requests
were); with `--routing least-loaded` equal replicas take turns whatever the prompt."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from inhouse.gateway.backends import sample_totals
from serving import audit_rows, inhouse_command, up_stack

pytestmark = pytest.mark.timeout(600)

MODEL = "SmolLM2-135M-Instruct"
DOCUMENTS = [
    " ".join(f"Article {i}.{n}: the {topic} committee meets on day {n}." for n in range(14))
    for i, topic in enumerate(("budget", "safety"))
]
ROUTED = "inhouse:gateway_prefix_routed_total"
HITS = "inhouse:prefix_cache_hits_total"


def key(stack: dict, name: str) -> str:
    argv = [*inhouse_command(), "keys", "create", name]
    done = subprocess.run(argv, capture_output=True, text=True, env=stack["env"], timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def ask(stack: dict, secret: str, document: str, question: str) -> None:
    sdk = openai.OpenAI(base_url=f"{stack['gateway']}/v1", api_key=secret, max_retries=0)
    content = f"{document}\n\nQuestion: {question}"
    sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2
    )


def totals(url: str) -> dict[str, float]:
    return sample_totals(httpx.get(f"{url}/metrics", timeout=10).text)


def test_a_documents_questions_go_back_to_its_replica_and_not_across_tenants(
    tmp_path: Path,
) -> None:
    with up_stack(tmp_path, "prefix", "--replicas", "2", "--routing", "prefix", ready=2) as stack:
        tenant_a, tenant_b = key(stack, "tenant-a"), key(stack, "tenant-b")
        for document in DOCUMENTS:
            for question in ("Who meets?", "On which day?", "What is article 3?"):
                ask(stack, tenant_a, document, question)
        rows = audit_rows(stack["database"], "tenant-a", expect=6)
        homes = [{row["backend"] for row in rows[i : i + 3]} for i in (0, 3)]
        assert all(len(home) == 1 for home in homes), rows  # each document kept its replica
        (home,) = homes[0]
        routed = totals(stack["gateway"])[ROUTED]
        assert routed == 4  # each document's second and third question
        hits = totals(stack["replicas"][home])[HITS]
        ask(stack, tenant_b, DOCUMENTS[0], "Who meets?")  # tenant a's very prompt
        assert totals(stack["gateway"])[ROUTED] == routed  # not routed by a's prefix
        ask(stack, tenant_b, DOCUMENTS[0], "On which day?")
        assert totals(stack["gateway"])[ROUTED] == routed + 1  # by its own
        ask(stack, tenant_a, DOCUMENTS[0], "Who chairs it?")
        (row,) = audit_rows(stack["database"], "tenant-a", expect=7)[-1:]
        assert row["backend"] == home
        assert totals(stack["replicas"][home])[HITS] - hits >= 64  # its cache answered


def test_least_loaded_routing_takes_turns_whatever_the_prompt(tmp_path: Path) -> None:
    with up_stack(
        tmp_path, "least-loaded", "--replicas", "2", "--routing", "least-loaded", ready=2
    ) as stack:
        for question in ("Who meets?", "On which day?", "What is article 3?", "Who chairs?"):
            ask(stack, stack["admin"], DOCUMENTS[0], question)
        rows = audit_rows(stack["database"], "admin", expect=4)
        assert len({row["backend"] for row in rows}) == 2, rows
        assert totals(stack["gateway"]).get(ROUTED, 0.0) == 0
