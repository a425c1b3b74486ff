"""Does the dashboard stay fast with a million rows? Times its pages over real HTTP, and what
a /metrics scrape and the overview cost the database.

A scratch database gets `--rows` jobs (1 % pending, the rest finished over 30 days, one in
twenty failed), a history with an error event per failed job, and VACUUM ANALYZE. Then every
page is fetched `--repeat` times from `vidpoll serve`'s application on loopback: the overview,
the first and a deep page (cursor half-way) of each listing, a job's detail.

Scrape cost ("scrape"): the database time of one /metrics refresh and of one overview, the
queries before the cheap scrapes (an exact count per state, the due backlog) and after
(vidpoll.web.figures) side by side on the same data, each `--scrape-repeat` times; and the
served app itself over HTTP (/metrics with its 5 s cache off, and /). Database time is
PostgreSQL's own: pg_stat_database.active_time of the scratch database (every statement's
time, written out when a session ends), measured around a store of one connection opened for
the batch, less a store that only opens and closes; beside it the CPU time of that backend
(from /proc, when PostgreSQL runs on this machine: what the scrape cost the server's CPUs,
without the time a busy machine kept it waiting) and the wall time of each call. Measured
twice: right after VACUUM ("vacuumed": the pending rows' pages all-visible, so counting them
reads the index only) and after every pending row was updated once ("polled": as between two
vacuums of a busy queue, every pending row is a heap visit). Each query's own execution
time beside it (EXPLAIN ANALYZE, timing off: "query_ms"). Prints one JSON object.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/dashboard_scale.py --rows 1000000
    ... --rows 10000000 --only-scrape --scrape-repeat 20   # BENCHMARKS.md, Cheap scrapes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import psycopg
from scratch_db import scratch_database

import vidpoll.web
from vidpoll.sql import QUERIES
from vidpoll.store import PgStore, migrate
from vidpoll.web import make_app, start_server
from vidpoll.web.figures import COUNT_CAP_ROWS, STUCK_WALK_ROWS, read_figures


def fill(url: str, rows: int) -> None:
    pending = max(1, rows // 100)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE video_jobs DISABLE TRIGGER USER")  # bulk load: no events
        conn.execute(
            "INSERT INTO video_jobs (job_id, state, next_poll_at, finished_at, account, polls) "
            "SELECT 'vid_' || lpad(g::text, 8, '0'), "
            "CASE WHEN g <= %(p)s THEN 'pending' WHEN g %% 20 = 0 THEN 'failed' "
            "ELSE 'completed' END, now() + make_interval(secs => g %% 600), "
            "CASE WHEN g <= %(p)s THEN NULL "
            "ELSE now() - make_interval(secs => (g * 2.6)::int) END, "
            "CASE WHEN g %% 3 = 0 THEN 'acme' ELSE 'default' END, g %% 40 "
            "FROM generate_series(1, %(n)s) g", {"p": pending, "n": rows})
        conn.execute("ALTER TABLE video_jobs ENABLE TRIGGER USER")
        conn.execute(
            "INSERT INTO video_job_events (job_id, kind, to_state, error_class, http_status) "
            "SELECT job_id, 'error', 'pending', 'server_error', 502 FROM video_jobs "
            "WHERE state = 'failed'")
        conn.execute(
            "INSERT INTO video_job_events (job_id, kind, to_state) "
            "SELECT job_id, 'tracked', 'pending' FROM video_jobs")
        conn.execute("VACUUM ANALYZE video_jobs")
        conn.execute("VACUUM ANALYZE video_job_events")


async def measure(url: str, repeat: int, rows: int) -> dict[str, object]:
    store = await PgStore.open(url, max_size=4)
    runner, base = await start_server(make_app(store, None), "127.0.0.1", 0)
    timings: dict[str, list[float]] = {}
    try:
        async with aiohttp.ClientSession() as http:
            async def fetch(name: str, path: str) -> str:
                started = time.perf_counter()
                async with http.get(base + path) as resp:
                    text = await resp.text()
                    assert resp.status == 200, (path, resp.status, text[:200])
                timings.setdefault(name, []).append((time.perf_counter() - started) * 1000)
                return text

            deep = {}
            for state in ("", "pending", "failed", "finished"):
                _, cursor = await store.list_jobs(state or None, limit=rows // 2 if not state
                                                  else max(1, rows // 200))
                deep[state] = cursor
            for _ in range(repeat):
                await fetch("overview", "/")
                for state in ("", "pending", "failed", "finished"):
                    label = state or "all"
                    await fetch(f"jobs {label}, page 1", f"/jobs?state={state}")
                    cursor = deep[state]
                    if cursor:
                        await fetch(f"jobs {label}, deep page",
                                    f"/jobs?state={state}&after={quote(cursor)}")
                await fetch("job detail", f"/jobs/view?id=vid_{rows // 2:08d}")
    finally:
        await runner.cleanup()
        await store.close()
    return {"rows": rows, "repeat": repeat,
            "ms": {k: {"median": round(statistics.median(v), 1), "max": round(max(v), 1)}
                   for k, v in timings.items()}}


Call = Callable[[PgStore], Awaitable[object]]


async def metrics_before(store: PgStore) -> None:
    """What a /metrics refresh read before the cheap scrapes."""
    await store.counts()
    await store.due_backlog_sample()


async def metrics_after(store: PgStore) -> None:
    """What a /metrics refresh reads now (vidpoll.web.add_health_and_metrics)."""
    await read_figures(store)


async def overview_rest(store: PgStore) -> None:
    """The overview's reads that the cheap scrapes left as they were."""
    await store.minutes_since(60)
    await store.recent_errors(15)
    await store.stuck_claims()
    await store.delivery_backlog()


