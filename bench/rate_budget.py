"""The fleet-wide rate budget: three worker processes against the fake Sume's own limits.

The fake runs in this process (it logs every status read with its key and answer); the
workers are `vidpoll worker --poll-only` processes. A backlog of never-ending jobs, due again
50 ms after each read, keeps demand far above any budget. Reads are counted over
`--seconds` after a warm-up. Prints one JSON line per scenario:

    .venv/bin/python bench/rate_budget.py --seconds 30 [--burst 40] [--latency-ms 0]

- `match`: the server allows R reads/s per key, the fleet's budget is R.
- `lower`: the server allows 10/s, the fleet is configured for 25/s.
- `accounts`: two accounts (keys) with budgets and server limits of 8/s and 24/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

from scratch_db import scratch_database

from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.store import PgStore, migrate

KEYS = {"default": "sk-bench-default", "acme": "sk-bench-acme"}


async def scenario(url: str, name: str, seconds: float, warmup_s: float, burst: float,
                   latency_s: float) -> dict[str, object]:
    await migrate(url)
    server = {"match": {KEYS["default"]: 20.0}, "lower": {KEYS["default"]: 10.0},
              "accounts": {KEYS["default"]: 8.0, KEYS["acme"]: 24.0}}[name]
    budget = {"match": "1200", "lower": "1500", "accounts": "480"}[name]
    fake = FakeSume(FakeConfig(api_key=KEYS["default"], extra_api_keys=[KEYS["acme"]],
                               read_rate_by_key=server, read_rate_per_s=1e9, read_burst=burst,
                               latency_s=latency_s, next_poll_after_s=0.05))
    runner, base = await start_fake(fake)
    store = await PgStore.open(url)
    accounts = ["default", "acme"] if name == "accounts" else ["default"]
    try:
        for account in accounts:
            for i in range(600):
                job_id = f"{account}-{i}"
                fake.add_job(job_id, render_s=10**6)
                await store.add_job(job_id, delay_s=0, account=account)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
        env.update(DATABASE_URL=url, SUME_BASE_URL=base, SUME_API_KEY=KEYS["default"],
                   VIDPOLL_STATUS_RATE_PER_MIN=budget, VIDPOLL_MIN_POLL_S="0.05",
                   VIDPOLL_RATE_BURST=str(burst))
        if name == "accounts":
            env.update(SUME_API_KEY_ACME=KEYS["acme"], VIDPOLL_STATUS_RATE_PER_MIN_ACME="1440")
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vidpoll.cli", "--log-level", "WARNING", "worker",
            "--poll-only", "--concurrency", "20", env=env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL) for _ in range(3)]
        loop = asyncio.get_running_loop()
        await asyncio.sleep(warmup_s)
        start = loop.time()
        await asyncio.sleep(seconds)
        end = loop.time()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            await proc.wait()
        buckets = await store.buckets()
    finally:
        await store.close()
        await runner.cleanup()
    result: dict[str, object] = {"scenario": name, "seconds": round(end - start, 1),
                                 "burst": burst, "latency_ms": latency_s * 1000}
    for account in accounts:
        key = KEYS[account]
        calls = [st for t, k, st in fake.read_log if start <= t < end and k == key]
        limited = sum(1 for st in calls if st == 429)
        ok = len(calls) - limited
        per_s = ok / (end - start)
        budget_per_s = (1440 if account == "acme" else int(budget)) / 60
        result[account] = {
            "server_limit_per_s": server[key], "budget_per_s": budget_per_s,
            "useful_reads_per_s": round(per_s, 2),
            "throughput_over_limit": round(per_s / min(server[key], budget_per_s), 3),
            "share_429": round(limited / max(1, len(calls)), 4),
            "429s_in_warmup": sum(1 for t, k, st in fake.read_log
                                  if t < start and k == key and st == 429)}
    result["buckets"] = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in b.items()}
                         for b in buckets]
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--burst", type=float, default=40.0,
                   help="tokens of both the server's bucket and the fleet's")
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--scenario", action="append",
                   choices=["match", "lower", "accounts"])
    args = p.parse_args()
    for name in args.scenario or ["match", "lower", "accounts"]:
        with scratch_database() as url:
            figures = asyncio.run(scenario(url, name, args.seconds, args.warmup, args.burst,
                                           args.latency_ms / 1000))
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
