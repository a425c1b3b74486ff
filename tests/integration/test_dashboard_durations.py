"""Render times on `serve` (issue 31) in a real headless Chromium (test_dashboard's fixtures)
and over real HTTP: render times made by ending real jobs (the trigger of 0018 records each),
an overdue job recorded as a worker records it; the page's figures and plot match them, a
hostile model name is shown as text, and /metrics exports the three render-time metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from playwright.async_api import Page
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e import test_dashboard
from tests.integration.test_render_times import _end_jobs, _sql
from vidpoll.models import Outcome
from vidpoll.schedule import Durations, durations_from_samples
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server

HOSTILE = "<script>alert(1)</script>"
FAST = [20.0 + i * 0.1 for i in range(120)]  # m1, key 5s: learned (120 jobs)
SLOW = [200.0 + i for i in range(30)]  # m1, key 10s: too few of its own, its model's is used
ODD = [60.0 + i for i in range(40)]  # the hostile model of acme: not learned yet
REASON = "learned: read 3 of 9 at age 40s (sparse); <b>m1</b>"

browser, page = test_dashboard.browser, test_dashboard.page  # its fixtures: Chromium, a tab


@pytest.fixture
async def site(store: PgStore) -> AsyncIterator[str]:
    runner, url = await start_server(make_app(store, None, loopback_only=True),
                                     "127.0.0.1", 0)
    yield url
    await runner.cleanup()


def observed(seconds: list[float], **where: str) -> Durations:
    """The summary of jobs ended by `_end_jobs` (each recorded as seconds - 0.5)."""
    return durations_from_samples([s - 0.5 for s in seconds], **where)


async def seed(store: PgStore, db_url: str) -> None:
    """Three models' render times, a job with the provider's own render time, one overdue
    pending job (and one that is not yet)."""
    _end_jobs(db_url, "f", FAST, key="5s")
    _end_jobs(db_url, "s", SLOW, key="10s")
    _end_jobs(db_url, "h", ODD, model=HOSTILE, account="acme", provider="fal")
    _sql(db_url, "INSERT INTO video_jobs (job_id, provider, model, created_at) "
                 "VALUES ('vid_own', 'replicate', 'm2', now() - interval '100 seconds')")
    _sql(db_url, "UPDATE video_jobs SET state = 'succeeded', outcome = 'succeeded', "
                 "finished_at = now(), render_s = 61.5 WHERE job_id = 'vid_own'")
    await store.add_job("vid_late", delay_s=0.0)
    await store.add_job("vid_fine", delay_s=0.0)
    _sql(db_url, "UPDATE video_jobs SET model = %(m)s, duration_key = '5s' "
                 "WHERE job_id IN ('vid_late', 'vid_fine')", {"m": HOSTILE})
    claimed = {j.job_id: j for j in await store.claim(10, 30.0, "w1")}
    assert set(claimed) == {"vid_late", "vid_fine"}
    assert await store.record([
        Outcome(j.job_id, j.claim_token, "pending", 60.0, read_ok=True, poll_reason=REASON,
                overdue_after_s=0.0 if j.job_id == "vid_late" else 3600.0)
        for j in claimed.values()]) == {"vid_late", "vid_fine"}


async def rows_of(tab: Page, account: str) -> dict[tuple[str, str], dict[str, str]]:
    """Each row of an account's plot: its data attributes, by (model, key)."""
    rows = await tab.eval_on_selector_all(
        f'section[data-account="{account}"] svg g.group', "gs => gs.map(g => ({...g.dataset}))")
    return {(r["model"], r["key"]): r for r in rows}


def figures_of(row: dict[str, str]) -> list[float]:
    return [float(row[k]) for k in ("p10", "p50", "p90", "p99", "longest")]


def want(d: Durations, abs: float = 0.006) -> list[float]:
    """The figures of `d`: as the database summarised them (shown to 2 decimals), or, with a
    wider `abs`, as the samples say (each observed end is late by the statements' time)."""
    return pytest.approx([d.p10, d.p50, d.p90, d.p99, d.longest], abs=abs)


async def summary(store: PgStore) -> dict[tuple[str, str, str, str], Durations]:
    """The database's summary (as the page and the scrape read it)."""
    return {(d.account, d.provider, d.model, d.duration_key): d
            for d in await store.render_stats()}


