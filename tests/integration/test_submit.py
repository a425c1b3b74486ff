"""Submission intents against a real PostgreSQL and the fake Sume over loopback HTTP."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg
import pytest

from vidpoll.errors import ConfigError, InvalidIntent, KeyConflict
from vidpoll.models import QUEUED, REJECTED, SUBMITTED, SubmitOutcome
from vidpoll.policy import AuthPause, PollPolicy
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.sql import QUERIES
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig, submit_now
from vidpoll.worker import Worker

from ..conftest import API_KEY, FAST_POLICY, db_now, run_until

PROMPT = {"prompt": "a lighthouse at dawn"}


async def queue(store: PgStore, n: int, prefix: str = "key-", **payload: object) -> list[str]:
    keys = [f"{prefix}{i:04d}" for i in range(n)]
    for key in keys:
        await store.add_intent(key, {"prompt": f"clip {key}", **payload})
    return keys


async def states(store: PgStore) -> dict[str, int]:
    return await store.intent_counts()


async def test_the_intent_is_committed_before_the_post(store, fake, db_url, make_submitter):
    seen: list[tuple[str, int]] = []

    async def look(key: str | None) -> None:
        # a separate connection sees only committed rows
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            cur = await conn.execute(
                "SELECT state, attempts FROM video_intents WHERE idempotency_key = %s", (key,))
            row = await cur.fetchone()
            assert row is not None, "POST sent before its intent was committed"
            seen.append(row)

    fake.on_create = look
    await queue(store, 3)
    sub = make_submitter()
    await run_until(sub, lambda: sub.stats.submitted == 3)
    assert seen == [("queued", 1)] * 3


async def test_a_202_links_the_intent_and_its_job(store, fake, make_submitter):
    await store.add_intent("k1", PROMPT)
    sub = make_submitter(first_poll_s=15.0)
    await run_until(sub, lambda: sub.stats.submitted == 1)
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == SUBMITTED and intent.attempts == 1
    assert intent.job_id == fake.by_key["k1"]
    job = await store.get_job(intent.job_id)
    assert job is not None and job["state"] == "pending" and job["idempotency_key"] == "k1"
    # first read 15 s after the job was recorded (the database's clock, both ends)
    assert (job["next_poll_at"] - job["created_at"]).total_seconds() == pytest.approx(15.0)
    again = await store.intent_of_job(intent.job_id)
    assert again is not None and again.key == "k1"


@pytest.mark.parametrize("fault", ["lose_reply", "5xx_billed", "5xx", "429"])
async def test_an_unknown_outcome_replays_the_same_key(store, fake, make_submitter, fault):
    fake.config.hang_s = 5.0  # a lost reply: billed, then silence past the 1 s client timeout
    fake.config.retry_after_s = 0.1
    fake.create_script["k1"] = [fault, "ok"]
    await store.add_intent("k1", PROMPT)
    sub = make_submitter()
    await run_until(sub, lambda: sub.stats.submitted == 1)
    # the second POST carries the same key: after a billed fault Sume answers with that job
    assert fake.posts_by_key["k1"] == 2
    assert fake.billed_by_key["k1"] == 1 and fake.billed == 1
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == SUBMITTED and intent.attempts == 2
    assert intent.job_id == fake.by_key["k1"]
    assert (await store.counts()) == {"pending": 1}


async def test_retry_after_sets_the_next_attempt(store, fake, client, db_url):
    fake.config.retry_after_s = 30
    fake.create_script["k1"] = ["429"]
    await store.add_intent("k1", PROMPT)
    config = SubmitterConfig(max_active=None, policy=FAST_POLICY, lease_s=5, http_timeout_s=1)
    result = await submit_now(store, client, config, "k1")
    assert isinstance(result, SubmitOutcome) and result.state == QUEUED
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == QUEUED and intent.last_http_status == 429
    assert intent.last_error_class == "rate_limited" and "rate_limit_exceeded" in intent.last_error
    assert await retry_in_s(db_url, "k1") == pytest.approx(30)  # from the answer's write


async def test_rejections_are_final_until_retried_by_hand(store, fake, make_submitter):
    await store.add_intent("bad", {"prompt": ""})  # the fake answers 422 invalid_request
    others = await queue(store, 5)
    sub = make_submitter()
    await run_until(sub, lambda: sub.stats.submitted == 5 and sub.stats.rejected == 1)
    # a new submitter that looks at the queue every 50 ms: the rejected intent is not sent
    sub = make_submitter(idle_max_s=0.05)
    # it looks at the queue (a claim, or an idle probe of what is due) again and again
    await run_until(sub, lambda: sub.stats.claims + sub.stats.probes >= 5)
    assert sub.stats.posts == 0
    assert fake.posts_by_key["bad"] == 1 and fake.billed_by_key["bad"] == 0
    bad = await store.get_intent("bad")
    assert bad is not None and bad.state == REJECTED and bad.last_http_status == 422
    assert bad.error_code == "invalid_request" and "prompt" in (bad.error_message or "")
    assert bad.last_request_id and bad.last_request_id.startswith("req_")
    assert all(fake.billed_by_key[k] == 1 for k in others)
    assert await store.requeue_intents(["bad"]) == ["bad"]
    again = await store.get_intent("bad")
    assert again is not None and again.state == QUEUED
    sub = make_submitter()
    await run_until(sub, lambda: sub.stats.rejected == 1)
    assert fake.posts_by_key["bad"] == 2


async def test_402_rejects_and_pauses_instead_of_rejecting_the_queue(store, fake,
                                                                     make_submitter):
    fake.config.credits = 2
    keys = await queue(store, 6)
    # a pause of 10-20 s after a 402: nothing else can be sent while this test looks
    sub = make_submitter(concurrency=1, policy=PollPolicy(min_poll_s=0.05, backoff_base_s=20.0))
    task = asyncio.create_task(sub.run())
    try:
        await sub.signals.wait_for(lambda: sub.stats.rejected == 1, 10)
        # it keeps running, paused: checked on its own loop for a while, no second POST
        with pytest.raises(TimeoutError):
            await sub.signals.wait_for(lambda: sub.stats.posts > 3, 0.5)
    finally:
        sub.stop()
        await task
    assert sub.stats.posts == 3
    assert await states(store) == {"submitted": 2, "rejected": 1, "queued": 3}
    rejected = await store.list_intents(REJECTED)
    assert rejected[0].error_code == "insufficient_credits"
    fake.config.credits = 100  # topped up: the queue goes on, the rejected one waits for a hand
    sub = make_submitter(concurrency=1)
    await run_until(sub, lambda: sub.stats.submitted == 3, within_s=15)
    assert await states(store) == {"submitted": 5, "rejected": 1}
    assert await store.requeue_intents([], all_rejected=True,
                                       code="insufficient_credits") == [rejected[0].key]
    sub = make_submitter(concurrency=1)
    await run_until(sub, lambda: sub.stats.submitted == 1)
    assert all(fake.billed_by_key[k] == 1 for k in keys)


async def test_a_requeued_rejection_waits_for_a_slot_like_a_new_intent(store, fake, client):
    await store.add_intent("bad", {"prompt": ""})
    config = SubmitterConfig(max_active=None, policy=FAST_POLICY, lease_s=5, http_timeout_s=1)
    assert isinstance(await submit_now(store, client, config, "bad"), SubmitOutcome)
    await store.add_job("busy")  # one render active
    assert await store.requeue_intents(["bad"]) == ["bad"]
    assert await store.claim_intents(5, 5, "w", max_active=1) == []  # no free slot for it
    assert [c.key for c in await store.claim_intents(5, 5, "w", max_active=2)] == ["bad"]


async def test_a_refused_api_key_keeps_every_intent_queued(store, fake, fake_url):
    await queue(store, 10)
    async with SumeClient(fake_url, "sk-wrong", timeout_s=1.0) as bad_client:
        sub = Submitter(store, bad_client, SubmitterConfig(
            concurrency=2, max_active=None, policy=FAST_POLICY, lease_s=5, http_timeout_s=1))
        await run_until(sub, lambda: sub.stats.released >= 6)
    assert fake.billed == 0 and fake.auth_failures == sub.stats.posts
    for intent in await store.list_intents():
        assert intent.state == QUEUED and intent.attempts == 0  # no POST counted as sent
    # after the first batch, each pause ends with a single probe, not a batch
    assert sub.stats.posts <= 2 + (sub.stats.claims - 1)


@pytest.mark.parametrize("max_active", [None, 1000])
async def test_submitters_never_send_one_intent_twice_at_once(db_url, fake, fake_url,
                                                              max_active):
    fake.config.latency_s = 0.05
    fake.config.create_lose_reply = 0.15
    fake.config.create_5xx_billed = 0.15
    fake.config.hang_s = 2.0
    stores = [await PgStore.open(db_url, max_size=3) for _ in range(4)]
    try:
        keys = await queue(stores[0], 60)
        async with SumeClient(fake_url, API_KEY, timeout_s=0.5) as client:
            subs = [Submitter(s, client, SubmitterConfig(
                concurrency=8, max_active=max_active, policy=FAST_POLICY, lease_s=1.5,
                http_timeout_s=0.5, worker_id=f"s{i}")) for i, s in enumerate(stores)]
            tasks = [asyncio.create_task(s.run()) for s in subs]
            async with asyncio.timeout(30):
                while await stores[0].has_queued_intents():  # noqa: ASYNC110 (bounded)
                    await asyncio.sleep(0.05)
            for s in subs:
                s.stop()
            await asyncio.gather(*tasks)
        assert fake.create_overlaps == 0
        assert all(fake.billed_by_key[k] == 1 for k in keys)
        assert sum(s.stats.retries.get("timeout", 0) for s in subs) > 0  # lost replies seen
        assert await states(stores[0]) == {"submitted": 60}
        assert (await stores[0].counts()) == {"pending": 60}
    finally:
        for s in stores:
            await s.close()


async def admission_run(store: PgStore, fake: FakeSume, client: SumeClient,
                        make_worker: Callable[..., Worker], max_active: int | None) -> None:
    fake.config.render_s = 0.4
    fake.config.render_jitter = 0.5
    fake.config.max_concurrent = 3
    fake.config.retry_after_s = 0.2
    keys = await queue(store, 24)
    subs = [Submitter(store, client, SubmitterConfig(
        concurrency=4, max_active=max_active, policy=FAST_POLICY, lease_s=5, http_timeout_s=1,
        first_poll_s=0.1, worker_id=f"s{i}")) for i in range(3)]
    poller = make_worker(drain=True, drain_waits_for_intents=True)
    tasks = [asyncio.create_task(s.run()) for s in subs]
    await asyncio.wait_for(poller.run(), 60)
    for s in subs:
        s.stop()
    await asyncio.gather(*tasks)
    assert all(fake.billed_by_key[k] == 1 for k in keys)
    assert await store.counts() == {"completed": 24}


async def test_admission_cap_is_respected_under_load(store, fake, client, make_worker):
    await admission_run(store, fake, client, make_worker, max_active=3)
    assert fake.concurrency_refusals == 0
    assert fake.max_running_seen <= 3


async def test_without_the_cap_the_provider_refuses(store, fake, client, make_worker):
    # the control for the test above: the same load with no cap does hit Sume's limit
    await admission_run(store, fake, client, make_worker, max_active=None)
    assert fake.concurrency_refusals > 0


@pytest.mark.parametrize("lease_s", [10, 15, 15.5])
def test_a_lease_not_longer_than_the_http_timeout_is_refused(lease_s):
    # a POST could outlive such a lease, and another submitter could send the same key
    with pytest.raises(ConfigError, match="lease"):
        SubmitterConfig(lease_s=lease_s, http_timeout_s=15)


async def test_the_lease_starts_after_the_wait_for_the_admission_lock(store, db_url):
    await store.add_intent("k1", PROMPT)
    async with await psycopg.AsyncConnection.connect(db_url) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(730619836, hashtext('default'))")
        claim = asyncio.create_task(store.claim_intents(1, 5.0, "w", max_active=10))
        async with asyncio.timeout(10):  # until the claim is blocked on the lock
            while not await waiting_for_a_lock(db_url):  # noqa: ASYNC110 (bounded)
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # the time spent waiting that the lease must not lose
        assert not claim.done()
        cur = await holder.execute("SELECT clock_timestamp()")
        released_at = (await cur.fetchone())[0]  # the lock is held until just after this
        await holder.commit()
        claimed = await claim
    assert [c.key for c in claimed] == ["k1"]
    # the lease runs 5 s from when the lock was had, not from when the claim began to wait
    # for it (that would end it 4 s after the release or sooner): the database's clock only
    lease_end = await lease_end_at(db_url, "k1")
    assert (lease_end - released_at).total_seconds() >= 5.0


async def waiting_for_a_lock(db_url: str) -> bool:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND wait_event_type = 'Lock'")
        row = await cur.fetchone()
        return bool(row and row[0])


async def retry_in_s(db_url: str, key: str) -> float:
    """Seconds from the intent's last write to its next attempt (the database's clock)."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT extract(epoch FROM next_attempt_at - updated_at)"
                                 " FROM video_intents WHERE idempotency_key = %s", (key,))
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])