async def overview_before(store: PgStore) -> None:
    """What the overview read before: exact counts and the whole due backlog."""
    await store.counts()
    await store.backlog()
    await overview_rest(store)


async def overview_after(store: PgStore) -> None:
    """What the overview reads now (vidpoll.web.dashboard)."""
    await read_figures(store)
    await store.minutes_since(60)
    await store.recent_errors(15)
    await store.stuck_claims_upto(STUCK_WALK_ROWS)
    await store.delivery_backlog()


QUERIES_TIMED: tuple[tuple[str, dict[str, Any]], ...] = (
    ("count_by_state", {}), ("due_backlog_sample", {}), ("due_backlog", {"now": None}),
    ("stuck_claims", {}), ("scrape_table_estimate", {}),
    ("scrape_pending", {"upto": COUNT_CAP_ROWS}),
    ("scrape_stuck_claims", {"upto": STUCK_WALK_ROWS}),
    ("minutes_since", {"minutes": 60}), ("recent_errors", {"limit": 15}),
    ("delivery_backlog", {}))
"""The old and the new scrape's queries, with their parameters."""


def query_ms(url: str) -> dict[str, float]:
    """Each query's execution time by EXPLAIN (ANALYZE, TIMING OFF), the median of three."""
    out = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, params in QUERIES_TIMED:
            runs = []
            for _ in range(3):
                cur = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) "
                                   + QUERIES[name], params)
                row = cur.fetchone()
                assert row is not None
                runs.append(float(row[0][0]["Execution Time"]))
            out[name] = round(statistics.median(runs), 2)
    return out


async def active_ms(admin: str, database: str) -> float:
    """pg_stat_database.active_time of `database` once no session of it is left (a session
    writes its statistics out as it ends), read from another database."""
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        async def sessions() -> int:
            cur = await conn.execute("SELECT count(*) FROM pg_stat_activity "
                                     "WHERE datname = %s", (database,))
            return int((await cur.fetchone() or (0,))[0])

        async with asyncio.timeout(60):
            while await sessions():  # noqa: ASYNC110 (bounded; sessions ending: no event)
                await asyncio.sleep(0.02)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await (await conn.execute(
            "SELECT active_time FROM pg_stat_database WHERE datname = %s",
            (database,))).fetchone()
    assert row is not None
    return float(row[0])


async def backend_pid(admin: str, database: str) -> int:
    """The one session of `database` (the pool of one connection a batch opens)."""
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        rows = await (await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s "
            "AND backend_type = 'client backend'", (database,))).fetchall()
    assert len(rows) == 1, rows
    return int(rows[0][0])


