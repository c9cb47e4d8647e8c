"""`inhouse bench calibrate` against a real `inhouse serve --speculative-config`: the profile
holds the acceptance its probe measured; a server without speculation gets none."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from inhouse.bench.acceptance import copy_edit_prompts, probe_acceptance
from inhouse.bench.calibrate import CalibrationError, Probes, Target, calibrate, describe
from inhouse.bench.client import StreamingClient
from inhouse.bench.datasets import read_jsonl
from inhouse.cli import app
from inhouse.plan.perf_model import profile_from_json
from serving import SERVE_KEY as API_KEY
from serving import Served, start_serve

pytest.importorskip("inhouse.server")
pytestmark = pytest.mark.slow

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}  # fmt: skip
PROBES = Probes(
    prefill_prompts=(64, 320), prefill_repeats=1, decode_batches=(1, 2), decode_output=8,
    long_prompts=(), long_prompt=400, long_batches=(1,), acceptance_requests=2,
    acceptance_output=48,
)  # fmt: skip


@pytest.fixture(scope="module")
def speculating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("serve-spec") / "serve.log"
    server = start_serve(
        log, max_model_len="1024", max_num_seqs="4", kv_cache_memory="64MiB",
        speculative_config=json.dumps(SPEC),
    )  # fmt: skip
    yield server
    server.stop()


def test_calibrating_a_speculating_server_measures_its_acceptance(
    speculating: Served, tmp_path: Path
) -> None:
    target = Target(speculating.url, speculating.model, API_KEY, max_num_seqs=4)
    profile = asyncio.run(calibrate(target, PROBES))
    spec = profile.speculation
    assert spec is not None
    assert spec.num_speculative_tokens == 3 and spec.disable_by_batch_size == 4
    assert spec.requests == 2
    assert 0 <= spec.acceptance_rate <= 1 and 1 <= spec.mean_accepted_length <= 4
    assert spec.acceptance_rate > 0  # copying a passage from the prompt accepts some drafts
    lines = describe(profile)
    assert spec.mean_draft_length is not None and 1 <= spec.mean_draft_length <= 3
    assert any(
        line.startswith("speculation: ") and "of up to 3 draft tokens" in line for line in lines
    )
    assert any("--acceptance-base-url" in line for line in lines)  # its decodes drafted
    assert profile_from_json(json.loads(json.dumps(profile.to_json()))) == profile


def test_step_cost_from_the_plain_server_and_acceptance_from_the_speculating_one(
    served: Served, speculating: Served
) -> None:
    target = Target(
        served.url, served.model, API_KEY, max_num_seqs=2, acceptance_base_url=speculating.url
    )
    profile = asyncio.run(calibrate(target, PROBES))
    assert profile.speculation is not None and profile.speculation.requests == 2
    assert profile.measured["acceptance_base_url"] == speculating.url
    assert not any("--acceptance-base-url" in line for line in describe(profile))


def test_the_acceptance_dataset_is_the_teams_own_prompts(
    speculating: Served, tmp_path: Path
) -> None:
    dataset = tmp_path / "traffic.jsonl"
    chat = {"role": "user", "content": "Repeat exactly: the red fox ran over the red hill."}
    counting = "One, two, three, one, two, three, one, two,"
    lines = [{"messages": [chat], "max_tokens": 16}, {"prompt": counting, "max_tokens": 16}]
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))

    async def probe():
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with (
            httpx.AsyncClient(base_url=speculating.url, headers=headers) as http,
            StreamingClient(
                speculating.url, speculating.model, api_key=API_KEY,
                sampling={"temperature": 0.0},
            ) as client,
        ):  # fmt: skip
            return await probe_acceptance(http, client.send, read_jsonl(dataset, 16))

    spec = asyncio.run(probe())
    assert spec is not None and spec.requests == 2
    assert 0 <= spec.acceptance_rate <= 1 and spec.mean_accepted_length >= 1


def test_a_server_without_speculation_gets_no_acceptance_probe(served: Served) -> None:
    async def probe():
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with (
            httpx.AsyncClient(base_url=served.url, headers=headers) as http,
            StreamingClient(served.url, served.model, api_key=API_KEY) as client,
        ):
            return await probe_acceptance(http, client.send, copy_edit_prompts(1))

    assert asyncio.run(probe()) is None


def test_an_acceptance_server_that_does_not_speculate_is_one_clear_error(served: Served) -> None:
    target = Target(
        served.url, served.model, API_KEY, max_num_seqs=2, acceptance_base_url=served.url
    )
    with pytest.raises(CalibrationError, match="does not speculate"):
        asyncio.run(calibrate(target, PROBES))


def test_a_missing_acceptance_dataset_is_one_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "none.jsonl"
    result = CliRunner().invoke(
        app, ["bench", "calibrate", "--base-url", "http://127.0.0.1:9", "--model", "m",
              "--acceptance-dataset", str(missing), "--out", str(tmp_path / "p.json")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert f"error: cannot read {missing}" in result.output
