"""A PostgreSQL restart mid-run: the worker reconnects with backoff and loses no row.

Uses a private embedded server (never the shared one), so restarting it disturbs nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from vidpoll.models import ClaimMode
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore, migrate
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY
from ..private_pg import PrivateServer

pytestmark = pytest.mark.slow


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    server = PrivateServer()
    yield server
    server.close()


@pytest.mark.parametrize("mode", [ClaimMode.LEASE, ClaimMode.LOCK])
async def test_worker_survives_postgres_restart(private_server, fake: FakeSume, fake_url, mode,
                                                caplog):
    url = private_server.url()
    await migrate(url)
    # a short pool timeout, so the outage surfaces as errors instead of long waits
    store = await PgStore.open(url, max_size=4, timeout_s=0.5)
    caplog.set_level(logging.INFO)
    n = 40
    # "running" until the test says otherwise: the worker cannot finish before the restart,
    # however slow the machine makes the restart itself
    running = [{"sume_status": "running", "terminal": False, "next_poll_after_seconds": 0.1}]
    for i in range(n):
        fake.add_job(f"r{i}", script=list(running))
        await store.add_job(f"r{i}", delay_s=0)
    fake.config.latency_s = 0.05
    try:
        async with SumeClient(fake_url, API_KEY, timeout_s=2) as client:
            worker = Worker(store, client, WorkerConfig(
                claim_mode=mode, concurrency=20, drain=True, lease_s=3, policy=FAST_POLICY))
            task = asyncio.create_task(worker.run())
            await worker.signals.wait_for(lambda: worker.stats.recorded >= 20, 20)
            await asyncio.to_thread(private_server.restart, 2.0)
            for i in range(n):  # back up: now every job ends at its next read
                fake.jobs[f"r{i}"].script = [{"sume_status": "completed", "terminal": True}]
            await asyncio.wait_for(task, 60)
        assert await store.counts() == {"completed": n}
    finally:
        await store.close()
    assert worker.stats.db_errors > 0, "the restart should have been noticed"
    assert "database unavailable" in caplog.text
    assert "database reachable again" in caplog.text
