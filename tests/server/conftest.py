"""One real ``inhouse serve`` (uvicorn, bundled models, small KV budget) for the server tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from serving import Served, start_serve

API_KEY = "test-key"
MAX_BODY_BYTES = 64 * 1024
MAX_MODEL_LEN = 1024


@dataclass
class RunningServer:
    """The server under test and what was seen while it started."""

    served: Served

    @property
    def base_url(self) -> str:
        return self.served.url

    @property
    def health_seen(self) -> list[int]:
        return self.served.health_seen

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0, **kwargs
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0)

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60
        )


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    served = start_serve(
        log, API_KEY, max_model_len=str(MAX_MODEL_LEN), max_num_seqs="32",
        max_request_body=str(MAX_BODY_BYTES), embedding_model=None,
    )  # fmt: skip
    try:
        yield RunningServer(served)
    finally:
        served.stop()
