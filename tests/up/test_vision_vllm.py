"""A vision-language model through `inhouse up --engine vllm`: a tiny random Idefics3
(`tests/tiny_vision.py`) served by vLLM's CPU backend, the gateway in front, the `openai`
client sending a PNG as a data URI; its prompt counted as transformers' own processor counts
it. The gateway and vLLM hold one image limit: the route's `images_per_prompt` and the
replica's `--limit-mm-per-prompt` are the same number."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PIL import Image

from inhouse.launch.vllm import find_vllm, installed_venv
from inhouse.plan.vision import DEFAULT_IMAGES_PER_PROMPT
from tiny_vision import TOKENS_PER_TILE, save_tiny_idefics3, tiny_processor
from vllm_stack import client, replicas, running_up_vllm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up_vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    if find_vllm() is None:
        pytest.skip(f"vLLM is not installed: `make vllm` installs it into {installed_venv()}")
    home = tmp_path_factory.mktemp("up-vision")
    folder = save_tiny_idefics3(home / "tiny-idefics3")
    with running_up_vllm(home, 1, ("--max-model-len", "512", str(folder))) as up:
        yield up


SIZE = (48, 40)  # scaled to 64 × 54: 2 × 2 tiles and the whole image, 4 tokens each
IMAGE_TOKENS = 5 * TOKENS_PER_TILE


def hf_prompt_tokens(content: list[dict[str, object]]) -> int:
    """The prompt's tokens as transformers' processor makes them (the same template)."""
    processor = tiny_processor()
    asked = [{"role": "user", "content": content}]
    text = processor.apply_chat_template(asked, add_generation_prompt=True)
    images = [Image.new("RGB", SIZE) for part in content if part["type"] == "image_url"]
    inputs = processor(text=[text], images=[images] if images else None)
    return len(inputs["input_ids"][0])


def png(color: str) -> dict[str, object]:
    buffer = io.BytesIO()
    Image.new("RGB", SIZE, color).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def asked(*images: dict[str, object]) -> list[dict[str, object]]:
    return [{"type": "text", "text": "What is this?"}, *images]


def ask(up: dict, *images: dict[str, object]) -> openai.types.chat.ChatCompletion:
    gateway = client(up)
    (model,) = [m.id for m in gateway.models.list().data]
    content = asked(*images)
    return gateway.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0
    )


def test_a_png_data_uri_is_answered_through_the_gateway(up_vision: dict) -> None:
    with_image, without = ask(up_vision, png("red")), ask(up_vision)
    assert with_image.usage is not None and without.usage is not None
    assert with_image.usage.completion_tokens == 4
    assert with_image.usage.prompt_tokens == hf_prompt_tokens(asked(png("red")))
    assert without.usage.prompt_tokens == hf_prompt_tokens(asked())
    assert with_image.usage.prompt_tokens - without.usage.prompt_tokens > IMAGE_TOKENS


def test_the_gateway_and_vllm_hold_the_same_image_limit(up_vision: dict) -> None:
    ((pid, _),) = replicas(up_vision["log"]).values()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    limit = json.loads(argv[argv.index(b"--limit-mm-per-prompt") + 1])
    assert limit == {"image": DEFAULT_IMAGES_PER_PROMPT}
    assert ask(up_vision, *[png("blue")] * DEFAULT_IMAGES_PER_PROMPT).choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        ask(up_vision, *[png("blue")] * (DEFAULT_IMAGES_PER_PROMPT + 1))
    assert err.value.body["code"] == "too_many_images"
    assert f"at most {DEFAULT_IMAGES_PER_PROMPT}" in err.value.body["message"]


def inhouse(argv: list[str]) -> None:
    """`inhouse ARGV` in process; it must succeed."""
    from typer.testing import CliRunner

    from inhouse.cli import app

    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_bench_random_mm_sends_images_and_counts_their_tokens(
    up_vision: dict, tmp_path: Path
) -> None:
    """`inhouse bench run --dataset random-mm` (vLLM bench's dataset of the same name) through
    the gateway: every request answered, and the server's prompt counts hold the images."""
    (model,) = [m.id for m in client(up_vision).models.list().data]
    inhouse([
        "bench", "run", "--base-url", up_vision["gateway"], "--model", model,
        "--api-key", up_vision["admin"], "--dataset", "random-mm", "--images-per-prompt", "2",
        "--image-size", "48x40", "--input-len", "12", "--output-len", "4",
        "--num-prompts", "6", "--max-concurrency", "2", "--warmup", "0", "--out", str(tmp_path),
    ])  # fmt: skip
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    summary = run["summary"]
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["mean_input_tokens"] >= 2 * IMAGE_TOKENS  # the images' tokens, by usage


def colour_item(colour: str) -> dict[str, object]:
    """An eval item showing the image file `COLOUR.png` beside the set."""
    content = [
        {"type": "text", "text": "Which colour is this?"},
        {"type": "image_url", "image_url": {"url": f"file:{colour}.png"}},
    ]
    messages = [{"role": "user", "content": content}]
    return {"id": colour, "messages": messages, "expected": colour, "grader": "contains",
            "max_tokens": 4}  # fmt: skip


def test_eval_items_with_images_are_asked_and_graded(up_vision: dict, tmp_path: Path) -> None:
    """An eval set whose items show images kept beside it (`file:` URLs): each item asked
    through the gateway with its image, graded, none an error."""
    for colour in ("red", "blue"):
        Image.new("RGB", SIZE, colour).save(tmp_path / f"{colour}.png")
    eval_set = tmp_path / "colours.jsonl"
    eval_set.write_text("".join(json.dumps(colour_item(c)) + "\n" for c in ("red", "blue")))
    out = tmp_path / "out"
    inhouse([
        "eval", str(eval_set), "--base-url", up_vision["gateway"], "--api-key", up_vision["admin"],
        "--out", str(out), "--concurrency", "2",
    ])  # fmt: skip
    (side,) = json.loads((out / "report.json").read_text())["endpoints"]
    assert side["errors"] == 0 and side["accuracy"]["n"] == 2
    assert side["prompt_tokens_mean"] >= IMAGE_TOKENS  # the image reached the model
