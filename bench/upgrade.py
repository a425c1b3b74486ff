"""Scenario upgrade (issue 16, item 4): `vidpoll migrate` on a seed-DDL table of 1,000,000 rows
(900,000 finished, 100,000 pending and due) while a seed-style loop polls it through the fake
Sume. Reports the migrate's duration, the loop's longest stall (the longest gap between two of
its successful steps while migrate ran) and its failed statements, before (the one-transaction
runner of commit d4bc286, its files from git history) and after (this tree's `vidpoll
migrate`, run as the CLI), each on a table of its own, in the same run. Target: longest stall
<= 1 s, no failed statement.

    .venv/bin/python bench/suite.py --only upgrade [--quick]   # --quick: 100,000 rows
    .venv/bin/python bench/upgrade.py [--quick] [--rows N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from scratch_db import scratch_database

HERE = Path(__file__).resolve().parent
ONE_TRANSACTION_RUNNER = "d4bc286"
SEED_DDL = """
CREATE TABLE video_jobs (
  job_id        text PRIMARY KEY,
  state         text NOT NULL DEFAULT 'pending',
  next_poll_at  timestamptz NOT NULL DEFAULT now() + interval '15 seconds'
);
CREATE INDEX ON video_jobs (next_poll_at) WHERE state = 'pending';
"""
# bench/seed_loop.py's claim, character for character
CLAIM = ("SELECT job_id FROM video_jobs WHERE state='pending' "
         "AND next_poll_at <= now() ORDER BY next_poll_at "
         "FOR UPDATE SKIP LOCKED LIMIT 1")
KEY = "sk-bench"
FAKE_LATENCY_MS = 20.0
WARM_S = 5.0
"""The loop runs this long before migrate starts (its own longest gap there is the baseline)
and after it ends."""


def seed_loop(url: str, base: str) -> None:
    """bench/seed_loop.py's loop (one row per transaction, the status read inside it), timed:
    on SIGTERM, prints the monotonic time of every successful step and every failed
    statement. A failed statement is counted and the loop goes on, as a supervisor would
    restart the seed's process."""
    steps: list[float] = []
    errors: list[list[Any]] = []
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    headers = {"Authorization": f"Bearer {KEY}"}
    db = psycopg.connect(url)
    while not stop[0]:
        try:
            with db.transaction():
                row = db.execute(CLAIM).fetchone()
                if row:
                    job_id = row[0]
                    request = urllib.request.Request(f"{base}/v1/jobs/{job_id}/status",
                                                     headers=headers)
                    with urllib.request.urlopen(request, timeout=15) as resp:
                        s = json.loads(resp.read())
                    if s.get("terminal"):
                        db.execute("UPDATE video_jobs SET state=%s WHERE job_id=%s",
                                   (s["sume_status"], job_id))
                    else:
                        wait = s.get("next_poll_after_seconds") or 15
                        db.execute("UPDATE video_jobs SET next_poll_at = now() "
                                   "+ make_interval(secs => %s) WHERE job_id=%s",
                                   (wait, job_id))
            steps.append(time.monotonic())
        except psycopg.Error as exc:
            errors.append([time.monotonic(), f"{type(exc).__name__}: {exc}"[:300]])
            if db.closed or db.broken:
                db = psycopg.connect(url)
            continue
        if not row:
            time.sleep(2)
    db.close()
    print(json.dumps({"steps": steps, "errors": errors}), flush=True)


