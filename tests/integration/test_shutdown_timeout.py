"""Issue 16 item 6, the poller's and submitter's side: after SIGTERM a worker exits within
--shutdown-timeout even when its HTTP calls would outlast it. Reads still in flight are
stopped, nothing recorded, their rows left to their leases (an answer with a hint may have
been on its way); POSTs still in flight are abandoned to their leases and come back as
unknown outcomes, sent again with the same key: billed once. (The deliverer's side:
test_shutdown_grace.py.)"""

from __future__ import annotations

import asyncio
import signal

import pytest

from ..conftest import run_until
from .test_process import cli_env, seed_jobs, spawn_worker, wait_for

pytestmark = pytest.mark.slow


async def test_sigterm_exits_within_the_shutdown_timeout_and_hands_reads_back(
        store, fake, fake_url, db_url, make_submitter):
    ids = await seed_jobs(store, fake, 5)
    await store.add_intent("slow-post", {"prompt": "a fox"})
    fake.config.latency_s = 60.0  # every read and POST hangs far past the timeout below
    # HTTP timeout 5 s: without the shutdown timeout (1.5 s; its calls are stopped 0.3 s
    # before it ends) the process would wait for its calls' own timeouts and record five
    # timed-out reads as errors
    env = cli_env(db_url, fake_url, VIDPOLL_HTTP_TIMEOUT="5")
    proc = await spawn_worker(env, "--shutdown-timeout", "1.5", "--lease-seconds", "6.5",
                              "--concurrency", "10")
    try:
        await wait_for(lambda: all(fake.in_flight.get(i) for i in ids)
                       and fake.posts_by_key.get("slow-post"), 30,
                       "every read and the POST should be in flight")
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):  # generous: the subject is what it left behind
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    assert proc.returncode == 0, text[-2000:]
    assert "5 reads still in flight at the shutdown timeout" in text, text[-2000:]
    assert "1 POSTs still in flight at the shutdown timeout" in text, text[-2000:]
    for job_id in ids:  # stopped, nothing recorded: not a timeout, still under its lease
        row = await store.get_job(job_id)
        assert row["state"] == "pending" and row["claim_token"] is not None, row
        assert row["consecutive_errors"] == 0 and row["polls"] == 0, row
        assert row["next_poll_at"] > row["claimed_at"], row  # the lease is the schedule
    intent = await store.get_intent("slow-post")
    assert intent is not None and intent.attempts == 1 and intent.job_id is None
    # the abandoned POST reached Sume (it may have billed): once its lease ends, the intent
    # is sent again with the same key and Sume answers with the one job it made
    fake.config.latency_s = 0.0
    billed_before = fake.billed_by_key["slow-post"]
    sub = make_submitter(lease_s=5.0, idle_max_s=0.5)
    await run_until(sub, lambda: sub.stats.submitted == 1, within_s=60)
    done = await store.get_intent("slow-post")
    assert done is not None and done.job_id is not None
    assert fake.billed_by_key["slow-post"] == max(1, billed_before)  # billed once
