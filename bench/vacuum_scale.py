"""Scenario "vacuum_scale" (issue #16, item 8): the workers' own VACUUM (`--vacuum-every ROWS`)
on a realistic table: 10,000 pending rows among 5,000,000 finished ones.

One template database is filled once (one INSERT ... SELECT generate_series of finished rows
with a status body and a result, then the pending rows, newest last as in a real table;
VACUUM FREEZE ANALYZE, as a long-lived table is), then each variant runs on its own copy
(CREATE DATABASE ... TEMPLATE), side by side in one run: two `vidpoll worker --poll-only`
processes (concurrency 100 each) poll the pending rows against the fake Sume, which answers
"processing" with a 1 s hint after 50 ms +- 30 %, so every row is read again as soon as a
worker gets to it, for `--seconds` per variant. Variants: --vacuum-every 5000 (the default),
0 (autovacuum only), other thresholds, and "ic15": the workers at 0 while this script runs
their statement with INDEX_CLEANUP ON every 15 s (what a change to the worker's statement
would get; PostgreSQL skips index vacuuming otherwise, see FORCED).

Measured per variant, from outside:
- each VACUUM of video_jobs, the workers' and autovacuum's: its duration (pg_stat_activity
  sampled every 0.2 s: a worker's VACUUM ends at its connection's state_change, exact;
  autovacuum's within the sampling interval), the phases seen (pg_stat_progress_vacuum), and
  the counts in pg_stat_user_tables;
- the fake's reads/s, overall and during vs between vacuums (0.5 s slices, each counted as
  "during" when a VACUUM of video_jobs covers most of it);
- the hot indexes' size over time (the partial pending indexes video_jobs_next_poll_at_idx and
  video_jobs_account_due_idx) and the heap's, n_dead_tup;
- the claim statement's time at the end (rolled back, 50 repetitions).

Always on the embedded PostgreSQL (autovacuum on, whatever DATABASE_URL says: the shared
server here runs with autovacuum off, which would make "autovacuum only" mean "no vacuum").

    .venv/bin/python bench/suite.py --only vacuum_scale [--quick]
    .venv/bin/python bench/vacuum_scale.py [--quick] [--finished 5000000] [--seconds 180]
        [--every 5000 0 50000 500000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from suite import env_for, fake_stats, fake_sume, stop

from vidpoll.embedded import start_embedded
from vidpoll.store import create_database_if_missing, drop_database, migrate
from vidpoll.worker import DEFAULT_VACUUM_EVERY_ROWS

HOME = Path(tempfile.gettempdir()) / "vidpoll-bench-embedded"
PENDING = 10_000
FINISHED = 5_000_000
WORKERS = 2
CONCURRENCY = 100
LATENCY_MS = 50.0
HOT_INDEXES = ("video_jobs_next_poll_at_idx", "video_jobs_account_due_idx")
VARIANTS = (str(DEFAULT_VACUUM_EVERY_ROWS), "0", "50000", "500000", "ic15")
SAMPLE_S = 0.2
SIZE_EVERY_S = 5.0
SLICE_S = 0.5

FILL = """
INSERT INTO video_jobs (job_id, state, next_poll_at, created_at, updated_at, polling_since,
                        finished_at, polls, last_polled_at, last_http_status, provider_status,
                        last_response, last_request_id, result, result_state, result_fetched_at,
                        account)
SELECT 'job_' || lpad(g::text, 9, '0'),
       CASE WHEN g %% 20 = 0 THEN 'failed' ELSE 'completed' END,
       t, t - interval '3 minutes', t, t - interval '3 minutes', t, 5 + g %% 30, t, 200,
       CASE WHEN g %% 20 = 0 THEN 'failed' ELSE 'completed' END,
       jsonb_build_object('id', 'job_' || g, 'terminal', true, 'sume_status',
                          CASE WHEN g %% 20 = 0 THEN 'failed' ELSE 'completed' END,
                          'progress', 100, 'model', 'sume-video-2', 'duration_s', 8),
       'req_' || md5(g::text),
       CASE WHEN g %% 20 = 0 THEN NULL ELSE jsonb_build_object(
           'id', 'job_' || g, 'video_url',
           'https://cdn.example.com/v/' || md5(g::text) || '.mp4?X-Signature=redacted',
           'thumbnail_url', 'https://cdn.example.com/t/' || md5(g::text) || '.jpg',
           'width', 1280, 'height', 720, 'bytes', 4000000 + g %% 1000000) END,
       CASE WHEN g %% 20 = 0 THEN NULL ELSE 'fetched' END,
       CASE WHEN g %% 20 = 0 THEN NULL ELSE t END,
       'default'
