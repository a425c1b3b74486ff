"""`vidpoll serve`'s webhook endpoint: a valid delivery makes the job due now; nothing else
changes anything."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aiohttp
import psycopg
import pytest

from vidpoll.providers.sume.webhooks import sign
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server
from vidpoll.webhook import MAX_BODY_BYTES

from ..conftest import observe_sleeps

SECRET = "whsec-integration"


@pytest.fixture
async def server(store: PgStore) -> AsyncIterator[str]:
    runner, url = await start_server(make_app(store, SECRET), "127.0.0.1", 0)
    yield url
    await runner.cleanup()


async def deliver(url: str, payload: object, *, event_id: str = "evt_1",
                  secret: str = SECRET, ts: float | None = None,
                  raw: bytes | None = None) -> tuple[int, dict[str, object]]:
    body = raw if raw is not None else json.dumps(payload).encode()
    stamp = f"{time.time() if ts is None else ts:.0f}"
    async with aiohttp.ClientSession() as http, http.post(
            f"{url}/webhooks/sume", data=body,
            headers={"X-Sume-Timestamp": stamp, "X-Sume-Signature": sign(secret, stamp, body),
                     "X-Sume-Event-Id": event_id, "Content-Type": "application/json"}) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if text.startswith("{") else {"text": text}


async def due_in_s(store: PgStore, job_id: str) -> float:
    row = await store.get_job(job_id)
    assert row is not None
    return float((row["next_poll_at"] - datetime.now(UTC)).total_seconds())


async def test_a_valid_webhook_gets_the_job_read_at_once(store, fake, server, make_worker):
    fake.add_job("vid_1", script=[{"sume_status": "completed", "terminal": True}])
    await store.add_job("vid_1", delay_s=3600)  # next read an hour away
    worker = make_worker(idle_max_s=30.0)
    sleeps = observe_sleeps(worker)
    task = asyncio.create_task(worker.run())
    try:
        # idle and listening, asleep for its whole idle cap (the row is an hour away)
        await worker.signals.wait_for(
            lambda: worker.listening and worker.idle and sleeps.asleep
            and sleeps.asked[-1] == 30.0 and not worker._wake.is_set(), 10)
        idle_sleep = len(sleeps.asked) - 1
        status, answer = await deliver(server, {"type": "avatar_video.ready",
                                                "data": {"job_id": "vid_1",
                                                         "status": "failed"}})
        assert (status, answer) == (200, {"status": "poked", "made_due": True})
        # a third of the idle cap, for what takes milliseconds (a NOTIFY, a claim, a read);
        # that it is quick on a quiet machine is the benchmarks' business, not this test's
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 10)
    finally:
        worker.stop()
        await task
    assert sleeps.ended[idle_sleep] == "woken"  # the poke's NOTIFY, not the idle cap
    row = await store.get_job("vid_1")
    # the state is what polling read, never what the webhook body claimed
    assert row is not None and row["state"] == "completed"


async def test_forged_stale_and_replayed_deliveries_change_nothing(store, server):
    statuses: list[str] = []
    await store.add_job("vid_1", delay_s=3600)
    before = (await store.get_job("vid_1"))["next_poll_at"]
    payload = {"job_id": "vid_1"}
    assert (await deliver(server, payload, secret="not-the-secret"))[0] == 401
    assert (await deliver(server, payload, ts=time.time() - 3600))[0] == 401
    async with aiohttp.ClientSession() as http, http.post(
            f"{server}/webhooks/sume", json=payload) as resp:
        assert resp.status == 401  # unsigned
    assert (await store.get_job("vid_1"))["next_poll_at"] == before  # untouched
    assert (await deliver(server, payload, event_id="evt_9"))[1]["status"] == "poked"
    await store.add_job("vid_2", delay_s=3600)
    # the same event again (Sume retries deliveries): recognised, nothing done
    status, answer = await deliver(server, {"job_id": "vid_2"}, event_id="evt_9")
    assert (status, answer) == (200, {"status": "duplicate"})
    assert await due_in_s(store, "vid_2") > 3500
    # a captured delivery resent under a new event id (the id is not signed): still a repeat
    body = json.dumps({"job_id": "vid_2"}).encode()
    stamp = f"{time.time():.0f}"
    headers = {"X-Sume-Timestamp": stamp, "X-Sume-Signature": sign(SECRET, stamp, body),
               "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        for event_id in ("evt_a", "evt_b"):
            async with http.post(f"{server}/webhooks/sume", data=body,
                                 headers={**headers, "X-Sume-Event-Id": event_id}) as resp:
                statuses.append((await resp.json())["status"])
    assert statuses == ["poked", "duplicate"]


async def test_unknown_finished_and_claimed_jobs(store, server, db_url):
    from vidpoll.models import Outcome

    assert (await deliver(server, {"job_id": "nope"}, event_id="e1"))[1] == {
        "status": "unknown", "made_due": False}
    await store.add_job("busy", delay_s=0)
    [job] = await store.claim(1, 30, "w")
    lease_end = (await store.get_job("busy"))["next_poll_at"]
    status, answer = await deliver(server, {"job_id": "busy"}, event_id="e2")
    assert (status, answer) == (200, {"status": "poked", "made_due": False})
    # the lease stands: no second read at once
    assert (await store.get_job("busy"))["next_poll_at"] == lease_end
    # the read in flight answers "running, look again in an hour": the poke wins, due now
    await store.record([Outcome("busy", job.claim_token, "pending", 3600, True)])
    assert await due_in_s(store, "busy") <= 0.5
    await store.add_job("done", delay_s=3600)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id = 'done'")
    assert (await deliver(server, {"job_id": "done"}, event_id="e3"))[1] == {
        "status": "finished", "made_due": False}


async def test_bad_bodies_and_sizes(store, server):
    assert (await deliver(server, None, raw=b"not json", event_id="e1"))[0] == 400
    async with aiohttp.ClientSession() as http, http.post(
            f"{server}/webhooks/sume", data=b"{}",
            headers={"X-Sume-Timestamp": f"{time.time():.0f}",
                     "X-Sume-Signature": "v1=\u00e9t\u00e9".encode().decode("latin-1"),
                     "X-Sume-Event-Id": "e9"}) as resp:
        assert resp.status == 401  # garbage, even non-ASCII, is a refusal, not a 500
    assert (await deliver(server, {"job_id": "x"}, event_id=""))[0] == 400
    big = b'{"job_id": "x", "pad": "' + b"a" * MAX_BODY_BYTES + b'"}'
    assert (await deliver(server, None, raw=big, event_id="e3"))[0] == 413


async def test_without_a_secret_the_endpoint_refuses(store):
    runner, url = await start_server(make_app(store, None), "127.0.0.1", 0)
    try:
        status, _ = await deliver(url, {"job_id": "x"})
        async with aiohttp.ClientSession() as http, http.get(f"{url}/readyz") as resp:
            ready = resp.status
    finally:
        await runner.cleanup()
    assert status == 503 and ready == 200




async def test_the_fake_sumes_own_webhook_gets_a_job_read_at_once(store, fake, server,
                                                                 make_worker):
    fake.config.webhook_url = f"{server}/webhooks/sume"
    fake.config.webhook_secret = SECRET
    worker = make_worker(idle_max_s=30.0)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.listening and worker.idle, 10)
        job_id = fake.add_job(render_s=0.2, queued_s=0.0, outcome="failed")
        await store.add_job(job_id, delay_s=3600)  # without the webhook: read in an hour
        # the webhook fires 0.2 s from now; a read an hour early can only be its doing
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 15)
    finally:
        worker.stop()
        await task
    row = await store.get_job(job_id)
    assert row is not None and row["state"] == "failed" and fake.webhooks_sent[200] == 1
    assert row["polls"] == 1  # one read, the one the webhook asked for
