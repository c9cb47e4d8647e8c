"""Fixtures of the bench's end-to-end tests: one real `inhouse serve` per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from serving import Served, start_serve


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for a test module: small context, two sequences a step so load queues."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = start_serve(log, max_model_len="512", max_num_seqs="2", kv_cache_memory="64MiB")
    yield server
    server.stop()
