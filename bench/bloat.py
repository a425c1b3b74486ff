"""Scenario 6b (issue #7), bloat: the size of `video_jobs` (table + indexes) after 1,000,000
status reads over 10,000 live jobs with the shipped autovacuum settings, against its fresh size.
Target: under 3x.

It always runs on the embedded PostgreSQL, whatever DATABASE_URL says: a server with
`autovacuum = off` (as the machine's shared one is) would measure nothing but the absence of
vacuum. The output records the server's version and its autovacuum settings.

    .venv/bin/python bench/bloat.py [--quick]     # one JSON line; --quick: 100,000 reads
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from suite import fake_stats, fake_sume, load_backlog, spawn_vidpoll, stop

from vidpoll.embedded import start_embedded
from vidpoll.store import create_database_if_missing, drop_database, migrate

HOME = Path(tempfile.gettempdir()) / "vidpoll-bench-embedded"
LIVE_JOBS = 10_000
TARGET_RATIO = 3.0
SAMPLE_EVERY_S = 10.0
CONCURRENCY = 200

SERVER_SETTINGS = ("server_version", "autovacuum", "autovacuum_naptime",
                   "autovacuum_max_workers", "autovacuum_vacuum_cost_limit",
                   "autovacuum_vacuum_cost_delay", "shared_buffers")


def sizes(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """video_jobs in bytes: everything, the heap's main fork, the heap with TOAST/FSM/VM, the
    indexes together and each by name."""
    row = conn.execute("SELECT pg_total_relation_size('video_jobs'), "
                       "pg_relation_size('video_jobs'), pg_table_size('video_jobs'), "
                       "pg_indexes_size('video_jobs')").fetchone()
    assert row is not None
    index = conn.execute("SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) "
                         "FROM pg_index WHERE indrelid = 'video_jobs'::regclass "
                         "ORDER BY 1").fetchall()
    return {"total": row[0], "table": row[1], "table_all_forks": row[2], "indexes": row[3],
            "index": {name: size for name, size in index}}


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """video_jobs's row of pg_stat_user_tables (the counters this scenario watches)."""
    cur = conn.execute("SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, "
                       "autovacuum_count, vacuum_count, autoanalyze_count, last_autovacuum::text "
                       "FROM pg_stat_user_tables WHERE relid = 'video_jobs'::regclass")
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def sample(conn: psycopg.Connection[Any], base: str, started: float) -> dict[str, Any]:
    """One compact point of the curve: reads so far vs sizes and vacuum activity."""
    size, st = sizes(conn), table_stats(conn)
    return {"t_s": round(time.monotonic() - started, 1), "reads": fake_stats(base)["reads"],
            "total": size["total"], "table": size["table"], "index": size["index"],
            "live": st["n_live_tup"], "dead": st["n_dead_tup"],
            "autovacuums": st["autovacuum_count"], "last_autovacuum": st["last_autovacuum"]}


def server_info(conn: psycopg.Connection[Any], pgdata: Path) -> dict[str, Any]:
    """Which server, and the settings that decide how soon dead rows are reclaimed."""
    info: dict[str, Any] = {"embedded": True, "pgdata": str(pgdata)}
    for name in SERVER_SETTINGS:
        row = conn.execute(f"SHOW {name}").fetchone()
        assert row is not None
        info["server_autovacuum" if name == "autovacuum" else name] = row[0]
    row = conn.execute("SELECT reloptions FROM pg_class "
                       "WHERE oid = 'video_jobs'::regclass").fetchone()
    assert row is not None
    info["video_jobs_reloptions"] = row[0]
    return info


def bloat(url: str | None, quick: bool) -> dict[str, Any]:
    """6b. 10,000 pending jobs all due now, polled by a real worker (no added latency,
    `next_poll_after_seconds` 1) until the fake answered 1,000,000 reads (quick: 100,000);
    video_jobs's size sampled every 10 s against its size right after load + VACUUM ANALYZE.
    `url` is ignored: the scenario makes its own scratch database on the embedded server."""
    del url  # autovacuum must be on; the embedded server is the one we know has it on
    polls = 100_000 if quick else 1_000_000
    admin = start_embedded(HOME, database="postgres")
    name = f"bench_bloat_{uuid.uuid4().hex[:8]}"
    create_database_if_missing(admin, name)
    db = psycopg.conninfo.make_conninfo(admin, dbname=name)
    try:
        asyncio.run(migrate(db))
        return _run(db, polls)
    finally:
        drop_database(admin, name)


