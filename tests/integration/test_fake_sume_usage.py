"""The fake Sume's `usage` ledger (issue 30) over real HTTP, read by the real client and by
Sume's rules: every status shape carries the job's credits, reserved while it runs, captured
when it completes, refunded when it fails, is canceled or expires; `ledger()` and `stats()`
sum exactly what the answers said. No database."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from vidpoll.policy import parsed_json_object
from vidpoll.providers.base import Cost, Pending, Terminal
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import STATUS_SHAPES, FakeSume
from vidpoll.providers.sume.rules import RULES

ENDINGS = {"completed": "succeeded", "failed": "failed", "canceled": "canceled",
           "expired": "expired"}


async def status_body(client: SumeClient, job_id: str) -> dict[str, Any]:
    answer = await client.read_status(job_id)
    assert answer.status == 200, answer
    body = parsed_json_object(answer.body)
    assert body is not None
    return body


@pytest.mark.parametrize("shape", STATUS_SHAPES)
async def test_every_shape_reports_the_ledger_the_fake_keeps(
        fake: FakeSume, client: SumeClient, shape: str) -> None:
    fake.config.status_shape = shape
    prices = {"completed": 40, "failed": 70, "canceled": 15, "expired": 5}
    for word, price in prices.items():
        fake.add_job(f"{shape}-{word}", outcome=word, price=price)
    fake.add_job(f"{shape}-running", outcome="completed", render_s=3600)  # the config's price

    for word, outcome in ENDINGS.items():
        body = await status_body(client, f"{shape}-{word}")
        view = RULES.read_status(body)
        assert isinstance(view, Terminal) and view.outcome == outcome, body
        spent = Decimal(prices[word]) if word == "completed" else Decimal(0)
        assert RULES.cost(body, outcome) == Cost(spent, "credit"), body
    running = await status_body(client, f"{shape}-running")
    assert isinstance(RULES.read_status(running), Pending)
    assert RULES.cost(running, "succeeded") is None  # only reserved: nothing settled yet

    ledger = fake.ledger()
    assert ledger == {"reserved": fake.config.credits_per_job, "captured": 40,
                      "refunded": 70 + 15 + 5,
                      "jobs": {f"{shape}-{w}": 40 if w == "completed" else 0
                               for w in (*prices, "running")}}
    stats = fake.stats()
    assert (stats["credits_reserved"], stats["credits_captured"],
            stats["credits_refunded"]) == (50, 40, 90)


async def test_created_jobs_cost_the_configured_price_and_the_cli_form_is_in_dollars(
        fake: FakeSume, client: SumeClient) -> None:
    fake.config.credits_per_job = 30
    fake.config.terminal_mix = {"completed": 1.0}
    fake.config.usage_form = "usd_micros"
    fake.config.status_shape = "data"
    created = [await client.create_video({"prompt": f"clip {n}"}, f"key-{n}") for n in range(3)]
    ids = [RULES.created_job_id(parsed_json_object(a.body)) for a in created]
    assert all(ids) and fake.billed == 3
    for job_id in ids:
        assert job_id is not None
        body = await status_body(client, job_id)
        usage = body["data"]["usage"]
        assert usage["usage_status"] == "captured" and usage["currency"] == "USD"
        assert usage["captured_amount_usd_micros"] == 30 * fake.config.usd_micros_per_credit
        # 30 credits at 10,000 micro-dollars each: $0.30, as Sume's CLI would show it
        assert RULES.cost(body, "succeeded") == Cost(Decimal("0.3"), "usd")
    assert fake.ledger()["captured"] == 90 and fake.ledger()["refunded"] == 0
