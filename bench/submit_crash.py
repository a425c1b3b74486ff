"""Clips billed per intent when submitter processes are killed -9 at random moments.

The fake Sume runs in this process (so it can count clips billed per key); `vidpoll worker
--submit-only` runs as real processes, two at a time, each killed -9 after a random 0.3-1.5 s,
while the fake loses replies after billing, answers 5xx after billing, 5xx before billing and
429. A last pair of workers drains the queue. Prints one JSON line:

    .venv/bin/python bench/submit_crash.py --intents 300 --rounds 10 --seed 1

`billed_unrecorded_after_kill` counts, right after each kill (summed over the kills, so a key
can count more than once), the keys Sume had billed whose intent was not marked submitted:
renders the database did not know about yet, from a lost reply, a 5xx sent after billing, or
a kill between the POST and the commit. Each of them must still end as exactly one clip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys

from scratch_db import scratch_database

from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.store import PgStore, migrate

KEY = "sk-bench"


async def spawn(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidpoll.cli", "--log-level", "WARNING", "worker",
        "--submit-only", "--lease-seconds", "2", "--submit-concurrency", "8",
        "--max-active", "100000", *args, env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)


async def run(args: argparse.Namespace, url: str) -> dict[str, object]:
    await migrate(url)
    fake = FakeSume(FakeConfig(api_key=KEY, latency_s=0.05, latency_jitter=0.5, hang_s=3.0,
                               create_lose_reply=0.15, create_5xx_billed=0.15,
                               create_fail_5xx=0.1, create_rate_429=0.1, retry_after_s=0.2,
                               seed=args.seed))
    runner, base = await start_fake(fake)
    store = await PgStore.open(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(DATABASE_URL=url, SUME_BASE_URL=base, SUME_API_KEY=KEY, VIDPOLL_HTTP_TIMEOUT="1",
               VIDPOLL_MIN_POLL_S="0.05", VIDPOLL_BACKOFF_MAX_S="1")
    rng = random.Random(args.seed)
    keys = [f"crash-{i:05d}" for i in range(args.intents)]
    unrecorded = 0
    try:
        for key in keys:
            await store.add_intent(key, {"prompt": f"clip {key}"})
        for _ in range(args.rounds):
            procs = [await spawn(env) for _ in range(2)]
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            for proc in procs:
                proc.kill()
                await proc.wait()
            for key in keys:
                if fake.billed_by_key[key]:
                    intent = await store.get_intent(key)
                    unrecorded += intent is not None and intent.state != "submitted"
        procs = [await spawn(env, "--drain") for _ in range(2)]
        for proc in procs:
            await asyncio.wait_for(proc.wait(), 600)
        states = await store.intent_counts()
        jobs = sum((await store.counts()).values())
    finally:
        await store.close()
        await runner.cleanup()
    return {"intents": args.intents, "kills": 2 * args.rounds,
            "billed_unrecorded_after_kill": unrecorded,
            "posts": sum(fake.posts_by_key.values()), "clips_billed": fake.billed,
            "clips_billed_per_intent": round(fake.billed / args.intents, 4),
            "keys_billed_twice": sum(1 for k in keys if fake.billed_by_key[k] > 1),
            "overlapping_posts_of_one_key": fake.create_overlaps, "job_rows": jobs,
            "intent_states": states, "seed": args.seed}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--intents", type=int, default=300)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    with scratch_database() as url:
        figures = asyncio.run(run(args, url))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