async def lease_end_at(db_url: str, key: str) -> datetime:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT next_attempt_at FROM video_intents "
                                 "WHERE idempotency_key = %s", (key,))
        row = await cur.fetchone()
        assert row is not None
        return row[0]


async def test_stop_during_a_claim_sends_nothing(store, fake, client):
    await queue(store, 3)

    class StopsDuringClaim:
        """The real store, but stop() arrives while the claim is on its way back."""

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        async def claim_checked(self, *args: object, **kwargs: object) -> object:
            claimed = await store.claim_checked(*args, **kwargs)  # type: ignore[arg-type]
            sub.stop()
            return claimed

    sub = Submitter(StopsDuringClaim(), client,  # type: ignore[arg-type]
                    SubmitterConfig(max_active=None, policy=FAST_POLICY, lease_s=5,
                                    http_timeout_s=1))
    await asyncio.wait_for(sub.run(), 10)
    assert fake.creates == 0 and sub.stats.released == 3
    for intent in await store.list_intents():
        assert intent.state == QUEUED and intent.attempts == 0


async def test_bulk_batches_catch_a_key_repeated_for_another_request(store):
    items = [("a", {"prompt": "one"}, 0), ("b", {"prompt": "b"}, 0), ("a", {"prompt": "two"}, 0),
             ("b", {"prompt": "b"}, 0)]
    new, conflicts = await store.add_intents(items)
    assert (new, conflicts) == (2, ["a"])
    intent = await store.get_intent("a")
    assert intent is not None and intent.payload == {"prompt": "one"}


