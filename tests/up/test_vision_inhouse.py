"""A vision-language model through `inhouse up` on our own engine: the tiny random Idefics3
served by `inhouse serve` (started with `--limit-mm-per-prompt` as the plan says), the gateway
in front with the route's `vision` capability and the same image limit; the `openai` client's
PNG answered with transformers' prompt count, a fifth image refused at the gateway."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from serving import up_stack
from tiny_vision import data_uri, noise_image, save_tiny_idefics3, tiny_processor

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    home = tmp_path_factory.mktemp("up-vision-inhouse")
    folder = save_tiny_idefics3(home / "tiny-idefics3")
    with up_stack(home, "vision", str(folder), "--max-model-len", "512") as stack:
        yield stack


def content(count: int) -> list[dict]:
    images = [{"type": "image_url", "image_url": {"url": data_uri(noise_image(k, (48, 40)))}}
              for k in range(count)]  # fmt: skip
    return [{"type": "text", "text": "What is this?"}, *images]


def hf_prompt_tokens(count: int) -> int:
    processor = tiny_processor()
    parts = [{"type": "text", "text": "What is this?"}, *[{"type": "image"}] * count]
    text = processor.apply_chat_template([{"role": "user", "content": parts}],
                                         add_generation_prompt=True)  # fmt: skip
    images = [noise_image(k, (48, 40)) for k in range(count)]
    return len(processor(text=[text], images=[images], add_special_tokens=False)["input_ids"][0])


def test_our_engine_answers_images_behind_the_gateway_and_the_limit_holds(up: dict) -> None:
    gateway = openai.OpenAI(base_url=f"{up['gateway']}/v1", api_key=up["admin"], max_retries=0)
    (model,) = [m.id for m in gateway.models.list().data]
    answer = gateway.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content(2)}], max_tokens=4,
        temperature=0,
    )  # fmt: skip
    assert answer.usage.prompt_tokens == hf_prompt_tokens(2)
    (pid,) = re.findall(r"^replica \S+: pid (\d+) on ", Path(up["log"]).read_text(), re.M)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--limit-mm-per-prompt") + 1] == b'{"image": 4}'
    # refused by the gateway (its setting named), before the replica sees it
    with pytest.raises(
        openai.BadRequestError, match=re.escape("at most 4 (its images_per_prompt)")
    ) as refused:
        gateway.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content(5)}], max_tokens=4
        )
    assert refused.value.code == "too_many_images"
