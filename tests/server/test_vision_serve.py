"""`inhouse serve` on a tiny random Idefics3, through the official `openai` client: PNG data URIs
answered with transformers' greedy tokens and its processor's prompt count, the same image
again a prefix-cache hit and another image not; every misuse of an image a 400 naming its
part, after which the server answers as before; http(s) image URLs fetched only from an
allowed host, with no redirect followed."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer

from hf_reference import hf_greedy
from serving import SERVE_KEY, Served, start_serve
from tiny_vision import data_uri, noise_image, save_tiny_idefics3

pytestmark = pytest.mark.slow
NEW_TOKENS = 8


class Pictures(http.server.BaseHTTPRequestHandler):
    """/a.png: a PNG; /hop: a redirect to it; anything else: 404."""

    png = b""

    def do_GET(self) -> None:
        if self.path == "/a.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(self.png)))
            self.end_headers()
            self.wfile.write(self.png)
        elif self.path == "/hop":
            self.send_response(302)
            self.send_header("Location", "/a.png")
            self.end_headers()
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def pictures() -> Iterator[str]:
    buffer = io.BytesIO()
    noise_image(7, (40, 60)).save(buffer, "PNG")
    Pictures.png = buffer.getvalue()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_idefics3(tmp_path_factory.mktemp("tiny-idefics3"), seed=3)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("vision-serve") / "serve.log"
    served = start_serve(log, model=str(folder), dtype="float32", max_model_len="512",
                         allowed_media_domains=["127.0.0.1"])  # fmt: skip
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def hf(folder: Path):
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    model = Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), AutoProcessor.from_pretrained(folder)


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=SERVE_KEY, max_retries=0)


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def ask(served: Served, content: list[dict], role: str = "user", **extra: object):
    return client(served).chat.completions.create(
        model=served.model, messages=[{"role": role, "content": content, **extra}],
        max_tokens=NEW_TOKENS, temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip


def hf_answer(hf, images: list, content: list[dict]) -> tuple[str, int]:
    """Transformers' greedy text and prompt length for the same message."""
    model, processor = hf
    parts = [{"type": "image"} if p["type"] == "image_url" else p for p in content]
    text = processor.apply_chat_template([{"role": "user", "content": parts}],
                                         add_generation_prompt=True)  # fmt: skip
    inputs = processor(text=[text], images=[images], add_special_tokens=False,
                       return_tensors="pt")  # fmt: skip
    ids = inputs["input_ids"][0].tolist()
    pixels = {k: inputs[k] for k in ("pixel_values", "pixel_attention_mask")}
    tokens = hf_greedy(model, ids, NEW_TOKENS, **pixels)
    return processor.tokenizer.decode(tokens, skip_special_tokens=True), len(ids)


def test_images_are_answered_as_transformers_answers_them(served: Served, hf) -> None:
    cases = [
        [noise_image(1, (40, 60))],
        [noise_image(2, (90, 20)), noise_image(3, (20, 20))],
    ]
    for images in cases:
        content = [image_part(data_uri(i)) for i in images]
        content.insert(1, {"type": "text", "text": "What do you see?"})
        answer = ask(served, content)
        text, prompt_tokens = hf_answer(hf, images, content)
        assert answer.choices[0].message.content == text
        assert answer.usage.prompt_tokens == prompt_tokens


def test_the_same_image_again_hits_the_prefix_cache_and_another_does_not(
    served: Served, folder: Path
) -> None:
    def content(seed: int) -> list[dict]:
        image = image_part(data_uri(noise_image(seed, (50, 40))))
        return [{"type": "text", "text": "Look:"}, image]

    def cached(seed: int) -> int:
        return ask(served, content(seed)).usage.prompt_tokens_details.cached_tokens

    auth = {"Authorization": f"Bearer {SERVE_KEY}"}
    body = {"model": served.model, "messages": [{"role": "user", "content": content(10)}]}
    ids = httpx.post(f"{served.url}/tokenize", json=body, headers=auth, timeout=60).json()["tokens"]
    image_token = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<image>")
    block = 16  # serve's default block size
    assert cached(10) == 0
    assert cached(11) == ids.index(image_token) // block * block  # only the text before it
    images_before = encoded(served)[0]
    assert cached(10) == (len(ids) - 1) // block * block  # all but the block of the last token
    assert encoded(served)[0] == images_before  # its rows came from the cache: not encoded