async def test_a_rerun_matches_after_the_jsonb_round_trip(store):
    payload = {"prompt": "x", "size": (1280, 720), "seed": 1.0, "nested": {"b": 1, "a": [True]}}
    first, _ = await store.add_intent("k", payload)
    again, new = await store.add_intent("k", payload)  # the tuple came back as a list
    assert not new and again == first


async def test_fifo_within_priority(store, fake, make_submitter):
    for key, prio in [("a", 0), ("b", 0), ("c", 0), ("urgent", 5), ("d", 0), ("later", -1)]:
        await store.add_intent(key, {"prompt": key}, priority=prio)
    sub = make_submitter(concurrency=1)
    await run_until(sub, lambda: sub.stats.submitted == 6)
    assert fake.create_order == ["urgent", "a", "b", "c", "d", "later"]


async def test_submit_now_respects_the_queue_and_the_cap(store, fake, client):
    await queue(store, 2, prefix="early-")
    await store.add_intent("mine", PROMPT)
    config = SubmitterConfig(max_active=2, policy=FAST_POLICY, lease_s=5, http_timeout_s=1)
    assert await submit_now(store, client, config, "mine") is None  # two are ahead of it
    assert fake.creates == 0
    unlimited = SubmitterConfig(max_active=None, policy=FAST_POLICY, lease_s=5,
                                http_timeout_s=1)
    result = await submit_now(store, client, unlimited, "mine")
    assert isinstance(result, SubmitOutcome) and result.state == SUBMITTED
    assert fake.create_order == ["mine"]


