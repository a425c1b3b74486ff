"""arq (Redis) as the poller (scenario 3 of bench/peers.py): every poll is a job; when it runs it
reads its Sume job's status once and enqueues its successor `next_poll_after_seconds` later
(`_defer_by`), unless the answer is terminal.

    python bench/peer_arq.py load JOBS SETTINGS     # enqueue b1..bJOBS, due now
    python bench/peer_arq.py work SETTINGS          # the worker (SETTINGS: JSON), until SIGTERM
    python bench/peer_arq.py clean SETTINGS         # delete every key of this run's queue

Every key this run makes carries SETTINGS["queue_name"] (a fresh name per run), so `clean`
deletes only those. SUME_BASE_URL and SUME_API_KEY come from the environment.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from datetime import timedelta
from typing import Any

from arq import Worker, create_pool, func
from arq.connections import ArqRedis, RedisSettings
from peer_http import open_session, read_status


def job_id(queue: str, sume_job_id: str) -> str:
    """arq's own uniqueness key for one poll, prefixed so `clean` finds every key of a run."""
    return f"{queue}:{sume_job_id}:{uuid.uuid4().hex}"


async def poll(ctx: dict[str, Any], sume_job_id: str) -> None:
    delay = await read_status(ctx["http"], sume_job_id)
    if delay is not None:
        queue = ctx["queue_name"]
        await ctx["redis"].enqueue_job("poll", sume_job_id, _job_id=job_id(queue, sume_job_id),
                                       _queue_name=queue, _defer_by=timedelta(seconds=delay))


async def load(jobs: int, settings: dict[str, Any]) -> None:
    """arq has no batch enqueue: one `enqueue_job` per job, all due now (not timed)."""
    queue = settings["queue_name"]
    redis: ArqRedis = await create_pool(RedisSettings.from_dsn(settings["redis_url"]))
    try:
        for n in range(1, jobs + 1):
            await redis.enqueue_job("poll", f"b{n}", _job_id=job_id(queue, f"b{n}"),
                                    _queue_name=queue)
    finally:
        await redis.aclose()


async def clean(settings: dict[str, Any]) -> None:
    redis: ArqRedis = await create_pool(RedisSettings.from_dsn(settings["redis_url"]))
    try:
        keys = [k async for k in redis.scan_iter(match=f"*{settings['queue_name']}*", count=1000)]
        for start in range(0, len(keys), 1000):
            await redis.delete(*keys[start:start + 1000])
    finally:
        await redis.aclose()


def work(settings: dict[str, Any]) -> None:
    async def startup(ctx: dict[str, Any]) -> None:
        ctx["http"] = open_session(settings["max_jobs"])
        ctx["queue_name"] = settings["queue_name"]

    async def shutdown(ctx: dict[str, Any]) -> None:
        await ctx["http"].close()

    # handle_signals (the default): SIGINT/SIGTERM cancel running jobs and stop the worker
    Worker([func(poll, name="poll")], queue_name=settings["queue_name"],
           redis_settings=RedisSettings.from_dsn(settings["redis_url"]),
           on_startup=startup, on_shutdown=shutdown, max_jobs=settings["max_jobs"],
           poll_delay=settings["poll_delay_s"], keep_result=settings["keep_result_s"]).run()


def main() -> None:
    if sys.argv[1] == "load":
        asyncio.run(load(int(sys.argv[2]), json.loads(sys.argv[3])))
    elif sys.argv[1] == "clean":
        asyncio.run(clean(json.loads(sys.argv[2])))
    else:
        work(json.loads(sys.argv[2]))


if __name__ == "__main__":
    main()
