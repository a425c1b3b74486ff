"""Does the dashboard stay fast with a million rows? Times its pages over real HTTP.

A scratch database gets `--rows` jobs (1 % pending, the rest finished over 30 days, one in
twenty failed), a history with an error event per failed job, and ANALYZE. Then every page is
fetched `--repeat` times from `vidpoll serve`'s application on loopback: the overview, the
first and a deep page (cursor half-way) of each listing, a job's detail. Prints one JSON
object: the median and max milliseconds per page.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/dashboard_scale.py --rows 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from urllib.parse import quote

import aiohttp
import psycopg
from scratch_db import scratch_database

from vidpoll.store import PgStore, migrate
from vidpoll.web import make_app, start_server


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
    with scratch_database() as url:
        asyncio.run(migrate(url))
        started = time.perf_counter()
        fill(url, args.rows)
        loaded_s = time.perf_counter() - started
        figures = asyncio.run(measure(url, args.repeat, args.rows))
    print(json.dumps({**figures, "load_s": round(loaded_s, 1)}), flush=True)


if __name__ == "__main__":
    main()