async def test_a_crashed_claim_keeps_its_slot_and_comes_back(store, fake, client, db_url):
    await store.add_intent("k1", PROMPT)
    await store.add_intent("k2", PROMPT | {"n": 2})
    # a submitter claimed k1 and died before answering: k1 may have started a render
    t0 = await db_now(db_url)  # the clock these claims run on: a second apart, then past
    claimed = await store.claim_intents(1, 5, "dead", max_active=1, now=t0)
    assert [c.key for c in claimed] == ["k1"]
    assert await store.claim_intents(5, 5, "other", max_active=1,
                                     now=t0 + timedelta(seconds=1)) == []  # k1 holds the slot
    again = await store.claim_intents(5, 5, "other", max_active=1,
                                      now=t0 + timedelta(seconds=6))  # its lease has ended
    assert [c.key for c in again] == ["k1"]  # a retry needs no new slot; k2 still waits
    assert again[0].attempts == 2


async def test_a_stale_claim_cannot_overwrite_but_the_job_is_tracked(store, fake, db_url):
    await store.add_intent("k1", PROMPT)
    t0 = await db_now(db_url)
    stale = (await store.claim_intents(1, 5, "slow", max_active=None, now=t0))[0]
    fresh = (await store.claim_intents(1, 5, "fast", max_active=None,  # its lease ended
                                       now=t0 + timedelta(seconds=6)))[0]
    late = SubmitOutcome("k1", stale.claim_token, REJECTED, error_code="x")
    assert not await store.record_submit(late)
    assert not await store.record_submit(SubmitOutcome("k1", stale.claim_token, SUBMITTED,
                                                       job_id="vid_1"))
    assert (await store.get_job("vid_1")) is not None  # a paid job is tracked regardless
    assert await store.record_submit(SubmitOutcome("k1", fresh.claim_token, SUBMITTED,
                                                   job_id="vid_1"))
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == SUBMITTED and intent.job_id == "vid_1"