def _run(url: str, polls: int) -> dict[str, Any]:
    from vidpoll.sql import QUERIES

    out: dict[str, Any] = {"scenario": "bloat", "live_jobs": LIVE_JOBS, "target_polls": polls,
                           "concurrency": CONCURRENCY}
    with psycopg.connect(url, autocommit=True) as conn, \
            fake_sume(0, next_poll_after=1.0, jitter=0) as base:
        out["server"] = server_info(conn, HOME / "pgdata")
        load_backlog(url, LIVE_JOBS)  # inserts b1..b10000 due now, then VACUUM ANALYZE
        # again, now that the loading backend has exited: its late statistics report would
        # otherwise count the inserted rows twice in n_live_tup
        conn.execute("VACUUM ANALYZE video_jobs")
        fresh = sizes(conn)
        out["fresh"] = fresh
        started = time.monotonic()
        samples = [sample(conn, base, started)]
        worker = spawn_vidpoll(url, base, CONCURRENCY)
        try:
            next_sample = started + SAMPLE_EVERY_S
            while fake_stats(base)["reads"] < polls:
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited with {worker.returncode}")
                if time.monotonic() >= next_sample:
                    samples.append(sample(conn, base, started))
                    next_sample += SAMPLE_EVERY_S
                time.sleep(0.5)
            took = time.monotonic() - started
        finally:
            stop([worker])
        out["polls"] = fake_stats(base)["reads"]
        out["reads_per_s"] = round(out["polls"] / took, 1)
        time.sleep(1.5)  # the worker's backends' last statistics land
        samples.append(sample(conn, base, started))
        final = sizes(conn)
        stats = table_stats(conn)
        out["final"] = final
        out["stats"] = stats
        out["hot_update_share"] = round(stats["n_tup_hot_upd"] / max(stats["n_tup_upd"], 1), 4)
        out["ratio_final_to_fresh"] = round(final["total"] / fresh["total"], 2)
        out["max_ratio"] = round(max(s["total"] for s in samples) / fresh["total"], 2)
        out["target_ratio"] = TARGET_RATIO
        out["growth_by_relation"] = {
            "table": round(final["table"] / fresh["table"], 2),
            **{n: round(final["index"][n] / max(fresh["index"][n], 1), 2)
               for n in final["index"]}}
        out["autovacuum_count"] = stats["autovacuum_count"]
        out["vacuum_count"] = stats["vacuum_count"]  # the workers' own (--vacuum-every)
        # every table the worker touches (counters per flush, rate buckets per claim, events
        # on errors only), not just video_jobs
        out["all_tables_total"] = dict(conn.execute(
            "SELECT relname::text, pg_total_relation_size(relid) FROM pg_stat_user_tables "
            "ORDER BY 2 DESC, 1").fetchall())
        out["events_by_kind"] = dict(conn.execute(
            "SELECT kind, count(*) FROM video_job_events GROUP BY 1 ORDER BY 1").fetchall())
        params = {"limit": 100, "lease_s": 25.0, "worker_id": "bench", "now": None,
                  "account": "default"}
        with conn.transaction(force_rollback=True):  # ANALYZE runs the UPDATE: undo it
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + QUERIES["claim_due"],
                                params).fetchall()
        out["explain_claim"] = [r[0] for r in plan]
        out["samples"] = samples
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="100,000 reads instead of 1,000,000.")
    args = p.parse_args()
    started = time.monotonic()
    result = bloat(None, args.quick)
    result.update(quick=args.quick, took_s=round(time.monotonic() - started, 1),
                  machine={"cpus": os.cpu_count(), "python": sys.version.split()[0]})
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