async def test_render_times_and_overdue_jobs_on_the_dashboard(page, site, store, db_url):
    await seed(store, db_url)
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    await page.goto(site + "/")
    assert await page.inner_text('[data-testid="overdue"]') == "1"
    async with page.expect_navigation():
        await page.click("nav >> text=Render times")
    assert await page.inner_text('[data-testid="overdue"]') == "1"

    default = await rows_of(page, "default")
    assert set(default) == {("m1", "*"), ("m1", "10s"), ("m1", "5s"), ("m2", "*")}
    groups = await summary(store)
    for (model, key), samples in {("m1", "5s"): observed(FAST), ("m1", "10s"): observed(SLOW),
                                  ("m1", "*"): observed(FAST + SLOW),
                                  ("m2", "*"): durations_from_samples([61.5])}.items():
        shown = figures_of(default[(model, key)])
        assert shown == want(groups[("default", "replicate", model, key)])
        assert shown == want(samples, abs=0.5)
    assert {k: r["jobs"] for k, r in default.items()} == {
        ("m1", "*"): "150", ("m1", "5s"): "120", ("m1", "10s"): "30", ("m2", "*"): "1"}
    assert {k: r["learned"] for k, r in default.items()} == {
        ("m1", "*"): "learned", ("m1", "5s"): "learned", ("m1", "10s"): "model-wide",
        ("m2", "*"): "not yet"}
    # one seconds axis: the slow key's box lies to the right of the fast one's
    boxes = page.locator('section[data-account="default"] svg g.group rect.box')
    xs = [float(await boxes.nth(i).get_attribute("x") or "nan") for i in range(4)]
    assert xs[1] > xs[2]  # rows in order: m1 (all), 10s, 5s, m2
    label = await page.locator('section[data-account="default"] svg').get_attribute(
        "aria-label")
    assert label is not None and "default / replicate" in label

    # the table beside the plot
    m1 = page.locator('section[data-account="default"] table tr.by-model[data-model="m1"]')
    cells = [await m1.locator("td").nth(i).inner_text() for i in range(9)]
    d = groups[("default", "replicate", "m1", "*")]
    assert cells[:3] == ["m1", "all", "150"]
    assert cells[4] == f"{d.p50:.0f} s" and cells[8] == "learned"
    slow = page.locator('section[data-account="default"] table tr.by-key[data-key="10s"]')
    assert (await slow.inner_text()).split("\t")[1:3] == ["10s", "30"]
    assert "model-wide" in await slow.inner_text()

    # a hostile model name is text, never markup
    acme = await rows_of(page, "acme")
    assert list(acme) == [(HOSTILE, "*")]  # one unnamed key: no row of its own
    assert figures_of(acme[(HOSTILE, "*")]) == want(groups[("acme", "fal", HOSTILE, "*")])
    assert figures_of(acme[(HOSTILE, "*")]) == want(observed(ODD), abs=0.5)
    assert acme[(HOSTILE, "*")]["provider"] == "fal"
    section = page.locator('section[data-account="acme"]')
    assert await section.locator("svg text.label").text_content() == HOSTILE
    assert await section.locator("table tbody td").first.inner_text() == HOSTILE
    assert "not yet (60 more)" in await section.locator("table").inner_text()
    assert await page.locator("main script, main b").count() == 0
    assert dialogs == []

    test_dashboard.ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(test_dashboard.ARTIFACTS / "dashboard-durations.png"),
                          full_page=True)
    await page.set_viewport_size({"width": 375, "height": 812})
    wide = await page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 376, f"the page is {wide}px wide on a 375px screen"
    await page.set_viewport_size({"width": 1280, "height": 900})

    # the overdue list: the one job past its time, linked to its page
    overdue = page.locator("#overdue tbody tr")
    assert await overdue.count() == 1
    row = await overdue.first.inner_text()
    assert "vid_late" in row and HOSTILE in row and REASON in row
    async with page.expect_navigation():
        await overdue.first.locator("a").click()
    assert await page.inner_text("h1") == "Job vid_late"
    assert await page.inner_text("#job-model") == f"{HOSTILE} (key 5s)"
    assert await page.inner_text("#poll-reason") == f"next read: {REASON}"
    assert (await page.inner_text("#job-overdue")).startswith("since ")
    await page.goto(site + "/jobs/view?id=vid_fine")
    assert (await page.inner_text("#job-overdue")).startswith("from ")
    await page.goto(site + "/jobs/view?id=vid_own")
    assert await page.inner_text("#job-render") == "62 s (the provider's own figure)"
    assert await page.locator("main script, main b").count() == 0
    assert dialogs == []


async def test_metrics_export_render_times_and_overdue_jobs(site, store, db_url):
    await seed(store, db_url)
    async with aiohttp.ClientSession() as http, http.get(site + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    seconds = {(s.labels["account"], s.labels["provider"], s.labels["model"],
                s.labels["quantile"]): s.value
               for s in families["vidpoll_render_seconds"].samples}
    # the models over every key only: no series per duration key
    assert {k[:3] for k in seconds} == {("default", "replicate", "m1"),
                                        ("default", "replicate", "m2"),
                                        ("acme", "fal", HOSTILE)}
    groups = await summary(store)
    for (account, provider, model), samples in {
            ("default", "replicate", "m1"): observed(FAST + SLOW),
            ("default", "replicate", "m2"): durations_from_samples([61.5]),
            ("acme", "fal", HOSTILE): observed(ODD)}.items():
        got = [seconds[(account, provider, model, q)] for q in ("0.1", "0.5", "0.9", "0.99")]
        d = groups[(account, provider, model, "*")]
        assert got == pytest.approx([d.p10, d.p50, d.p90, d.p99], abs=1e-6)
        assert got == pytest.approx([samples.quantile(p) for p in (0.1, 0.5, 0.9, 0.99)],
                                    abs=0.5)
    jobs = {(s.labels["account"], s.labels["provider"], s.labels["model"]): s.value
            for s in families["vidpoll_render_jobs"].samples}
    assert jobs == {("default", "replicate", "m1"): 150, ("default", "replicate", "m2"): 1,
                    ("acme", "fal", HOSTILE): 40}
    overdue = {s.labels["account"]: s.value for s in families["vidpoll_jobs_overdue"].samples}
    assert overdue == {"default": 1, "acme": 0}