async def test_the_poller_never_posts(store, fake, make_worker):
    await queue(store, 5)
    poller = make_worker(drain=True)
    await asyncio.wait_for(poller.run(), 10)
    assert fake.creates == 0 and await states(store) == {"queued": 5}


async def test_the_same_key_returns_the_existing_intent(store):
    first, new = await store.add_intent("k1", PROMPT, priority=3)
    again, new_again = await store.add_intent("k1", dict(PROMPT), priority=9)
    assert new and not new_again and again == first and again.priority == 3
    with pytest.raises(KeyConflict, match="different payload"):
        await store.add_intent("k1", {"prompt": "something else"})
    assert (await store.get_intent("k1")) == first


@pytest.mark.parametrize(("key", "payload"), [("", PROMPT), ("a b", PROMPT), ("a\nb", PROMPT),
                                              ("k", {"prompt": "a\x00b"}),
                                              ("k", {"n": float("inf")})])
async def test_bad_input_records_nothing(store, key, payload):
    with pytest.raises(InvalidIntent):
        await store.add_intent(key, payload)
    assert await store.intent_counts() == {}


async def test_a_new_intent_wakes_an_idle_submitter(store, fake, make_submitter):
    sub = make_submitter(idle_max_s=30.0)
    task = asyncio.create_task(sub.run())
    try:
        await sub.signals.wait_for(lambda: sub.listening and sub.idle, 10)
        await store.add_intent("k1", PROMPT)
        # a third of the idle cap: only the new intent's NOTIFY can wake it this soon
        await sub.signals.wait_for(lambda: sub.stats.submitted == 1, 10)
    finally:
        sub.stop()
        await task


