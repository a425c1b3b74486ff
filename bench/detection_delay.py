"""How soon after a render ends does vidpoll know? Polling alone vs polling + webhooks.

The fake Sume (in this process) hints `next_poll_after_seconds` 15, as a real provider does for
video; jobs end 2-8 s after creation. One worker polls; in the second run `vidpoll serve`'s
webhook endpoint (same process) receives the fake's signed deliveries. The delay of a job is
`finished_at` (when vidpoll committed the final state) minus the moment the fake's job ended;
the hook delay is when a completion hook (`--on-terminal`, run by a Deliverer beside the worker)
was called, minus the same moment: what an application waits, result fetch included.
Prints one JSON line per run:

    .venv/bin/python bench/detection_delay.py --jobs 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from scratch_db import scratch_database

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.models import Job
from vidpoll.policy import PollPolicy
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.store import PgStore, migrate
from vidpoll.web import make_app, start_server
from vidpoll.worker import Worker, WorkerConfig

KEY, SECRET = "sk-bench", "whsec-bench"


async def run(url: str, n: int, webhooks: bool) -> dict[str, object]:
    await migrate(url)
    store = await PgStore.open(url, max_size=6)
    runner, hook_url = await start_server(make_app(store, SECRET), "127.0.0.1", 0)
    fake = FakeSume(FakeConfig(api_key=KEY, queued_s=0.0, render_s=5.0, render_jitter=0.6,
                               next_poll_after_s=15.0, seed=1,
                               webhook_url=f"{hook_url}/webhooks/sume" if webhooks else None,
                               webhook_secret=SECRET))
    fake_runner, base = await start_fake(fake)
    try:
        async with SumeClient(base, KEY, timeout_s=5) as client:
            worker = Worker(store, client, WorkerConfig(concurrency=50, drain=True,
                                                        policy=PollPolicy()))
            called: dict[str, float] = {}

            async def hook(job: Job) -> None:
                called.setdefault(job.job_id, time.time())

            deliverer = Deliverer(store, DeliveryConfig(hooks={"bench:hook": hook},
                                                        drain=True))
            delivering = asyncio.create_task(deliverer.run())
            await deliverer.signals.wait_for(lambda: deliverer.idle, 10)  # registered
            for _ in range(n):
                job_id = fake.add_job()
                await store.add_job(job_id, delay_s=15.0)  # the seed's first read: 15 s
            await asyncio.wait_for(worker.run(), 600)
            deliverer.producers_done.set()
            await asyncio.wait_for(delivering, 600)
        delays, hook_delays = [], []
        for job_id, ended in fake.terminal_at.items():
            row = await store.get_job(job_id)
            assert row is not None and row["finished_at"] is not None
            delays.append(row["finished_at"].timestamp() - ended)
            hook_delays.append(called[job_id] - ended)
        reads = sum(fake.reads.values())
    finally:
        await fake_runner.cleanup()
        await runner.cleanup()
        await store.close()
    delays.sort()
    hook_delays.sort()
    return {"webhooks": webhooks, "jobs": n, "reads": reads,
            "reads_per_job": round(reads / n, 2),
            "delay_p50_s": round(statistics.median(delays), 3),
            "delay_p95_s": round(delays[int(0.95 * (len(delays) - 1))], 3),
            "delay_max_s": round(delays[-1], 3),
            "hook_delay_p50_s": round(statistics.median(hook_delays), 3),
            "hook_delay_p95_s": round(hook_delays[int(0.95 * (len(hook_delays) - 1))], 3),
            "webhooks_answered": dict(fake.webhooks_sent)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=200)
    args = p.parse_args()
    for webhooks in (False, True):
        with scratch_database() as url:
            figures = asyncio.run(run(url, args.jobs, webhooks))
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
