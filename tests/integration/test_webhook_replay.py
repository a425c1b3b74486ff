"""A captured webhook delivery re-sent under a new event id (the id is not signed) is a repeat
however its signature header is written: re-spaced, re-ordered, or joined by other `v1=`
values, all of which verify. Real aiohttp route on loopback, real PostgreSQL."""

from __future__ import annotations

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

SECRET = "whsec-replay"


@pytest.fixture
async def server(store: PgStore) -> AsyncIterator[str]:
    runner, url = await start_server(make_app(store, SECRET), "127.0.0.1", 0)
    yield url
    await runner.cleanup()


async def post(url: str, body: bytes, stamp: str, signature: str, event_id: str
               ) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.post(
            f"{url}/webhooks/sume", data=body,
            headers={"X-Sume-Timestamp": stamp, "X-Sume-Signature": signature,
                     "X-Sume-Event-Id": event_id, "Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


async def due_in_s(store: PgStore, job_id: str) -> float:
    row = await store.get_job(job_id)
    assert row is not None
    return float((row["next_poll_at"] - datetime.now(UTC)).total_seconds())


async def push_back(db_url: str, job_id: str) -> None:
    """Make the job due an hour from now again: a poke shows as `due now`."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_jobs SET next_poll_at = now() + interval '1 hour' "
                           "WHERE job_id = %s", (job_id,))


async def events(db_url: str) -> list[tuple[str, str]]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT event_id, signature FROM vidpoll_webhook_events "
                                 "ORDER BY received_at, event_id")
        return [(r[0], r[1]) for r in await cur.fetchall()]


async def test_a_replay_with_a_rewritten_signature_header_is_a_duplicate(store, server,
                                                                        db_url):
    await store.add_job("vid_1", delay_s=3600)
    body = json.dumps({"type": "avatar_video.ready", "data": {"job_id": "vid_1"}}).encode()
    stamp = f"{time.time():.0f}"
    good = sign(SECRET, stamp, body)
    assert await post(server, body, stamp, good, "evt_1") == (
        200, {"status": "poked", "made_due": True})
    await push_back(db_url, "vid_1")
    # every one of these verifies (a rotated secret's list, spaces around values), and every
    # one is the delivery already seen, captured and re-sent under a fresh event id
    rewritten = [f" {good} ", f"v1=deadbeef,{good}", f"{good}, v1=deadbeef",
                 f"v1=0000, {good} ,v1=ffff", f"{good},{good}"]
    answers = [await post(server, body, stamp, header, f"evt_replay_{i}")
               for i, header in enumerate(rewritten)]
    assert answers == [(200, {"status": "duplicate"})] * len(rewritten)
    assert await due_in_s(store, "vid_1") > 3500  # never poked again
    assert await events(db_url) == [("evt_1", good)]  # what verified, one row


async def test_the_same_body_signed_at_another_time_is_a_new_delivery(store, server, db_url):
    # not over-eager: Sume's own retry of an event reuses its id (a duplicate by id), but a
    # new event about the same job, signed afresh, is new
    await store.add_job("vid_2", delay_s=3600)
    body = json.dumps({"job_id": "vid_2"}).encode()
    now = time.time()
    first, second = f"{now - 5:.0f}", f"{now:.0f}"
    assert (await post(server, body, first, sign(SECRET, first, body), "e1"))[1][
        "status"] == "poked"
    await push_back(db_url, "vid_2")
    assert (await post(server, body, second, f" {sign(SECRET, second, body)}", "e2"))[1] == {
        "status": "poked", "made_due": True}
    assert await due_in_s(store, "vid_2") <= 1
    # and Sume's retry of e2, by id, whatever its header says
    assert await post(server, body, second, sign(SECRET, second, body), "e2") == (
        200, {"status": "duplicate"})


async def test_rows_stored_from_the_raw_header_still_catch_a_replay(store, server, db_url):
    # before this fix the raw header was stored; Sume sends one `v1=` value, so such a row
    # equals the form stored now, and a replay across the upgrade is still caught
    await store.add_job("vid_3", delay_s=3600)
    body = json.dumps({"job_id": "vid_3"}).encode()
    stamp = f"{time.time():.0f}"
    good = sign(SECRET, stamp, body)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("INSERT INTO vidpoll_webhook_events (event_id, job_id, effect, "
                           "signature) VALUES ('old_evt', 'vid_3', 'poked', %s)", (good,))
    assert await post(server, body, stamp, f"v1=deadbeef, {good}", "new_evt") == (
        200, {"status": "duplicate"})
    assert await due_in_s(store, "vid_3") > 3500


async def test_twenty_appended_signature_variants_are_one_row_one_poke_one_notify(
        store, server, db_url):
    # issue 18's attack: one captured delivery, re-sent with `,v1=0`, `,v1=1`, ... appended
    # (every variant verifies) under fresh event ids (not signed). Between two variants a
    # worker reads the job and schedules it an hour on, as it would: a variant that poked it
    # again would cost a status read and a NOTIFY to every idle worker.
    await store.add_job("vid_20", delay_s=3600)
    body = json.dumps({"type": "avatar_video.ready", "data": {"job_id": "vid_20"}}).encode()
    stamp = f"{time.time():.0f}"
    good = sign(SECRET, stamp, body)
    variants = [good] + [good + "".join(f",v1={j}" for j in range(i)) for i in range(1, 20)]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute("LISTEN vidpoll_jobs")
        answers, poked_at = [], []
        for i, header in enumerate(variants):
            answers.append(await post(server, body, stamp, header, f"evt_{i}"))
            row = await store.get_job("vid_20")
            assert row is not None
            poked_at.append(row["poked_at"])
            await push_back(db_url, "vid_20")
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("SELECT pg_notify('vidpoll_jobs', 'end of test')")
        heard = []
        async for note in listener.notifies(timeout=10):
            if note.payload == "end of test":
                break
            heard.append(note.payload)
    # a duplicate is still a 2xx: Sume (or a proxy) must not keep resending it
    assert answers == [(200, {"status": "poked", "made_due": True})] + [
        (200, {"status": "duplicate"})] * 19
    assert len(await events(db_url)) == 1
    assert len(set(poked_at)) == 1 and poked_at[0] is not None  # poked once, never again
    assert len(heard) == 1  # one wake-up for the fleet, not twenty
