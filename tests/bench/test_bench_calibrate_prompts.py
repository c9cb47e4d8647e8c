"""The calibration's prompts: new words every calibration, so a second calibration of the same
server finds none of the first one's prompts in its prefix cache."""

from __future__ import annotations

import asyncio

from inhouse.bench.calibrate import _Prober


def test_each_calibration_draws_prompts_no_earlier_one_sent() -> None:
    async def first_probe() -> str:
        (request,) = await _Prober(client=None, counter=None).prompts(1, 512, 1)  # type: ignore[arg-type]
        return request.messages[0]["content"]

    texts = [asyncio.run(first_probe()) for _ in range(3)]
    assert len(set(texts)) == 3
    # 16 words is one KV block of a prefix cache: no two calibrations share their first one
    assert len({" ".join(t.split()[:16]) for t in texts}) == 3