FROM generate_series(1, %(finished)s) g,
     LATERAL (SELECT now() - make_interval(secs => (%(finished)s - g) * 0.5)) AS f(t)
"""
"""The finished rows: one every half second over the past (5M rows: 29 days), oldest first."""

PENDING_FILL = """
INSERT INTO video_jobs (job_id, next_poll_at, polls, account)
SELECT 'job_p' || lpad(g::text, 8, '0'), now() - make_interval(secs => g %% 60), g %% 5,
       'default'
FROM generate_series(1, %(pending)s) g
"""


def relation_sizes(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT c.relname::text, pg_relation_size(c.oid) FROM pg_class c "
        "WHERE c.relname = 'video_jobs' OR c.oid IN (SELECT indexrelid FROM pg_index "
        "WHERE indrelid = 'video_jobs'::regclass)").fetchall()
    return {name: size for name, size in rows}


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    cur = conn.execute("SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, vacuum_count, "
                       "autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
                       "WHERE relid = 'video_jobs'::regclass")
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def build_template(admin: str, finished: int, pending: int) -> tuple[str, dict[str, Any]]:
    name = f"bench_vac_{uuid.uuid4().hex[:8]}_t"
    create_database_if_missing(admin, name)
    db = psycopg.conninfo.make_conninfo(admin, dbname=name)
    asyncio.run(migrate(db))
    info: dict[str, Any] = {}
    with psycopg.connect(db, autocommit=True) as conn:
        started = time.monotonic()
        conn.execute("ALTER TABLE video_jobs DISABLE TRIGGER USER")  # bulk load: no events
        conn.execute(FILL, {"finished": finished})
        conn.execute(PENDING_FILL, {"pending": pending})
        conn.execute("ALTER TABLE video_jobs ENABLE TRIGGER USER")
        info["insert_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        conn.execute("VACUUM (FREEZE, ANALYZE) video_jobs")
        info["vacuum_freeze_analyze_s"] = round(time.monotonic() - started, 1)
        info["sizes"] = relation_sizes(conn)
        info["table_total_bytes"] = conn.execute(
            "SELECT pg_total_relation_size('video_jobs')").fetchone()[0]  # type: ignore[index]
    return name, info


class VacuumWatch:
    """Every VACUUM of video_jobs in this database seen in pg_stat_activity (with its progress
    row): key (pid, query_start) -> what is known of it."""

    QUERY = """
    SELECT a.pid, a.backend_type, a.state, extract(epoch FROM a.query_start)::float8,
           extract(epoch FROM a.state_change)::float8,
           extract(epoch FROM clock_timestamp())::float8,
           a.query, p.phase, p.heap_blks_total, p.heap_blks_scanned, p.index_vacuum_count,
           a.application_name
    FROM pg_stat_activity a LEFT JOIN pg_stat_progress_vacuum p ON p.pid = a.pid
    WHERE a.datname = current_database() AND a.query ~* 'vacuum' AND a.query ~ 'video_jobs([^_]|$)'
      AND a.pid <> pg_backend_pid() AND a.backend_type <> 'parallel worker'
    """

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], dict[str, Any]] = {}

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        for (pid, btype, state, q_start, s_change, now, query, phase, blks_total, blks_scanned,
             index_scans, app) in conn.execute(self.QUERY).fetchall():
            auto = btype == "autovacuum worker"
            if auto and "ANALYZE" in query and "VACUUM" not in query:
                continue  # an autoanalyze only
            v = self.seen.setdefault((pid, q_start), {
                # a worker's connections carry its id (application_name "vidpoll <id>"); the
                # statement alone no longer tells (the workers' has INDEX_CLEANUP ON too)
                "by": "autovacuum" if auto else "worker" if (app or "").startswith("vidpoll ")
                else "script", "start": q_start, "end": None,
                "last_seen": now, "phases": set(), "heap_blks_total": None,
                "heap_blks_scanned": 0, "index_vacuum_count": 0})
            if state == "active" or auto:
                v["last_seen"] = now
                if phase:
                    v["phases"].add(phase)
                if blks_total is not None:
                    v["heap_blks_total"] = blks_total
                    v["heap_blks_scanned"] = max(v["heap_blks_scanned"], blks_scanned or 0)
                    v["index_vacuum_count"] = max(v["index_vacuum_count"], index_scans or 0)
            elif v["end"] is None:
                v["end"] = s_change  # the worker's connection went idle: the VACUUM ended

    def intervals(self) -> list[dict[str, Any]]:
        out = []
        for v in sorted(self.seen.values(), key=lambda v: v["start"]):
            end = v["end"] if v["end"] is not None else v["last_seen"]
            out.append({**v, "end": end, "duration_s": end - v["start"],
                        "phases": sorted(v["phases"])})
        return out


def _durations(vs: list[dict[str, Any]]) -> dict[str, Any]:
    if not vs:
        return {"count": 0}
    d = sorted(v["duration_s"] for v in vs)
    return {"count": len(d), "median_s": round(statistics.median(d), 3),
            "p90_s": round(d[int(len(d) * 0.9)], 3), "max_s": round(d[-1], 3),
            "total_s": round(sum(d), 1),
            "index_vacuum_passes": sum(v["index_vacuum_count"] for v in vs),
            "heap_blks_scanned_median": statistics.median(v["heap_blks_scanned"] for v in vs),
            "phases_seen": sorted({p for v in vs for p in v["phases"]})}


def _rates(reads: list[tuple[float, int]], vacuums: list[dict[str, Any]]) -> dict[str, Any]:
    """reads/s in slices mostly covered by some VACUUM vs the others."""
    spans = [(v["start"], v["end"]) for v in vacuums]
    during = [0.0, 0]
    between = [0.0, 0]
    for (t0, r0), (t1, r1) in itertools.pairwise(reads):
        covered = sum(max(0.0, min(t1, e) - max(t0, s)) for s, e in spans)
        bucket = during if covered > (t1 - t0) / 2 else between
        bucket[0] += t1 - t0
        bucket[1] += r1 - r0
    return {"during_vacuum_reads_per_s": round(during[1] / during[0], 1) if during[0] else None,
            "during_vacuum_s": round(during[0], 1),
            "between_vacuums_reads_per_s": round(between[1] / between[0], 1)
            if between[0] else None,
            "between_vacuums_s": round(between[0], 1)}


def claim_ms(conn: psycopg.Connection[Any], repeat: int = 50) -> dict[str, float]:
    from vidpoll.sql import QUERIES

    params = {"limit": 100, "lease_s": 25.0, "worker_id": "bench", "now": None,
              "account": "default"}
    times = []
    for _ in range(repeat):
        with conn.transaction(force_rollback=True):
            started = time.perf_counter()
            conn.execute(QUERIES["claim_due"], params).fetchall()
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {"median": round(times[len(times) // 2], 2),
            "p95": round(times[int(len(times) * 0.95)], 2)}


FORCED = "VACUUM (SKIP_LOCKED, TRUNCATE false, INDEX_CLEANUP ON) video_jobs"
"""What a variant "icN" runs every N seconds from this script (the workers at --vacuum-every
0): the workers' statement with index vacuuming forced, which PostgreSQL otherwise skips
while dead rows sit on under 2 % of the table's pages (always, with 10,000 pending rows among
millions): the figure a fix in the worker's statement would get."""


