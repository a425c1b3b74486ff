"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): what a person sees
matches the database, the filter and paging work, the actions change rows, the token wall holds.
A screenshot of the overview (desktop and phone) is saved under test-artifacts/."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import Browser, Page, async_playwright

from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server

CHROMIUM = os.environ.get("VIDPOLL_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TOKEN = "dash-token-5f1c9e"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM}: `make test` installs "
                    "Debian's package (apt-get install chromium), or set VIDPOLL_CHROMIUM")
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM,
                                            args=["--no-sandbox", "--disable-gpu"])
        yield launched
        await launched.close()


async def serve(store: PgStore, **options: Any) -> tuple[Any, str]:
    return await start_server(make_app(store, None, **options), "127.0.0.1", 0)


@pytest.fixture
async def site(store: PgStore) -> AsyncIterator[str]:
    runner, url = await serve(store, loopback_only=True)
    yield url
    await runner.cleanup()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    yield await context.new_page()
    await context.close()


async def seed(db_url: str) -> None:
    """A table an operator might find: pending, finished and failed rows, an hour of
    counters, errors in the history."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO video_jobs (job_id, state, next_poll_at, account, polls) "
            "SELECT 'vid_p' || g, 'pending', now() - make_interval(secs => g * 7), "
            "CASE WHEN g % 2 = 0 THEN 'acme' ELSE 'default' END, g "
            "FROM generate_series(1, 7) g")
        await conn.execute(
            "INSERT INTO video_jobs (job_id, state, finished_at, polls, provider_status) "
            "SELECT 'vid_c' || g, 'completed', now() - make_interval(mins => g), 3, "
            "'completed' FROM generate_series(1, 5) g")
        await conn.execute(
            "INSERT INTO video_jobs (job_id, state, next_poll_at) "
            "SELECT 'vid_f' || g, 'pending', now() FROM generate_series(1, 3) g")
        await conn.execute(  # errors, then the end: history records both
            "UPDATE video_jobs SET last_error_class = 'server_error', last_http_status = 502, "
            "last_error = 'HTTP 502 from Sume', consecutive_errors = 1 "
            "WHERE job_id LIKE 'vid_f%'")
        await conn.execute("UPDATE video_jobs SET state = 'failed', finished_at = now(), "
                           "provider_status = 'failed' WHERE job_id LIKE 'vid_f%'")
        await conn.execute(
            "INSERT INTO vidpoll_minutes (minute, kind, account, outcome, n, late_sum_s, "
            "late_max_s) "
            "SELECT date_trunc('minute', now()) - make_interval(mins => m), 'poll', 'default', "
            "o, CASE o WHEN 'not_ready' THEN 200 + 60 * sin(m / 6.0) WHEN 'final' THEN 12 "
            "ELSE (m % 9) END, 20 + m, 0.05 + (m % 7) / 10.0 "
            "FROM generate_series(0, 59) m, unnest(ARRAY['not_ready', 'final', "
            "'server_error']) o")
        await conn.execute(
            "INSERT INTO vidpoll_minutes (minute, kind, account, outcome, n) "
            "SELECT date_trunc('minute', now()) - make_interval(mins => m), 'backlog', '*', "
            "'due', 40 + (m * 7) % 30 FROM generate_series(0, 59) m")


async def count_of(page: Page, state: str) -> int:
    return int(await page.inner_text(f'[data-state="{state}"]'))


async def test_the_overview_shows_what_the_database_holds(page, site, store, db_url):
    await seed(db_url)
    await page.goto(site + "/")
    counts = await store.counts()
    assert counts == {"pending": 7, "completed": 5, "failed": 3}
    for state, n in counts.items():
        assert await count_of(page, state) == n
    assert await count_of(page, "all") == 15
    due, _ = await store.backlog()
    assert int(await page.inner_text('[data-testid="due"]')) == due == 7
    charts = page.locator("figure.chart svg[role=img]")
    assert await charts.count() == 4
    label = await charts.first.get_attribute("aria-label")
    assert label is not None and "Status reads per minute" in label and "peak" in label
    errors = page.locator("#errors-h + div table tbody tr")
    assert await errors.count() == 3
    assert "server_error" in await errors.first.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)
    # readable on a phone: nothing wider than the screen
    await page.set_viewport_size({"width": 375, "height": 812})
    await page.goto(site + "/")
    wide = await page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 376, f"the page is {wide}px wide on a 375px screen"
    await page.screenshot(path=str(ARTIFACTS / "dashboard-overview-phone.png"), full_page=True)


async def test_the_state_filter_and_paging_work(page, site, store, db_url):
    await seed(db_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("INSERT INTO video_jobs (job_id, next_poll_at) SELECT 'vid_q' || "
                           "lpad(g::text, 3, '0'), now() + make_interval(secs => g) "
                           "FROM generate_series(1, 60) g")
    await page.goto(site + "/jobs")
    await page.select_option("#state", "failed")
    await page.click("form.filters button")
    await page.wait_for_url("**/jobs?state=failed*")
    rows = page.locator("#jobs tbody tr")
    assert await rows.count() == 3
    assert {(await rows.nth(i).locator("td").nth(1).inner_text()) for i in range(3)} == {
        "failed"}
    await page.select_option("#state", "pending")
    await page.select_option("select[name=limit]", "25")
    async with page.expect_navigation():
        await page.click("form.filters button")
    seen: list[str] = []
    while True:
        links = page.locator("#jobs tbody tr td:first-child a")
        seen += [await links.nth(i).inner_text() for i in range(await links.count())]
        nxt = page.locator("a.next")
        if await nxt.count() == 0:
            break
        async with page.expect_navigation():
            await nxt.click()
    pending = {r["job_id"] for r in (await store.list_jobs("pending", limit=1000))[0]}
    assert len(seen) == len(set(seen)) == len(pending) == 67 and set(seen) == pending


async def test_poll_now_and_resume_change_the_row(page, site, store, db_url):
    await store.add_job("vid_later", delay_s=3600)
    await store.add_job("vid_gone", delay_s=0)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_jobs SET state = 'gave_up', finished_at = now() "
                           "WHERE job_id = 'vid_gone'")
    await page.goto(site + "/jobs?state=pending")
    async with page.expect_navigation():
        await page.click("text=vid_later")
    assert "from now" in await page.inner_text("#next-read")
    async with page.expect_navigation():
        await page.click("button[value=poll_now]")
    assert "Done: poll now." in await page.inner_text("p.flash")
    row = await store.get_job("vid_later")
    assert row is not None
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        now = (await (await conn.execute("SELECT now()")).fetchone())[0]
    assert row["next_poll_at"] <= now
    await page.goto(site + "/jobs/view?id=vid_gone")
    assert await page.inner_text("#job-state") == "gave_up"
    async with page.expect_navigation():
        await page.click("button[value=resume]")
    assert await page.inner_text("#job-state") == "pending"
    row = await store.get_job("vid_gone")
    assert row is not None and row["state"] == "pending"


async def test_the_token_wall(browser, store):
    runner, url = await serve(store, dashboard_token=TOKEN, loopback_only=False)
    context = await browser.new_context()
    page = await context.new_page()
    try:
        await page.goto(url + "/jobs?state=failed")
        assert "/login" in page.url and await page.inner_text("h1") == "Sign in"
        await page.fill("#token", "wrong")
        await page.click("form.login button")
        assert "not the one" in await page.inner_text("[role=alert]")
        await page.fill("#token", TOKEN)
        await page.click("form.login button")
        await page.wait_for_url("**/jobs?state=failed", timeout=10_000)  # where it was going
        assert (await page.inner_text("h1")).startswith("Jobs")
        cookies = await context.cookies()
        [session] = [c for c in cookies if c["name"] == "vidpoll_session"]
        assert TOKEN not in session["value"] and session["httpOnly"]
        assert session["sameSite"] == "Strict"
        # signing out ends the session: the same cookie, put back, opens nothing
        async with page.expect_navigation():
            await page.click("form.signout button")
        assert "/login" in page.url
        await context.add_cookies([session])
        await page.goto(url + "/jobs")
        assert "/login" in page.url and await page.inner_text("h1") == "Sign in"
    finally:
        await context.close()
        await runner.cleanup()
