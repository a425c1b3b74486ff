"""Where a saturated worker's CPU goes (issue 31, item 5): a `vidpoll worker` polling 5,000
due rows against a fake Sume that answers at once, sampled by py-spy, its samples split by
what each one was doing. py-spy is not a project dependency: install it anywhere and name it.

    DATABASE_URL=... .venv/bin/python bench/profile_worker.py --py-spy /path/to/py-spy \\
        [--loop asyncio|uvloop] [--seconds 15] [--raw OUT.txt] [--worker-arg=--batch-size=200]

Every sample is put in the first category whose module appears in its stack, from the leaf up
(so a psycopg call made from the worker counts as psycopg, and the worker's own frames only
what they do themselves); `--by-function` also lists the functions most often on top. One JSON
line: the share of samples per category.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scratch_db import scratch_database
from suite import DB_CONNECTIONS, env_for, fake_sume, load_backlog, stop

from vidpoll.store import migrate

# (category, path fragments): the first match from the leaf up names the sample
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("psycopg", ("(psycopg/", "(psycopg_pool/", "(psycopg_binary/")),
    ("prometheus_client", ("(prometheus_client/",)),
    ("json", ("(json/",)),
    ("logging", ("(logging/",)),
    ("aiohttp (client, parser, connector)", ("(aiohttp/", "(yarl/", "(multidict/",
                                            "(aiohappyeyeballs/", "(propcache/")),
    ("vidpoll.providers (client, rules)", ("(vidpoll/providers/",)),
    ("vidpoll.policy (decide)", ("(vidpoll/policy.py",)),
    ("vidpoll.metrics", ("(vidpoll/metrics.py",)),
    ("vidpoll.store (own)", ("(vidpoll/store/",)),
    ("vidpoll.worker (own)", ("(vidpoll/worker.py",)),
    ("vidpoll.runner (own)", ("(vidpoll/runner.py",)),
    ("vidpoll (other)", ("(vidpoll/",)),
    ("dataclasses, datetime, uuid", ("(dataclasses.py", "(<string>", "(datetime.py",
                                     "(uuid.py")),
    ("asyncio and the loop", ("(asyncio/", "uvloop", "(selectors.py")),
]
INCLUSIVE = ("Worker._read_leased", "Worker._read ", "JsonApiClient._call",
             "ClientSession._request", "decide ", "observe_poll", "Worker._writer",
             "PgJobs.record", "PgJobs.claim", "_outcome_params", "Worker._main_loop",
             "Worker._claim_and_dispatch", "replace ", "Runner._spawn", "IN_FLIGHT",
             "Minutes.add", "utc_now", "take_budget", "settle_budget", "read_status",
             "AsyncConnectionPool.getconn", "AsyncConnectionPool.putconn", "_IdleCheck",
             "Signals.pulse", "ResultFetcher", "_note_server_pause", "_lease_fits_a_read",
             "late_at_read", "_flush_minutes", "_minutes_flusher", "Worker._costed",
             "scrub", "Gauge.inc", "Gauge.dec", "Histogram.observe", "Counter.inc")


def categorize(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):  # leaf first
        for name, parts in CATEGORIES:
            if any(part in frame for part in parts):
                return name
    return "other"


def analyse(raw: Path, top: int) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, n_text = line.rpartition(" ")
        if not stack or not n_text.isdigit():
            continue
        n = int(n_text)
        leaf = stack.rsplit(";", 1)[-1]
        if leaf.startswith(("EpollSelector.select", "select (selectors")) or "(idle)" in leaf:
            idle += n  # waiting for I/O: no CPU
            continue
        total += n
        counts[categorize(stack)] += n
        leaves[leaf] += n
        for name in INCLUSIVE:
            if name in stack:
                inclusive[name.strip()] += n
    return {"busy_samples": total, "idle_samples": idle,
            "share_of_busy": {k: round(v / total, 3) for k, v in counts.most_common()},
            "inclusive_share_of_busy": {k: round(v / total, 3)
                                        for k, v in inclusive.most_common()},
            "top_functions": [[f, round(n / total, 3)] for f, n in leaves.most_common(top)]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--py-spy", required=True)
    p.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--rate", type=int, default=200)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--raw", type=Path, help="Keep py-spy's collapsed stacks here.")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="One more `vidpoll worker` argument (repeatable: --worker-arg=--x=1).")
    p.add_argument("--analyse", type=Path, help="Only analyse collapsed stacks kept before.")
    args = p.parse_args()
    if args.analyse:
        print(json.dumps(analyse(args.analyse, args.top)))
        return
    raw = args.raw or Path(tempfile.mkstemp(suffix=".txt")[1])
    with scratch_database() as url:
        asyncio.run(migrate(url))
        with fake_sume(0, jitter=0) as base:
            load_backlog(url, args.jobs)
            env = env_for(url, base)
            env["VIDPOLL_EVENT_LOOP"] = args.loop
            worker = subprocess.Popen(
                [sys.executable, "-m", "vidpoll.cli", "--log-level", "WARNING", "worker",
                 "--poll-only", "--no-fetch-results", "--concurrency", "200",
                 "--db-connections", str(DB_CONNECTIONS), *args.worker_arg], env=env,
                stderr=subprocess.DEVNULL)
            time.sleep(4)
            subprocess.run([args.py_spy, "record", "--pid", str(worker.pid), "-r",
                            str(args.rate), "-d", str(args.seconds), "--format", "raw",
                            "-o", str(raw), "--nonblocking"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            stop([worker])
    result = analyse(raw, args.top)
    result.update(loop=args.loop, seconds=args.seconds, rate=args.rate,
                  load_avg=round(os.getloadavg()[0], 2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