async def test_a_finished_job_frees_a_slot_at_once(store, fake, client, make_worker):
    fake.config.render_s = 0.3
    await queue(store, 2)
    sub = Submitter(store, client, SubmitterConfig(max_active=1, policy=FAST_POLICY, lease_s=5,
                                                   http_timeout_s=1, first_poll_s=0.5,
                                                   idle_max_s=30.0))
    poller = make_worker(idle_max_s=30.0)
    tasks = [asyncio.create_task(sub.run()), asyncio.create_task(poller.run())]
    try:
        # the second POST can only go after the first job ends; the job-done NOTIFY wakes the
        # submitter instead of its 30 s idle sleep
        await sub.signals.wait_for(lambda: sub.stats.submitted == 2, 10)
    finally:
        sub.stop()
        poller.stop()
        await asyncio.gather(*tasks)


async def test_fake_refuses_a_reused_key_with_another_payload(fake_url):
    # the provider side of KeyConflict: the same key with a different body is a 422
    async with SumeClient(fake_url, API_KEY, timeout_s=1.0) as client:
        first = await client.create_video({"prompt": "a"}, "same")
        second = await client.create_video({"prompt": "b"}, "same")
    assert first.status == 202 and second.status == 422
    assert b"idempotency_key_reused" in second.body


async def test_auth_pause_result_is_reported(store, fake_url):
    await store.add_intent("k1", PROMPT)
    config = SubmitterConfig(max_active=None, policy=FAST_POLICY, lease_s=5, http_timeout_s=1)
    async with SumeClient(fake_url, "sk-wrong", timeout_s=1.0) as bad:
        result = await submit_now(store, bad, config, "k1")
    assert isinstance(result, AuthPause) and result.http_status == 401


def test_the_intent_claim_uses_the_queue_index(db_url):
    # 20,000 intents, 2 % still queued: the claim must walk the small partial index in claim
    # order, never scan the table (the same guard as the jobs' claim)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO video_intents (idempotency_key, payload, state) "
                     "SELECT 'k' || g, '{}'::jsonb, "
                     "CASE WHEN g % 50 = 0 THEN 'queued' ELSE 'submitted' END "
                     "FROM generate_series(1, 20000) g")
        conn.execute("INSERT INTO video_jobs (job_id, state, next_poll_at) "
                     "SELECT 'j' || g, CASE WHEN g % 50 = 0 THEN 'pending' ELSE 'completed' END,"
                     " now() FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE video_intents")
        conn.execute("ANALYZE video_jobs")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN " + QUERIES["claim_intents"],
            {"limit": 8, "lease_s": 25.0, "worker_id": "w", "max_active": 50, "key": None,
             "now": None, "account": "default"}).fetchall())
    assert "video_intents_account_queue_idx" in plan, plan
    assert "Seq Scan on video_intents" not in plan, plan
    assert "Seq Scan on video_jobs" not in plan, plan


async def test_a_key_no_header_can_carry_is_one_clear_line_never_a_traceback(store, fake,
                                                                           fake_url, caplog):
    # the review: a 30-line traceback at ERROR from aiohttp's "Forbidden control character",
    # then 'Sume did not confirm it (connection: ValueError)'
    caplog.set_level(logging.INFO, logger="vidpoll")
    await store.add_intent("k1", PROMPT)
    key = "sk-ab\x01cd-secret"
    async with SumeClient(fake_url, key, timeout_s=1.0) as client:
        result = await submit_now(store, client, SubmitterConfig(
            max_active=None, policy=FAST_POLICY, lease_s=5, http_timeout_s=1), "k1")
    assert isinstance(result, SubmitOutcome) and result.state == QUEUED
    assert result.error is not None and "not sent: the API key" in result.error
    assert "control character" in result.error
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text and "ab\x01cd" not in caplog.text
    assert fake.creates == 0 and fake.auth_failures == 0
