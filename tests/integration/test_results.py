"""Result fetches after completion: leased, retried on 409 and failures, budgeted, stored."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from vidpoll.models import ClaimedResult
from vidpoll.policy import Budget

from ..conftest import db_now, run_until

DONE = [{"sume_status": "completed", "terminal": True}]


async def test_a_completed_job_gets_its_result_as_served(store, fake, make_worker):
    fake.add_job("j1", script=DONE)
    await store.add_job("j1", delay_s=0)
    worker = make_worker(fetch_results=True, drain=True)
    await asyncio.wait_for(worker.run(), 10)  # drain waits for the result too
    row = await store.get_job("j1")
    assert row is not None and row["result_state"] == "fetched"
    assert row["result"]["job_id"] == "j1" and "sig=" in row["result"]["videos"][0]["url"]
    assert worker.stats.results_fetched == 1


async def test_409_not_completed_is_retried_until_ready(store, fake, make_worker):
    # the result lags the status: 409 job_not_completed until the test lets the render end
    fake.add_job("j1", script=DONE, render_s=3600, queued_s=0)
    await store.add_job("j1", delay_s=0)
    worker = make_worker(fetch_results=True)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.stats.result_retries >= 1, 10)
        fake.jobs["j1"].render_s = 0  # rendered: the next fetch gets the result
        await worker.signals.wait_for(lambda: worker.stats.results_fetched == 1, 10)
    finally:
        worker.stop()
        await task
    row = await store.get_job("j1")
    assert row is not None and row["result_state"] == "fetched" and row["result_attempts"] >= 2


async def test_results_are_queued_by_any_worker_and_fetched_by_those_asked_to(
        store, fake, make_worker):
    fake.add_job("f", script=[{"sume_status": "failed", "terminal": True}])
    fake.add_job("c", script=DONE)
    await store.add_job("f", delay_s=0)
    await store.add_job("c", delay_s=0)
    worker = make_worker(drain=True, fetch_results=False)  # --no-fetch-results
    await asyncio.wait_for(worker.run(), 10)
    failed, done = await store.get_job("f"), await store.get_job("c")
    assert failed is not None and failed["result_state"] is None  # nothing to fetch
    assert done is not None and done["result_state"] == "pending"  # queued, not fetched
    fetcher = make_worker(fetch_results=True, drain=True)
    await asyncio.wait_for(fetcher.run(), 10)
    done = await store.get_job("c")
    assert done is not None and done["result_state"] == "fetched"


async def test_a_server_pause_stops_result_fetches_too(store, fake):
    await store.add_job("j1", delay_s=0)
    [job] = await store.claim(1, 5, "w")
    from vidpoll.models import Outcome

    await store.record([Outcome("j1", job.claim_token, "completed", 0, True,
                                outcome="succeeded")])
    await store.pause_bucket("default", "status", 30, refused=True)
    assert await store.claim_results(5, 5, "default") == []


async def test_results_share_the_read_budget(store, fake, make_worker):
    for i in range(12):
        fake.add_job(f"j{i}", script=DONE)
        await store.add_job(f"j{i}", delay_s=0)
    worker = make_worker(fetch_results=True, budgets={"default": Budget(20, 2)})
    loop = asyncio.get_running_loop()
    start = loop.time()
    await run_until(worker, lambda: worker.stats.results_fetched == 12, within_s=15)
    elapsed = loop.time() - start
    calls = len(fake.read_log) + 12  # status reads + result reads
    assert calls <= 1 + 20 * elapsed + 1  # one starting token, then 20 a second


async def test_result_fetches_are_fenced(store, db_url):
    await store.add_job("j1", delay_s=0)
    [job] = await store.claim(1, 5, "w")
    from vidpoll.models import Outcome

    await store.record([Outcome("j1", job.claim_token, "completed", 0, True,
                                outcome="succeeded")])
    t0 = await db_now(db_url)
    [stale] = await store.claim_results(1, 5, "default", now=t0)
    [fresh] = await store.claim_results(1, 5, "default",  # the first lease has ended
                                        now=t0 + timedelta(seconds=6))
    from vidpoll.models import ResultOutcome

    assert not await store.record_result(ResultOutcome("j1", stale.token, "fetched",
                                                       result={"x": 1}))
    assert await store.record_result(ResultOutcome("j1", fresh.token, "fetched",
                                                   result={"x": 2}))
    row = await store.get_job("j1")
    assert row is not None and row["result"] == {"x": 2} and fresh.attempts == 2
    assert isinstance(stale, ClaimedResult)
    assert json.dumps(row["result"])
