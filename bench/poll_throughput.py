"""Status reads per second of one vidpoll worker process against the fake Sume.

The fake runs in its own process (as a real provider would), with a fixed latency; a backlog
of long-running jobs (next_poll_after_seconds 1) keeps the worker busy. Prints one JSON line.

    .venv/bin/python bench/poll_throughput.py --jobs 3000 --latency-ms 100 --concurrency 200

Issue #7 turns this into the side-by-side benchmark suite; this script is the one figure the
core issue reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request

from scratch_db import scratch_database

from vidpoll.models import ClaimMode
from vidpoll.providers.sume.client import SumeClient
from vidpoll.store import PgStore, migrate
from vidpoll.worker import Worker, WorkerConfig

KEY = "sk-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--latency-ms", type=float, default=100)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--claim", default="lease", choices=["lease", "lock"])
    p.add_argument("--db-connections", type=int, default=4)
    args = p.parse_args()

    with scratch_database() as url:
        run(url, args)


def run(url: str, args: argparse.Namespace) -> None:
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "vidpoll.cli", "fake-sume", "--port",
                             str(port), "--api-key", KEY, "--latency-ms", str(args.latency_ms),
                             "--latency-jitter", "0.3", "--render-seconds", "100000",
                             "--next-poll-after", "1", "--auto-create"],
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{base}/_fake/stats", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        result = asyncio.run(measure(url, base, args))
        stats = json.loads(urllib.request.urlopen(f"{base}/_fake/stats").read())
        result["overlapping_reads"] = stats["overlaps"]
        print(json.dumps(result))
    finally:
        fake.terminate()
        fake.wait(10)


async def measure(url: str, base: str, args: argparse.Namespace) -> dict[str, object]:
    """Load the backlog, run one worker, count reads over a window after a warm-up."""
    await migrate(url)
    store = await PgStore.open(url, max_size=args.db_connections)
    async with store._pool.connection() as conn:  # bulk load the backlog
        await conn.execute("INSERT INTO video_jobs (job_id, next_poll_at) "
                           "SELECT 'b' || g, now() FROM generate_series(1, %s) g",
                           (args.jobs,))
    async with SumeClient(base, KEY, max_connections=args.concurrency) as client:
        worker = Worker(store, client, WorkerConfig(
            concurrency=args.concurrency, claim_mode=ClaimMode(args.claim),
            batch_size=100, lock_lanes=args.db_connections - 1, lease_s=25))
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(3)  # warm-up
        r0, t0 = worker.stats.reads, time.monotonic()
        await asyncio.sleep(args.seconds)
        r1, t1 = worker.stats.reads, time.monotonic()
        worker.stop()
        await task
    await store.close()
    rate = (r1 - r0) / (t1 - t0)
    ideal = args.concurrency / (args.latency_ms / 1000)
    return {"claim": args.claim, "jobs": args.jobs, "latency_ms": args.latency_ms,
            "concurrency": args.concurrency, "db_connections": args.db_connections,
            "reads_per_s": round(rate, 1), "ideal_reads_per_s": round(ideal, 1),
            "share_of_ideal": round(rate / ideal, 3), "fenced_out": worker.stats.fenced_out}


if __name__ == "__main__":
    main()