def test_image_misuse_is_a_400_naming_its_part_and_the_server_goes_on(served: Served) -> None:
    good = image_part(data_uri(noise_image(4, (30, 30))))
    huge = data_uri(Image.new("1", (9000, 9000)))  # 81 M pixels in a few kB
    cases = {
        "too_many_images": ([good] * 5, "at most 4 (its --limit-mm-per-prompt)"),
        "not a data URI": ([image_part("data:text/plain;base64,aGk=")], "not a valid data URI"),
        "not base64": ([image_part("data:image/png;base64,@@@")], "not base64"),
        "not an image": ([image_part("data:image/png;base64,aGVsbG8=")], "no image Pillow"),
        "a far host": ([image_part("http://10.0.0.1/a.png")], "not fetched from '10.0.0.1'"),
        "too many pixels": ([image_part(huge)], "9000 x 9000 pixels"),
        "a stray image token": ([good, {"type": "text", "text": "<image>"}], "must not contain"),
    }
    for name, (content, words) in cases.items():
        with pytest.raises(openai.BadRequestError) as caught:
            ask(served, content)
        assert words in caught.value.message, name
        assert caught.value.body["param"].startswith("messages"), name
    with pytest.raises(openai.BadRequestError, match="not in a tool result"):
        ask(served, [good], role="tool", tool_call_id="call_1")
    with pytest.raises(openai.BadRequestError, match="images come as chat image_url parts"):
        client(served).completions.create(model=served.model, prompt="a <image> here", max_tokens=2)
    assert ask(served, [good]).choices[0].finish_reason == "length"


def test_urls_are_fetched_from_an_allowed_host_and_redirects_are_not_followed(
    served: Served, pictures: str
) -> None:
    by_url = ask(served, [image_part(f"{pictures}/a.png")])
    inline = ask(served, [image_part(data_uri(noise_image(7, (40, 60))))])
    assert by_url.choices[0].message.content == inline.choices[0].message.content
    for path in ("/hop", "/missing.png"):
        with pytest.raises(openai.BadRequestError, match="could not be fetched"):
            ask(served, [image_part(f"{pictures}{path}")])


def encoded(served: Served) -> tuple[float, float]:
    """(images encoded, seconds) from serve's /metrics."""
    from inhouse.http.prometheus import sample_totals

    page = httpx.get(f"{served.url}/metrics", timeout=10).text
    totals = sample_totals(page)
    return totals["inhouse:images_encoded_total"], totals["inhouse:image_encode_seconds_total"]


def test_bench_splits_ttft_into_encoding_and_the_rest_from_metrics(
    served: Served, tmp_path: Path
) -> None:
    """`inhouse bench run --dataset random-mm` on serve: its images counted by /metrics as
    encoded, once each, and the report's TTFT split into encoding and the rest."""
    from typer.testing import CliRunner

    from inhouse.cli import app

    before, _ = encoded(served)
    argv = ["bench", "run", "--base-url", served.url, "--model", served.model, "--api-key",
            SERVE_KEY, "--dataset", "random-mm", "--images-per-prompt", "2", "--image-size",
            "48x40", "--input-len", "12", "--output-len", "4", "--num-prompts", "6",
            "--max-concurrency", "2", "--warmup", "0", "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert run["summary"]["completed"] == 6
    assert run["server_metrics"]["images_encoded"] == 12 == encoded(served)[0] - before
    assert run["server_metrics"]["image_encode_seconds"] > 0
    assert "images encoded 12" in result.output and "= encode" in result.output


def test_a_vision_model_takes_the_bodies_of_four_photos(served: Served) -> None:
    """serve's body cap is 20 MiB for a vision model (8 MiB for text): 12 MB of image data
    reaches the image checks, 21 MB is a 413."""
    auth = {"Authorization": f"Bearer {SERVE_KEY}"}

    def post(size: int) -> httpx.Response:
        part = image_part("data:image/png;base64," + "A" * size)
        body = {"model": served.model, "messages": [{"role": "user", "content": [part]}]}
        return httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=auth,
                          timeout=60)  # fmt: skip

    checked = post(12_000_000)
    assert checked.status_code == 400 and "Pillow" in checked.json()["error"]["message"]
    assert post(21_000_000).status_code == 413


def test_image_requests_at_once_get_the_answers_they_get_alone(served: Served) -> None:
    """Six chats with images (and two without) in one batch: each answer is the one the
    same request gets alone, so one request's images never reach another's rows."""
    from concurrent.futures import ThreadPoolExecutor

    contents = [
        [
            image_part(data_uri(noise_image(50 + k, (30 + 7 * k, 40)))),
            {"type": "text", "text": "Hi"},
        ]
        for k in range(6)
    ] + [[{"type": "text", "text": "No picture."}]] * 2
    alone = [ask(served, c).choices[0].message.content for c in contents]
    with ThreadPoolExecutor(len(contents)) as pool:
        together = list(pool.map(lambda c: ask(served, c).choices[0].message.content, contents))
    assert together == alone
    assert len(set(alone[:6])) >= 4  # the images differ, and so do most answers
