"""pgqueuer as the poller (scenario 3 of bench/peers.py): every poll is a job; when it runs it
reads its Sume job's status once and enqueues its successor `next_poll_after_seconds` later
(`execute_after`), unless the answer is terminal.

    python bench/peer_pgqueuer.py load JOBS         # install the schema, enqueue b1..bJOBS now
    python bench/peer_pgqueuer.py work SETTINGS     # the worker (SETTINGS: JSON), until SIGTERM

DATABASE_URL, SUME_BASE_URL and SUME_API_KEY come from the environment.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg
import pgqueuer
import uvloop
from peer_http import open_session, read_status
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from psycopg.conninfo import conninfo_to_dict

ENTRYPOINT = "poll"


def connect_args() -> dict[str, Any]:
    """asyncpg's arguments for DATABASE_URL (a URL or a libpq key=value string)."""
    info = conninfo_to_dict(os.environ["DATABASE_URL"])
    args = {"host": info.get("host"), "port": info.get("port"), "user": info.get("user"),
            "password": info.get("password"), "database": info.get("dbname")}
    return {k: v for k, v in args.items() if v is not None}


async def load(jobs: int) -> None:
    """Install pgqueuer's schema once (`pgq install` + `pgq autovac`), empty the queue and its
    log, and enqueue the backlog in one batch `enqueue`, all due now."""
    conn = await asyncpg.connect(**connect_args())
    try:
        queries = Queries(AsyncpgDriver(conn))
        if not await queries.has_table(queries.qbe.settings.queue_table):
            await queries.install()
            await queries.optimize_autovacuum()
        await queries.clear_queue()
        await queries.clear_queue_log()
        await queries.clear_statistics_log()
        await queries.enqueue([ENTRYPOINT] * jobs,
                              [f"b{n}".encode() for n in range(1, jobs + 1)], [0] * jobs)
        await conn.execute(f"VACUUM ANALYZE {queries.qbe.settings.queue_table}")
    finally:
        await conn.close()


@asynccontextmanager
async def worker(settings: dict[str, Any]) -> AsyncIterator[PgQueuer]:
    """The factory `pgq run` takes: a dedicated connection for the QueueManager, a pool for the
    re-enqueues (the producer side), one HTTP session."""
    conn = await asyncpg.connect(**connect_args())
    pool = await asyncpg.create_pool(**connect_args(), min_size=settings["producer_pool_size"],
                                     max_size=settings["producer_pool_size"])
    producer = Queries(AsyncpgPoolDriver(pool))
    try:
        async with open_session(settings["max_concurrent_tasks"]) as http:
            pgq = PgQueuer.from_asyncpg_connection(conn)

            @pgq.entrypoint(ENTRYPOINT)
            async def poll(job: Job) -> None:
                assert job.payload is not None
                delay = await read_status(http, job.payload.decode())
                if delay is not None:
                    await producer.enqueue(ENTRYPOINT, job.payload,
                                           execute_after=timedelta(seconds=delay))

            yield pgq
    finally:
        await pool.close()
        await conn.close()


def main() -> None:
    if sys.argv[1] == "load":
        uvloop.run(load(int(sys.argv[2])))
        return
    settings = json.loads(sys.argv[2])
    # what `pgq run` does: uvloop, SIGINT/SIGTERM stop the worker gracefully
    uvloop.run(pgqueuer.run(lambda: worker(settings), batch_size=settings["batch_size"],
                            max_concurrent_tasks=settings["max_concurrent_tasks"],
                            dequeue_timeout=timedelta(seconds=settings["dequeue_timeout_s"])))


if __name__ == "__main__":
    main()
