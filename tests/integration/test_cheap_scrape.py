"""/metrics and the dashboard's overview never scan video_jobs: pending rows, rows due and the
oldest's lateness are counted exactly through the partial index, the finished states are
PostgreSQL's estimates once the table is big (and say so), and a small table is counted
exactly. Checked with PostgreSQL's own counters of sequential scans, and with EXPLAIN."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from vidpoll.sql import QUERIES
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server
from vidpoll.web.figures import EXACT_ROWS

BIG_ROWS = 150_000
"""Past EXACT_ROWS, and big enough that the planner would never pick an index to count all."""


async def fill(db_url: str, rows: int, pending: int, due: int) -> None:
    """`pending` rows (the first `due` of them due, the oldest 60 s late), the rest finished:
    one in ten failed, the others completed."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO video_jobs (job_id, state, next_poll_at, finished_at) "
            "SELECT 'vid_' || g, CASE WHEN g <= %(p)s THEN 'pending' "
            "WHEN g %% 10 = 0 THEN 'failed' ELSE 'completed' END, "
            "CASE WHEN g <= %(d)s THEN now() - make_interval(secs => 60.0 * g / %(d)s) "
            "ELSE now() + interval '1 hour' END, "
            "CASE WHEN g > %(p)s THEN now() END FROM generate_series(1, %(n)s) g",
            {"p": pending, "d": due, "n": rows})


async def scrape(db_url: str) -> tuple[dict[str, Any], str]:
    """One /metrics scrape and one overview, from a `vidpoll serve` app of their own."""
    store = await PgStore.open(db_url, max_size=2)
    runner, base = await start_server(make_app(store, None), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
            async with http.get(base + "/") as resp:
                assert resp.status == 200
                html = await resp.text()
    finally:
        await runner.cleanup()
        await store.close()
    return {f.name: f for f in text_string_to_metric_families(text)}, html


def by_state(families: dict[str, Any], name: str) -> dict[str, float]:
    return {s.labels["state"]: s.value for s in families[name].samples}


async def scans_of_video_jobs(db_url: str) -> tuple[int, int]:
    """(sequential scans, index scans) of video_jobs so far, once every other session of the
    database has ended: a backend writes its counters out as it exits."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        async def others() -> int:
            cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                     "current_database() AND pid <> pg_backend_pid()")
            return int((await cur.fetchone() or (0,))[0])

        async with asyncio.timeout(20):
            while await others():  # noqa: ASYNC110 (bounded; sessions ending: no event)
                await asyncio.sleep(0.02)
        row = await (await conn.execute(
            "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables "
            "WHERE relname = 'video_jobs'")).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_a_small_table_is_counted_exactly_everywhere(db_url):
    await fill(db_url, 40, pending=10, due=4)
    families, html = await scrape(db_url)
    assert by_state(families, "vidpoll_jobs") == {"pending": 10, "completed": 27, "failed": 3}
    assert set(by_state(families, "vidpoll_jobs_estimated").values()) == {0}
    assert families["vidpoll_due_rows"].samples[0].value == 4
    assert 59 < families["vidpoll_oldest_due_seconds"].samples[0].value < 120
    assert 'data-estimated' not in html and 'data-testid="estimates"' not in html
    assert '<span data-state="all">40</span>' in html


async def test_a_big_table_is_scraped_through_indexes_and_estimates(db_url):
    await fill(db_url, BIG_ROWS, pending=1500, due=300)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE video_jobs")
    seq_before, idx_before = await scans_of_video_jobs(db_url)
    families, html = await scrape(db_url)
    seq_after, idx_after = await scans_of_video_jobs(db_url)
    assert seq_after == seq_before, "a scrape or the overview scanned video_jobs"
    assert idx_after > idx_before  # the counters were written out: the check above counts

    jobs = by_state(families, "vidpoll_jobs")
    estimated = by_state(families, "vidpoll_jobs_estimated")
    assert jobs["pending"] == 1500 and estimated["pending"] == 0  # exact, from the index
    assert families["vidpoll_due_rows"].samples[0].value == 300
    assert 59 < families["vidpoll_oldest_due_seconds"].samples[0].value < 120
    truth = {"completed": (BIG_ROWS - 1500) * 9 / 10, "failed": (BIG_ROWS - 1500) / 10}
    for state, n in truth.items():
        assert estimated[state] == 1
        assert abs(jobs[state] - n) / n < 0.1, (state, jobs[state], n)
    assert 0 <= families["vidpoll_jobs_statistics_age_seconds"].samples[0].value < 3600
    assert "ESTIMATES" in families["vidpoll_jobs"].documentation
    # the overview marks the same figures as estimates, and says where they come from
    assert f'<span data-state="completed" data-estimated="true">{int(jobs["completed"]):,}<' in html
    assert '<span data-state="pending">1,500</span>' in html
    assert 'data-testid="estimates"' in html and "ANALYZE" in html
    assert '<strong data-testid="due">300</strong>' in html


async def test_the_scrape_queries_never_plan_a_sequential_scan_of_a_big_table(db_url):
    await fill(db_url, BIG_ROWS, pending=1500, due=300)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE video_jobs")
        for name in ("scrape_table_estimate", "scrape_pending", "count_overdue"):
            cur = await conn.execute("EXPLAIN (FORMAT JSON) " + QUERIES[name],
                                     {"upto": 1_000_000, "now": None})
            plan = json.dumps((await cur.fetchone())[0])  # type: ignore[index]
            assert '"Seq Scan"' not in plan or '"Relation Name": "video_jobs"' not in plan, (
                name, plan)
            if name == "scrape_pending":
                assert "video_jobs_next_poll_at_idx" in plan, plan
        # the exact count runs only on a small table, and reads at most EXACT_ROWS + 1 rows
        cur = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) "
                                 + QUERIES["scrape_count_states_upto"], {"upto": EXACT_ROWS})
        plan = (await cur.fetchone())[0]  # type: ignore[index]
        limit = plan[0]["Plan"]["Plans"][0]
        assert limit["Node Type"] == "Limit" and limit["Actual Rows"] == EXACT_ROWS + 1, plan


async def test_the_overview_names_a_stuck_claim_among_the_most_overdue_rows(db_url):
    await fill(db_url, 40, pending=10, due=4)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(  # a lease that ended 5 minutes ago, never recorded
            "UPDATE video_jobs SET claim_token = gen_random_uuid(), claimed_by = 'host:7:dead', "
            "claimed_at = now() - interval '6 minutes', "
            "next_poll_at = now() - interval '5 minutes' WHERE job_id = 'vid_3'")
    _, html = await scrape(db_url)
    assert "Stuck claims" in html and "host:7:dead" in html