def backend_cpu_ms(pid: int) -> float | None:
    """CPU time (user + system) of a local server process so far, from /proc; None if the
    server is not on this machine. Unlike active_time, a backend waiting for a CPU the other
    processes hold adds nothing to it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def db_ms(url: str, admin: str, database: str, call: Call | None, n: int,
                path: str | None = None) -> tuple[float, float | None, list[float]]:
    """(database ms of `n` calls, or of `n` GETs of `path` from the served app; the backend's
    CPU ms; wall ms of each) in one store session of one connection."""
    before = await active_ms(admin, database)
    store = await PgStore.open(url, max_size=1)
    runner = None
    walls = []
    try:
        pid = await backend_pid(admin, database)
        cpu_before = backend_cpu_ms(pid)
        if path is not None:
            runner, base = await start_server(make_app(store, None), "127.0.0.1", 0)
            http = aiohttp.ClientSession()

            async def get(_: PgStore) -> None:
                async with http.get(base + path) as resp:
                    await resp.read()
                    assert resp.status == 200, (path, resp.status)

            call = get
        for _ in range(n if call else 0):
            started = time.perf_counter()
            await call(store)  # type: ignore[misc]
            walls.append((time.perf_counter() - started) * 1000)
        cpu_after = backend_cpu_ms(pid)
        if path is not None:
            await http.close()
    finally:
        if runner is not None:
            await runner.cleanup()
        await store.close()
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return await active_ms(admin, database) - before, cpu, walls


async def scrape_costs(url: str, n: int) -> dict[str, Any]:
    """Database and wall ms per scrape, before and after, and of the served app."""
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    assert isinstance(database, str)
    vidpoll.web.GAUGES_MAX_AGE_S = 0.0  # every /metrics request reads the table
    overhead, _, _ = await db_ms(url, admin, database, None, 0)  # open and close only
    out: dict[str, Any] = {}

    def row(total_ms: float, cpu_ms: float | None, walls: list[float]) -> dict[str, Any]:
        return {"db_ms_per_scrape": round(max(0.0, total_ms - overhead) / len(walls), 2),
                "backend_cpu_ms_per_scrape": None if cpu_ms is None
                else round(cpu_ms / len(walls), 2),
                "wall_ms_median": round(statistics.median(walls), 2),
                "wall_ms_max": round(max(walls), 2)}

    calls: dict[str, Call] = {"metrics before": metrics_before, "metrics after": metrics_after,
                              "overview before": overview_before,
                              "overview after": overview_after}
    for name, call in calls.items():
        out[name] = row(*await db_ms(url, admin, database, call, n))
    for name, path in (("served /metrics", "/metrics"), ("served overview", "/")):
        out[name] = row(*await db_ms(url, admin, database, None, n, path))
    store = await PgStore.open(url, max_size=1)
    try:
        figures = await read_figures(store)
        exact = await store.counts()
    finally:
        await store.close()
    out["query_ms"] = query_ms(url)
    out["figures"] = {"states": figures.states, "estimated": sorted(figures.estimated),
                      "exact": exact, "due": figures.due, "due_capped": figures.due_capped,
                      "session_overhead_db_ms": round(overhead, 2)}
    return out


def poll_pending_once(url: str) -> None:
    """One new version of every pending row, as a poll writes it: their pages are no longer
    all-visible and the pending index holds a dead entry for each until the next VACUUM."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE video_jobs SET polls = polls + 1 WHERE state = 'pending'")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--scrape-repeat", type=int, default=5)
    p.add_argument("--only-scrape", action="store_true", help="skip the page timings")
    args = p.parse_args()
    with scratch_database() as url:
        asyncio.run(migrate(url))
        started = time.perf_counter()
        fill(url, args.rows)
        loaded_s = time.perf_counter() - started
        scrape = {"vacuumed": asyncio.run(scrape_costs(url, args.scrape_repeat))}
        print(json.dumps({"scrape vacuumed": scrape["vacuumed"]}), file=sys.stderr, flush=True)
        figures: dict[str, Any] = {"rows": args.rows}
        if not args.only_scrape:
            figures = asyncio.run(measure(url, args.repeat, args.rows))
        poll_pending_once(url)
        scrape["polled"] = asyncio.run(scrape_costs(url, args.scrape_repeat))
    print(json.dumps({**figures, "scrape": scrape, "load_s": round(loaded_s, 1)}), flush=True)


if __name__ == "__main__":
    main()