def _forced_vacuums(db: str, every_s: float, until: float) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        while time.time() + every_s < until:
            time.sleep(every_s)
            conn.execute(FORCED)


def run_variant(admin: str, template: str, variant: str, seconds: float, base: str,
                logs: Path) -> dict[str, Any]:
    forced_s = float(variant[2:]) if variant.startswith("ic") else None
    every = 0 if forced_s is not None else int(variant)
    name = f"{template[:-2]}_{variant}"
    with psycopg.connect(admin, autocommit=True) as conn:
        started = time.monotonic()
        # FILE_COPY: a file copy and a checkpoint, not gigabytes of WAL (PostgreSQL 15+)
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        copied_s = time.monotonic() - started
    db = psycopg.conninfo.make_conninfo(admin, dbname=name)
    asyncio.run(migrate(db))  # a migration may have landed since the template was made
    out: dict[str, Any] = {"vacuum_every": every, "copy_s": round(copied_s, 1),
                           "variant": f"--vacuum-every {every}" if forced_s is None else
                           f"--vacuum-every 0, script: {FORCED} every {forced_s:g} s"}
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            out["fresh"] = relation_sizes(conn)
            watch = VacuumWatch()
            env = env_for(db, base)
            procs = []
            for i in range(WORKERS):
                with (logs / f"{variant}-{i}.log").open("wb") as err:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "vidpoll.cli", "--log-level", "warning",
                         "worker", "--poll-only", "--no-fetch-results", "--concurrency",
                         str(CONCURRENCY), "--vacuum-every", str(every)],
                        env=env, stdout=subprocess.DEVNULL, stderr=err))
            t_start = time.time()
            forcer = None
            if forced_s is not None:
                forcer = threading.Thread(target=_forced_vacuums,
                                          args=(db, forced_s, t_start + seconds), daemon=True)
                forcer.start()
            reads: list[tuple[float, int]] = []
            sizes: list[dict[str, Any]] = []
            next_size = 0.0
            try:
                while (now := time.time()) < t_start + seconds:
                    for p in procs:
                        if p.poll() is not None:
                            raise RuntimeError(f"a worker exited with {p.returncode}")
                    watch.sample(conn)
                    reads.append((time.time(), int(fake_stats(base)["reads"])))
                    if now >= next_size:
                        s = relation_sizes(conn)
                        st = table_stats(conn)
                        sizes.append({"t_s": round(now - t_start, 1),
                                      "hot_index_bytes": sum(s[i] for i in HOT_INDEXES),
                                      "table_bytes": s["video_jobs"],
                                      "dead": st["n_dead_tup"]})
                        next_size = now + SIZE_EVERY_S
                    time.sleep(SAMPLE_S)
            finally:
                stop(procs)
                if forcer is not None:
                    forcer.join()
            watch.sample(conn)
            time.sleep(1.5)  # the workers' last statistics reports land
            vacuums = watch.intervals()
            # the first reads begin once the workers are up: rate from the first read on
            first = next((i for i, (_, r) in enumerate(reads) if r > reads[0][1]), 0)
            r = reads[first:]
            out["reads"] = r[-1][1] - r[0][1]
            out["reads_per_s"] = round(out["reads"] / (r[-1][0] - r[0][0]), 1)
            mine = [v for v in vacuums if v["by"] == "worker"]
            auto = [v for v in vacuums if v["by"] == "autovacuum"]
            out["worker_vacuums"] = _durations(mine)
            out["autovacuums"] = _durations(auto)
            out["script_vacuums"] = _durations([v for v in vacuums if v["by"] == "script"])
            out.update(_rates(r, [v for v in vacuums if v["end"] > r[0][0]]))
            out["stats"] = table_stats(conn)
            out["final"] = relation_sizes(conn)
            hot = [s["hot_index_bytes"] for s in sizes]
            out["hot_index_bytes"] = {"fresh": sum(out["fresh"][i] for i in HOT_INDEXES),
                                      "max": max(hot),
                                      "final": sum(out["final"][i] for i in HOT_INDEXES)}
            out["table_bytes"] = {"fresh": out["fresh"]["video_jobs"],
                                  "final": out["final"]["video_jobs"]}
            out["claim_ms_at_end"] = claim_ms(conn)
            out["samples"] = sizes
            out["vacuum_log"] = [{"by": v["by"], "at_s": round(v["start"] - t_start, 2),
                                  "s": round(v["duration_s"], 3),
                                  "index_passes": v["index_vacuum_count"],
                                  "heap_blks_scanned": v["heap_blks_scanned"]}
                                 for v in vacuums]
    finally:
        drop_database(admin, name)
    return out


