"""The spend page, held intents and a job's cost in a real headless Chromium (the fixtures of
test_dashboard): each account's month in its own time zone, spent and reserved apart, the day
cap, the month against its cap, what is held and why (escaped), "no prices set". One test:
most of its time is the browser's start and the database's copy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest
from playwright.async_api import Page

from tests.e2e import test_dashboard
from vidpoll.spend import AccountSpend
from vidpoll.store import PgStore
from vidpoll.web import GUARD, make_app, start_server
from vidpoll.web.dashboard import setup_dashboard

NOW = datetime(2026, 3, 31, 20, 0, tzinfo=UTC)
"""22:00 on 31 March in Paris (summer time), 05:00 on 1 April in Tokyo: two months at once."""
SPENDS = {
    "paris": AccountSpend(currency="EUR", prices={"default": Decimal("0.50")},
                          cap_per_day=Decimal("2"), cap_per_month=Decimal("20"),
                          cap_timezone="Europe/Paris"),
    "tokyo": AccountSpend(prices={"default": Decimal("0.40")}, cap_timezone="Asia/Tokyo"),
    "plain": AccountSpend(max_creates_per_hour=100),
}
HTML = "<b>bold</b><img src=x>"

browser, page = test_dashboard.browser, test_dashboard.page  # its fixtures: Chromium, a tab


@pytest.fixture
async def spend_site(store: PgStore) -> AsyncIterator[str]:
    app = make_app(store, None, dashboard=False)
    setup_dashboard(app, store, app[GUARD], spends=SPENDS, clock=lambda: NOW)
    runner, url = await start_server(app, "127.0.0.1", 0)
    yield url
    await runner.cleanup()


async def seed(store: PgStore, db_url: str) -> list[str]:
    """Paris: spent on two earlier days (and in February), six creates today of which the day
    cap lets four go (reserved) and holds two; Tokyo: a reservation on its 1 April; plain: a
    create counted without a price. Returns the keys held."""
    for n in range(6):
        await store.add_intent(f"p-{n}", {"n": n}, account="paris")
    claim = await store.claim_checked(10, 3600.0, "w", None, account="paris",
                                      spend=SPENDS["paris"], spend_now=NOW)
    assert (len(claim.intents), len(claim.held)) == (4, 2)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO vidpoll_spend (idempotency_key, account, provider, model, day, "
            "reserved_at, currency, estimate, amount, status) VALUES "
            "('old-1', 'paris', 'sume', 'm1', '2026-03-03', now(), 'EUR', 0.5, 0.5, 'spent'), "
            "('old-2', 'paris', 'sume', 'm1', '2026-03-03', now(), 'EUR', 0.5, 1.0, 'spent'), "
            "('old-3', 'paris', 'sume', 'm2', '2026-03-10', now(), 'EUR', 0.5, 2.0, 'spent'), "
            "('feb-1', 'paris', 'sume', 'm1', '2026-02-28', now(), 'EUR', 0.5, 9.0, 'spent'), "
            "('t-1', 'tokyo', 'sume', NULL, '2026-04-01', now(), 'USD', 0.4, 0.4, "
            "'reserved'), "
            "('t-0', 'tokyo', 'sume', NULL, '2026-03-31', now(), 'USD', 0.4, 0.4, 'spent'), "
            "('n-1', 'plain', 'sume', NULL, '2026-03-31', now(), NULL, NULL, NULL, "
            "'reserved')")
        await conn.execute("UPDATE video_intents SET held_reason = held_reason || %s "
                           "WHERE idempotency_key = %s", (HTML, claim.held[0].key))
        await conn.execute(
            "INSERT INTO video_jobs (job_id, account, cost, provider_cost, provider_cost_unit, "
            "tags) VALUES ('vid_cost', 'paris', 0.75, 75.000, 'credit', "
            "'{\"team\": \"<ads>\"}')")
    return [h.key for h in claim.held]


async def days_of(tab: Page, account: str) -> dict[str, list[str]]:
    """Each day bar of an account's chart: its [spent, reserved] data attributes."""
    return await tab.eval_on_selector_all(
        f'section[data-account="{account}"] svg g.day',
        "gs => Object.fromEntries(gs.map(g => [g.dataset.day, "
        "[g.dataset.spent, g.dataset.reserved]]))")


async def test_spend_per_day_held_intents_and_a_jobs_cost(page, spend_site, store, db_url):
    held = await seed(store, db_url)
    await page.goto(spend_site + "/")
    async with page.expect_navigation():
        await page.click("nav >> text=Spend")
    paris = await days_of(page, "paris")
    # Paris's March (its 31 March is today), not February's row
    assert len(paris) == 31 and min(paris) == "2026-03-01" and "2026-02-28" not in paris
    assert paris["2026-03-03"] == ["1.50", "0.00"]
    assert paris["2026-03-10"] == ["2.00", "0.00"]
    assert paris["2026-03-31"] == ["0.00", "2.00"]  # the four creates let through
    bars = page.locator('section[data-account="paris"] svg rect')
    assert await bars.count() == 3
    assert await page.locator('section[data-account="paris"] svg rect.reserved').count() == 1
    cap = page.locator('section[data-account="paris"] svg line.cap')
    assert await cap.get_attribute("data-cap") == "2.00"
    section = page.locator('section[data-account="paris"]')
    assert await section.locator('[data-testid="month-used"]').inner_text() == "5.50 EUR"
    assert await section.locator('[data-testid="month-cap"]').inner_text() == "20.00 EUR"
    assert "28%" in await section.inner_text()
    assert await page.inner_text('[data-held="paris"]') == "2"
    assert await page.inner_text("#held-total strong") == "2"
    # Tokyo is in April already: its 31 March is last month
    tokyo = await days_of(page, "tokyo")
    assert len(tokyo) == 30 and tokyo["2026-04-01"] == ["0.00", "0.40"]
    assert "0.40 USD" in await page.inner_text('section[data-account="tokyo"]')
    plain = page.locator('section[data-account="plain"]')
    assert await plain.locator("svg").count() == 0
    assert "No prices set" in await plain.inner_text()
    assert "1 this month" in await plain.inner_text()
    test_dashboard.ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(test_dashboard.ARTIFACTS / "dashboard-spend.png"),
                          full_page=True)
    await page.set_viewport_size({"width": 375, "height": 812})
    wide = await page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 376, f"the page is {wide}px wide on a 375px screen"
    await page.screenshot(path=str(test_dashboard.ARTIFACTS / "dashboard-spend-phone.png"),
                          full_page=True)
    await page.set_viewport_size({"width": 1280, "height": 900})

    async with page.expect_navigation():
        await page.click("#held-total a")
    keys = page.locator("#intents tbody tr td:first-child")
    assert sorted([await keys.nth(i).inner_text() for i in range(await keys.count())]) == sorted(
        held)
    reasons = page.locator("#intents td.held-reason")
    texts = [await reasons.nth(i).inner_text() for i in range(2)]
    assert all("cap_per_day 2.00 EUR reached" in t for t in texts)
    assert any(t.endswith(HTML) for t in texts)  # shown as text, not markup
    assert await page.locator("#intents td.held-reason b, #intents td.held-reason img"
                              ).count() == 0
    assert "held: 2" in await page.inner_text("#intent-counts")

    # a job's cost, in its account's currency, beside the provider's own figure, and its tags
    await page.goto(spend_site + "/jobs/view?id=vid_cost")
    assert (await page.inner_text("#job-cost")
            == "0.75 EUR (the provider's figure: 75 credit)")
    assert await page.inner_text("#job-tags") == "team=<ads>"