def build_seed_table(url: str, rows: int) -> None:
    """The seed's DDL, `rows` rows: nine in ten finished, the rest pending and due now."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_DDL)
        conn.execute("INSERT INTO video_jobs (job_id, state, next_poll_at) "
                     "SELECT 'job_' || lpad(g::text, 8, '0'), "
                     "CASE WHEN g %% 10 = 0 THEN 'pending' ELSE 'completed' END, "
                     "now() - interval '1 second' FROM generate_series(1, %(rows)s) g",
                     {"rows": rows})
        conn.execute("VACUUM ANALYZE video_jobs")


def one_transaction_files() -> list[tuple[int, str, str]]:
    """The migration files of the one-transaction runner, from git history."""
    root = HERE.parent
    folder = "src/vidpoll/sql/migrations/"
    names = subprocess.run(["git", "-C", str(root), "ls-tree", "--name-only",
                            ONE_TRANSACTION_RUNNER, folder], check=True, capture_output=True,
                           text=True).stdout.split()
    return [(int(Path(n).name[:4]), Path(n).name,
             subprocess.run(["git", "-C", str(root), "show", f"{ONE_TRANSACTION_RUNNER}:{n}"],
                            check=True, capture_output=True, text=True).stdout)
            for n in sorted(names)]


def one_transaction_migrate(url: str) -> None:
    """`migrate` as commit d4bc286 ran it: every file in one transaction, after LOCK TABLE
    video_jobs IN ACCESS EXCLUSIVE MODE (lock_timeout 60 s)."""
    files = one_transaction_files()
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '60s'")
        conn.execute("SELECT pg_advisory_xact_lock(7306198364525511)")
        conn.execute("CREATE TABLE IF NOT EXISTS vidpoll_schema_migrations (version integer "
                     "PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL "
                     "DEFAULT now())")
        conn.execute("DO $$ BEGIN IF to_regclass('video_jobs') IS NOT NULL THEN "
                     "LOCK TABLE video_jobs IN ACCESS EXCLUSIVE MODE; END IF; END $$")
        for version, name, text in files:
            conn.execute(text)  # shipped SQL text of an earlier commit
            conn.execute("INSERT INTO vidpoll_schema_migrations (version, name) "
                         "VALUES (%(v)s, %(n)s)", {"v": version, "n": name})


def online_migrate(url: str) -> None:
    """This tree's `vidpoll migrate`, as an operator runs it."""
    subprocess.run([sys.executable, "-m", "vidpoll.cli", "--log-level", "WARNING", "migrate"],
                   check=True,
                   env={**os.environ, "DATABASE_URL": url}, stdout=subprocess.DEVNULL)


def longest_gap(steps: list[float], start: float, end: float) -> float:
    """The longest time between two successive steps, over the gaps that overlap
    [start, end]."""
    gaps = [b - a for a, b in itertools.pairwise(steps) if b >= start and a <= end]
    return max(gaps, default=end - start)


def run_one(runner: str, rows: int, base: str) -> dict[str, Any]:
    with scratch_database() as url:
        started = time.monotonic()
        build_seed_table(url, rows)
        built_s = time.monotonic() - started
        loop = subprocess.Popen([sys.executable, str(Path(__file__)), "--seed-loop", url,
                                 base], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(WARM_S)  # the loop's own pace, before
            t0 = time.monotonic()
            (one_transaction_migrate if runner == "one-transaction" else online_migrate)(url)
            t1 = time.monotonic()
            time.sleep(WARM_S)  # and after, beside the upgraded schema and its triggers
        finally:
            loop.send_signal(signal.SIGTERM)
            out, _ = loop.communicate(timeout=60)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT max(version) FROM vidpoll_schema_migrations").fetchone()
            version = row[0] if row else None
    report = json.loads(out)
    steps: list[float] = report["steps"]
    before = [s for s in steps if s < t0]
    during = [s for s in steps if t0 <= s <= t1]
    return {
        "runner": runner, "rows": rows, "table_built_s": round(built_s, 1),
        "migrate_s": round(t1 - t0, 2), "schema_version": version,
        "longest_stall_s": round(longest_gap(steps, t0, t1), 3),
        "longest_gap_before_s": round(longest_gap(before, before[0], t0), 3) if before else None,
        "steps_per_s_before": round(len(before) / WARM_S, 1),
        "steps_per_s_during": round(len(during) / max(t1 - t0, 1e-9), 1),
        "steps_during": len(during),
        "failed_statements": len(report["errors"]),
        "errors": [e[1] for e in report["errors"][:5]],
    }


def upgrade(url: str, quick: bool, rows: int | None = None) -> dict[str, Any]:
    """Both runners on tables of their own (`url`, migrated by the suite, is not used)."""
    from suite import fake_sume

    rows = rows or (100_000 if quick else 1_000_000)
    with fake_sume(FAKE_LATENCY_MS, next_poll_after=1.0) as base:
        before = run_one("one-transaction", rows, base)
        after = run_one("online", rows, base)
    return {"scenario": "upgrade", "rows": rows, "finished_rows": rows - rows // 10,
            "fake_latency_ms": FAKE_LATENCY_MS, "target_longest_stall_s": 1.0,
            "before": before, "after": after,
            "stall_ratio": round(before["longest_stall_s"] / after["longest_stall_s"], 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="100,000 rows.")
    p.add_argument("--rows", type=int)
    p.add_argument("--seed-loop", nargs=2, metavar=("URL", "BASE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.seed_loop:
        seed_loop(*args.seed_loop)
        return
    print(json.dumps(upgrade("", args.quick, args.rows)), flush=True)


if __name__ == "__main__":
    main()
