"""The admin console in a real browser: Debian's chromium, driven by Playwright with
JavaScript off (the essentials need none), in front of `inhouse gateway` and `inhouse serve`
(the bundled model). Sign in with the admin key, create a key, use the secret shown once
with the official client, revoke it and see 401, search the audit, open the usage chart.

Screenshots land in the test's folder (printed; set INHOUSE_ARTEFACTS to copy them there).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from serving import SERVE_KEY, Served, debian_binary, free_port, gateway_process, gateway_toml

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass
class Console:
    url: str
    admin_secret: str
    shots: Path
    log: Path


def _config(port: int, db_url: str, served: Served) -> str:
    backend = {
        "name": "r1", "url": served.url, "api_key": SERVE_KEY, "model": served.model,
        "capabilities": ["chat", "completions"], "max_context": 2048,
    }  # fmt: skip
    cost = {
        "currency": "CNY",
        "hosted": {"input_per_million": 0.3, "output_per_million": 1.2},
        "owned": {"price": 15000, "watts": 450, "price_per_kwh": 0.6},
    }
    return gateway_toml(
        {"port": port, "database": db_url},
        [{"name": "smol", "backends": [backend]}],
        audit={"flush_interval_s": 0.2},
        cost=cost,
    )


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, bundled_serve: Served) -> Iterator[Console]:
    base = tmp_path_factory.mktemp("console-browser")
    served = bundled_serve
    port = free_port()
    config_path = base / "inhouse.toml"
    gateway = gateway_process(config_path, _config(port, f"sqlite:///{base / 'gw.db'}", served))
    config = load_config(config_path)
    _, admin = KeyStore(open_database(config.database), load_pepper(config)).create(
        "ops", admin=True
    )
    try:
        gateway.start()
        gateway.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        yield Console(f"http://127.0.0.1:{port}", admin, base, gateway.log)
    finally:
        gateway.stop()
        artefacts = os.environ.get("INHOUSE_ARTEFACTS")
        if artefacts:
            for shot in base.glob("*.png"):
                shutil.copy(shot, Path(artefacts) / shot.name)
        print(f"console screenshots: {base}")


def test_sign_in_create_use_revoke_search_and_chart_in_chromium(console: Console) -> None:
    chromium = debian_binary("chromium", "chromium")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860},
                                    java_script_enabled=False)  # fmt: skip
            _walk_through(page, console)
        finally:
            browser.close()
    log = console.log.read_text()
    assert console.admin_secret not in log and "ih-" not in log


def _walk_through(page: sync_api.Page, console: Console) -> None:
    def shot(name: str) -> None:
        page.screenshot(path=str(console.shots / f"{name}.png"), full_page=True)

    page.goto(f"{console.url}/admin")
    assert page.url.endswith("/admin/login")
    page.fill("#key", secrets.token_urlsafe(8))
    page.click("button[type=submit]")
    assert "not valid" in page.inner_text(".error")
    page.fill("#key", console.admin_secret)
    page.click("button[type=submit]")
    assert page.url.endswith("/admin") and "Teams and budgets" in page.content()
    shot("overview")

    page.goto(f"{console.url}/admin/teams")
    page.fill("form[action='/admin/teams'] input[name=name]", "search")
    page.fill("form[action='/admin/teams'] input[name=quota_tokens]", "100000")
    page.click("form[action='/admin/teams'] button[type=submit]")
    page.goto(f"{console.url}/admin/keys")
    page.fill("form[action='/admin/keys'] input[name=name]", "alice")
    page.fill("form[action='/admin/keys'] input[name=team]", "search")
    page.click("form[action='/admin/keys'] button[type=submit]")
    secret = page.inner_text("#secret").strip()
    assert secret.startswith("ih-")
    shot("key-created")
    page.goto(f"{console.url}/admin/keys")
    assert secret not in page.content()  # shown once

    client = openai.OpenAI(base_url=f"{console.url}/v1", api_key=secret, max_retries=0)
    for _ in range(3):
        answer = client.chat.completions.create(model="smol", messages=HELLO, max_tokens=8)
        assert answer.choices[0].message.content
    page.click("button[aria-label='revoke alice']")
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        client.chat.completions.create(model="smol", messages=HELLO, max_tokens=8)
    assert "revoked" in page.inner_text("table")
    shot("key-revoked")

    deadline = time.monotonic() + 10
    while True:  # the audit writer flushes every 0.2 s
        page.goto(f"{console.url}/admin/audit?key=alice&status=200")
        rows = page.locator("#audit-rows tr").count() - 1
        if rows >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert rows == 3 and "search" in page.inner_text("#audit-rows")
    shot("audit")

    page.goto(f"{console.url}/admin/usage?by=person&since=1d")
    assert "alice" in page.inner_text("table")
    chart = page.request.get(console.url + (page.get_attribute("#usage-chart", "src") or ""))
    assert chart.status == 200 and chart.headers["content-type"].startswith("image/svg+xml")
    assert chart.text().count("<rect") > 4  # bars besides the background and legend
    shot("usage")
    page.goto(f"{console.url}/admin/cost?since=1d")
    assert "per successful task" in page.inner_text("main")
    shot("cost")
