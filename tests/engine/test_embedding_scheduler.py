"""The embedding scheduler with the bundled all-MiniLM-L6-v2: same vectors as one batch,
a small request beside a big one, a cancelled request stops."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch

from inhouse.engine.embedder import Embedder
from inhouse.engine.embedding_scheduler import EmbeddingScheduler
from inhouse.manifests.bundled import default_embedding_model

pytestmark = pytest.mark.slow

LONG = "hello world " * 200  # cut at 256 tokens: one input fills a step


@pytest.fixture(scope="module")
def scheduler() -> Iterator[EmbeddingScheduler]:
    scheduler = EmbeddingScheduler(Embedder(default_embedding_model()))
    try:
        yield scheduler
    finally:
        scheduler.close()


def test_vectors_and_token_counts_match_one_batch(scheduler: EmbeddingScheduler) -> None:
    texts = ["A man is eating food.", "A man is eating a piece of bread.", LONG, "hi"]
    result = scheduler.submit(texts).future.result(timeout=120)
    rows = scheduler.embedder.token_ids(texts)
    alone = scheduler.embedder.embed(rows)
    assert result.vectors.shape == (4, 384)
    assert torch.allclose(result.vectors, alone, atol=1e-5)
    assert result.prompt_tokens == sum(len(r) for r in rows)
    assert len(rows[2]) == scheduler.embedder.max_seq_length
    ids = scheduler.submit([rows[0]]).future.result(timeout=60)  # token ids as input
    assert torch.allclose(ids.vectors[0], alone[0], atol=1e-5)


def test_a_one_input_request_finishes_beside_a_big_one_which_stops_when_cancelled(
    scheduler: EmbeddingScheduler,
) -> None:
    before = scheduler.stats().inputs
    big = scheduler.submit([LONG] * 2000)
    _wait_for(lambda: scheduler.stats().inputs > before)
    small = scheduler.submit(["hello there"]).future.result(timeout=30)
    assert small.vectors.shape == (1, 384)
    assert not big.future.done()
    big.cancel()
    _wait_for(lambda: scheduler.stats().unfinished == 0)
    ran = scheduler.stats().inputs
    time.sleep(0.5)
    assert scheduler.stats().inputs == ran < before + 2000


def _wait_for(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)