def vacuum_scale(url: str | None, quick: bool, finished: int | None = None,
                 seconds: float | None = None,
                 variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    """`url` is ignored: the scenario makes its own databases on the embedded server."""
    del url
    finished = finished or (500_000 if quick else FINISHED)
    seconds = seconds or (45.0 if quick else 180.0)
    admin = start_embedded(HOME, database="postgres")
    out: dict[str, Any] = {"scenario": "vacuum_scale", "pending": PENDING, "finished": finished,
                           "workers": WORKERS, "concurrency": CONCURRENCY,
                           "fake_latency_ms": LATENCY_MS, "hint_s": 1.0, "seconds": seconds}
    with psycopg.connect(admin, autocommit=True) as conn:
        out["server"] = {k: conn.execute(f"SHOW {k}").fetchone()[0]  # type: ignore[index]
                         for k in ("server_version", "autovacuum", "autovacuum_naptime",
                                   "shared_buffers", "maintenance_work_mem")}
    template, info = build_template(admin, finished, PENDING)
    out["template"] = info
    try:
        with fake_sume(LATENCY_MS, next_poll_after=1.0) as base, \
                tempfile.TemporaryDirectory(prefix="vidpoll-vacuum-") as tmp:
            out["variants"] = [run_variant(admin, template, v, seconds, base, Path(tmp))
                               for v in variants]
    finally:
        drop_database(admin, template)
    print(summary(out), file=sys.stderr, flush=True)
    return out


def summary(r: dict[str, Any]) -> str:
    lines = [f"vacuum at {r['finished']:,} finished + {r['pending']:,} pending rows, "
             f"{r['workers']} workers x {r['concurrency']}, {r['seconds']:g} s per variant, "
             f"PostgreSQL {r['server']['server_version']}"]
    mb = 1024 * 1024
    for v in r["variants"]:
        w, a, h = v["worker_vacuums"], v["autovacuums"], v["hot_index_bytes"]
        lines.append(
            f"  {v['variant']}: {v['reads_per_s']} reads/s "
            f"(during vacuum {v['during_vacuum_reads_per_s']}, between "
            f"{v['between_vacuums_reads_per_s']}); worker VACUUMs {w['count']} "
            f"(median {w.get('median_s')} s, max {w.get('max_s')} s, "
            f"{w.get('total_s', 0)} s in all; {v['stats']['vacuum_count']} in "
            f"pg_stat_user_tables); autovacuums {v['stats']['autovacuum_count']} "
            f"(median {a.get('median_s')} s); forced by the script {v['script_vacuums']}; "
            f"hot index {h['fresh'] / mb:.2f} -> max "
            f"{h['max'] / mb:.2f} MB, end {h['final'] / mb:.2f} MB; table "
            f"{v['table_bytes']['fresh'] / mb:.0f} -> {v['table_bytes']['final'] / mb:.0f} MB; "
            f"claim {v['claim_ms_at_end']['median']} ms")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="500,000 finished rows, 45 s each.")
    p.add_argument("--finished", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--every", nargs="+", default=list(VARIANTS),
                   help="ROWS for --vacuum-every, or icN: the script forces index vacuuming "
                        "every N s (workers at 0).")
    args = p.parse_args()
    started = time.monotonic()
    result = vacuum_scale(None, args.quick, args.finished, args.seconds, tuple(args.every))
    result.update(quick=args.quick, took_s=round(time.monotonic() - started, 1),
                  machine={"cpus": os.cpu_count(), "python": sys.version.split()[0]})
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
