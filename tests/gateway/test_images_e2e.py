"""Images through a real gateway with the `openai` client: a PNG as a data URI passed on to a
vision-capable upstream (the canned one: it records what it got), and seed 004's three 400s
(a misspelt part type, a bad data URI, more images than the model takes), http(s) image URLs
refused unless their host is allowed, every refusal answered before any upstream sees the
request, the count (never the image) in the audit, and no 5xx over hostile image parts."""

from __future__ import annotations

import base64
import io
import json
import random
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from canned_upstream import Canned
from gateway_under_test import Gateway, start_gateway
from PIL import Image

from inhouse.gateway.db_open import open_database
from inhouse.gateway.usage.report import usage
from serving import audit_rows

pytestmark = pytest.mark.slow

ALLOWED_HOST = "images.internal"


def png_data_uri(size: tuple[int, int] = (8, 8), color: str = "red") -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def asking(*parts: dict[str, object]) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, canned: Canned) -> Iterator[Gateway]:
    running = start_gateway(
        tmp_path_factory.mktemp("gateway"),
        canned,
        {"image_url_hosts": [ALLOWED_HOST]},
        vision=True,
    )
    try:
        yield running
    finally:
        running.process.stop()


def refused(gateway: Gateway, secret: str, messages: list[dict[str, object]]) -> dict[str, str]:
    with pytest.raises(openai.BadRequestError) as err:
        gateway.client(secret).chat.completions.create(
            model="eyes", messages=messages, max_tokens=4
        )
    return err.value.body


def test_a_png_data_uri_reaches_the_vision_upstream_and_the_audit_counts_it(
    gateway: Gateway, canned: Canned
) -> None:
    secret, uri = gateway.key("viewer", log_content=True), png_data_uri()
    seen = len(canned.asked())
    reply = gateway.client(secret).chat.completions.create(
        model="eyes", messages=asking(image_part(uri), image_part(uri)), max_tokens=4
    )
    assert reply.choices[0].message.content
    sent = canned.last()[1]["messages"][0]["content"]
    assert [p["image_url"]["url"] for p in sent[1:]] == [uri, uri]  # passed on unchanged
    assert len(canned.asked()) == seen + 1
    row = audit_rows(gateway.db_url, "viewer", 1)[0]
    assert row["status"] == 200 and row["images"] == 2
    assert uri[30:60] not in json.dumps(row)  # the count, never the image
    assert "not kept>" in row["prompt_text"] and "What is this?" in row["prompt_text"]
    db = open_database(gateway.db_url)
    try:
        (totals,) = usage(db, "person", time.time() - 3600, only={"person": "viewer"})
    finally:
        db.dispose()
    assert (totals.requests, totals.images) == (1, 2)


def test_seed_004s_three_400s_each_say_what_is_wrong(gateway: Gateway, canned: Canned) -> None:
    secret, seen = gateway.key("careless"), len(canned.asked())
    misspelt = refused(gateway, secret, asking({"type": "image", "image": png_data_uri()}))
    assert "not a chat completions part" in misspelt["message"]
    assert '"type": "image_url"' in misspelt["message"]
    assert misspelt["param"] == "messages[0].content[1].type"
    for url in ("data:image/png;base64,@@not base64@@", "data:text/plain;base64,aGk="):
        bad = refused(gateway, secret, asking(image_part(url)))
        assert "not a valid data URI of an image" in bad["message"], url
        assert bad["param"] == "messages[0].content[1].image_url.url"
    five = refused(gateway, secret, asking(*[image_part(png_data_uri())] * 5))
    assert five["code"] == "too_many_images"
    assert "5 images" in five["message"] and "at most 4" in five["message"]
    assert len(canned.asked()) == seen  # no upstream saw any of them
    rows = audit_rows(gateway.db_url, "careless", 4)
    assert [r["status"] for r in rows] == [400] * 4


def test_a_key_may_take_fewer_images_than_the_model(gateway: Gateway) -> None:
    secret = gateway.key("one-image", max_images=1)
    one = gateway.client(secret).chat.completions.create(
        model="eyes", messages=asking(image_part(png_data_uri())), max_tokens=4
    )
    assert one.choices[0].message.content
    two = refused(gateway, secret, asking(*[image_part(png_data_uri())] * 2))
    assert two["code"] == "too_many_images" and "this key takes at most 1" in two["message"]


def test_image_urls_are_fetched_only_from_allowed_hosts(gateway: Gateway, canned: Canned) -> None:
    secret = gateway.key("linker")
    for url in ("http://169.254.169.254/latest/meta-data", "https://example.com/cat.png"):
        body = refused(gateway, secret, asking(image_part(url)))
        assert "are not fetched from" in body["message"] and "image_url_hosts" in body["message"]
    assert (
        "data URI" in refused(gateway, secret, asking(image_part("file:///etc/passwd")))["message"]
    )
    allowed = f"https://{ALLOWED_HOST}/cat.png"
    gateway.client(secret).chat.completions.create(
        model="eyes", messages=asking(image_part(allowed)), max_tokens=4
    )
    assert canned.last()[1]["messages"][0]["content"][1]["image_url"]["url"] == allowed


def test_a_text_model_still_refuses_a_valid_image(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        gateway.client(gateway.key("textual")).chat.completions.create(
            model="m", messages=asking(image_part(png_data_uri())), max_tokens=4
        )
    assert err.value.body["code"] == "unsupported_capability"


def hostile_parts(rng: random.Random) -> list[object]:
    """Image parts as a careless or hostile client writes them."""
    junk: list[object] = [None, 7, "", [], {}, "x" * 300, {"url": None}, {"url": 5}, True]
    urls: list[object] = [
        "data:", "data:image/png;base64,", "data:image/png,AAAA", "data:image/;base64,AA==",
        "DATA:IMAGE/PNG;BASE64,AAAA", "data:image/png;base64,AAA", "http://", "https://[::1",
        "ftp://x/y.png", "javascript:alert(1)", "\ud800", "//host/x.png", png_data_uri(),
        *junk,
    ]  # fmt: skip
    types: list[object] = ["image_url", "image", "input_image", "IMAGE_URL", None, 3, "text"]
    parts: list[object] = []
    for _ in range(rng.randint(0, 7)):
        part: dict[str, object] = {"type": rng.choice(types)}
        if rng.random() < 0.8:
            part["image_url"] = (
                {"url": rng.choice(urls)} if rng.random() < 0.8 else rng.choice(junk)
            )
        parts.append(part if rng.random() < 0.9 else rng.choice(junk))
    return parts


def test_no_5xx_over_hostile_image_parts(gateway: Gateway) -> None:
    secret, rng = gateway.key("hostile-images"), random.Random(50)
    url = f"{gateway.url}/v1/chat/completions"
    statuses = []
    with httpx.Client(headers={"authorization": f"Bearer {secret}"}, timeout=30) as client:
        for _ in range(300):
            messages = [{"role": "user", "content": hostile_parts(rng)}]
            body = {"model": rng.choice(["eyes", "m"]), "messages": messages, "max_tokens": 2}
            reply = client.post(url, content=json.dumps(body))
            statuses.append(reply.status_code)
            assert reply.status_code < 500, (body, reply.text)
            if reply.status_code >= 400:
                assert reply.json()["error"]["message"]
    assert 200 in statuses and 400 in statuses
