"""`inhouse serve` stopped (SIGTERM) while a stream runs longer than its graceful timeout:
the client gets an OpenAI error event and the end of the stream, not a cut connection
(issue 24 item 9). Its own real `inhouse serve`, since the test stops it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import openai
import pytest

from serving import SERVE_KEY, start_serve

pytestmark = pytest.mark.slow

GRACEFUL_S = 5  # `inhouse serve` runs uvicorn with timeout_graceful_shutdown=5


def test_sigterm_ends_a_long_stream_with_an_error_event(tmp_path: Path) -> None:
    served = start_serve(tmp_path / "serve.log")
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=SERVE_KEY, max_retries=0)
        stream = client.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": "Count to a thousand."}],
            max_tokens=1900, stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = iter(stream)
        next(chunks)
        assert served.process.popen is not None
        served.process.popen.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        with pytest.raises(openai.APIError) as ended:  # not httpx.RemoteProtocolError
            for _ in chunks:
                pass
        assert "shutting down" in ended.value.message
        assert time.monotonic() - sent < GRACEFUL_S + 10
        served.process.popen.wait(timeout=30)
    finally:
        served.stop()
