"""Idle cost of one default `vidpoll worker` (poller, submitter and result fetcher, nothing due):
transactions over 60 s after a 15 s start-up, from `pg_stat_database`, and the connections it
holds, from `pg_stat_activity`. DATABASE_URL's server, else the embedded one.

    .venv/bin/python bench/idle_cost.py [--window 60]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import psycopg
from scratch_db import scratch_database
from suite import env_for, fake_sume

from vidpoll.store import migrate

OBSERVER_TRANSACTIONS = 3
"""This script's own transactions inside the window (two counts and one connection count)."""


def transactions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
        assert row is not None
        return int(row[0])


def connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND application_name LIKE 'vidpoll%%'").fetchone()
        assert row is not None
        return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    with scratch_database() as url, fake_sume(0) as base:
        asyncio.run(migrate(url))
        worker = subprocess.Popen([sys.executable, "-m", "vidpoll.cli", "--log-level",
                                   "WARNING", "worker"], env=env_for(url, base),
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(15)  # start-up: migrations check, pools, LISTEN
            x0, c0 = transactions(url), connections(url)
            time.sleep(args.window)
            # backends report their counts every few hundred ms while active, and at exit
            time.sleep(1.0)
            x1, c1 = transactions(url), connections(url)
        finally:
            worker.terminate()
            worker.wait(30)
    n = x1 - x0 - OBSERVER_TRANSACTIONS
    print(f"idle default worker: {n} transactions in {args.window:g} s "
          f"({n * 30 / args.window:.1f} per 30 s); connections held: {c0} then {c1}")


if __name__ == "__main__":
    main()
