"""A rejection that follows an unknown outcome is not proof nothing was billed (issue 15,
item 3). Real submitter and worker, the real client, the fake Sume over loopback in the modes a
real provider has (credits checked before the Idempotency-Key, a create that goes on and bills
after the client gave up, keys that expire), real PostgreSQL; the CLI against a real database.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from vidpoll.models import UNKNOWN, ErrorClass, HttpAnswer
from vidpoll.policy import (
    PollPolicy,
    decide_submit,
)
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.providers.sume.rules import RULES as SUME
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter

from .test_process import cli_env

# a fast policy whose unknown intents are re-sent every 0.2-0.3 s (120 s at most in production)
POLICY = PollPolicy(min_poll_s=0.05, backoff_base_s=0.1, backoff_max_s=0.5,
                    default_poll_s=15.0, unknown_resend_s=0.3)
PAYLOAD = {"prompt": "a lighthouse at dawn"}


async def until(runner: Submitter, predicate, within_s: float = 20.0) -> None:
    await runner.signals.wait_for(predicate, within_s)


async def test_lost_reply_then_402_then_top_up_bills_one_clip_tracked_to_its_end(
        store: PgStore, fake: FakeSume, make_submitter, make_worker):
    # the provider checks credits before its key lookup, and its create goes on after the
    # client gave up: the first POST outlives the client's 1 s timeout and bills at 1.5 s
    fake.config.limits_before_key = True
    fake.config.create_keeps_running = True
    fake.config.create_bill_s = 1.5
    fake.config.credits = 1
    await store.add_intent("order-1", PAYLOAD)
    submitter = make_submitter(policy=POLICY)
    worker = make_worker(fetch_results=True)
    sending = asyncio.create_task(submitter.run())
    polling = asyncio.create_task(worker.run())
    try:
        # billed (the lost reply), then the re-send refused: 402, credits are out
        await until(submitter, lambda: fake.billed == 1
                    and fake.refusals_of_billed_keys["order-1"] >= 2
                    and submitter.stats.unknown >= 2)
        intent = await store.get_intent("order-1")
        assert intent is not None
        assert intent.state == UNKNOWN  # not `rejected`: the render may be (and is) billed
        assert intent.job_id is None and intent.error_code == "insufficient_credits"
        assert intent.unknown_outcome_at is not None
        assert (await store.intent_counts()).get(UNKNOWN) == 1
        assert (await store.admission())["unknown"] == 1
        # the top-up: the next re-send of the same key brings back the original job
        fake.config.credits = 10
        await until(submitter, lambda: submitter.stats.submitted == 1)
        intent = await store.get_intent("order-1")
        assert intent is not None and intent.state == "submitted"
        assert intent.job_id == fake.by_key["order-1"]
        await worker.signals.wait_for(lambda: worker.stats.results_fetched == 1, 20)
    finally:
        submitter.stop()
        worker.stop()
        await asyncio.wait_for(asyncio.gather(sending, polling), 20)
    assert fake.billed == 1 and fake.billed_by_key["order-1"] == 1  # exactly one clip
    assert fake.orphaned_creates == 1  # the first POST's client had given up
    assert fake.create_overlaps == 0
    row = await store.get_job(intent.job_id)
    assert row is not None and row["state"] == "completed"
    assert row["idempotency_key"] == "order-1" and row["result_state"] == "fetched"


async def test_unknown_intents_are_resent_through_a_long_credit_pause_and_fresh_ones_wait(
        store: PgStore, fake: FakeSume, make_submitter):
    # a 402 pauses the account's submitting (here 30-60 s: backoff base 60 s) so a queue is
    # not turned into rejections; the unknown intent must still go out every ~0.3 s
    policy = PollPolicy(min_poll_s=0.05, backoff_base_s=60, backoff_max_s=0.5,
                        unknown_resend_s=0.3)
    fake.config.limits_before_key = True
    fake.config.credits = 1
    fake.config.hang_s = 3.0
    fake.create_script["a"] = ["lose_reply"]  # billed, then no answer before the timeout
    await store.add_intent("a", PAYLOAD)
    submitter = make_submitter(policy=policy)
    task = asyncio.create_task(submitter.run())
    try:
        await until(submitter, lambda: submitter.stats.unknown >= 1)
        await store.add_intent("b", {"prompt": "a second clip"})  # NOTIFY wakes it
        sent_before = fake.posts_by_key["a"]
        await until(submitter, lambda: fake.posts_by_key["a"] >= sent_before + 4)
        assert fake.posts_by_key["b"] == 0  # the pause holds for everything else
        assert submitter._credit_paused("default")
        fake.config.credits = 10
        await until(submitter, lambda: submitter.stats.submitted == 2)
    finally:
        submitter.stop()
        await asyncio.wait_for(task, 20)
    a, b = await store.get_intent("a"), await store.get_intent("b")
    assert a is not None and a.state == "submitted" and a.job_id == fake.by_key["a"]
    assert b is not None and b.state == "submitted"
    assert fake.billed_by_key == {"a": 1, "b": 1}


async def test_a_claim_whose_attempt_was_never_recorded_counts_as_unknown(store: PgStore):
    # a submitter claimed, maybe sent, and died: no record. The next claim must remember it,
    # so the refusal its re-send meets does not reject an intent that may be billed
    await store.add_intent("k", PAYLOAD)
    [first] = await store.claim_intents(1, 0.01, "dead", max_active=None)
    assert first.outcome_unknown is False
    later = datetime.now(UTC) + timedelta(minutes=1)  # its lease is long over by then
    [again] = await store.claim_intents(1, 30, "alive", max_active=None, now=later)
    assert again.outcome_unknown is True and again.attempts == 2
    outcome = decide_submit(again, HttpAnswer(402, json.dumps(
        {"error": {"code": "insufficient_credits", "message": "top up"}}).encode()),
        later, POLICY, random.Random(1), SUME)
    assert await store.record_submit(outcome)
    intent = await store.get_intent("k")
    assert intent is not None and intent.state == UNKNOWN
    assert intent.unknown_outcome_at is not None


async def test_a_timeout_is_remembered_on_the_row(store: PgStore, fake: FakeSume,
                                                  make_submitter):
    fake.config.hang_s = 3.0
    fake.create_script["k"] = ["lose_reply"]
    await store.add_intent("k", PAYLOAD)
    submitter = make_submitter(policy=POLICY)
    [claimed] = await store.claim_intents(1, 5, "w", max_active=None)
    outcome = await submitter.send(claimed)
    assert outcome is not None and getattr(outcome, "error_class", None) is ErrorClass.TIMEOUT
    intent = await store.get_intent("k")
    assert intent is not None and intent.state == "queued"
    assert intent.unknown_outcome_at is not None


async def test_an_unknown_intent_holds_a_slot_under_max_active(store: PgStore, db_url: str):
    await store.add_intent("u", PAYLOAD)
    await store.add_intent("fresh", {"prompt": "another"})
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE video_intents SET state = 'unknown', attempts = 2, "
                     "unknown_outcome_at = now(), next_attempt_at = now() + interval '1 hour' "
                     "WHERE idempotency_key = 'u'")
    # the unknown intent (not due) may be rendering: with a cap of 1 there is no free slot
    assert await store.claim_intents(5, 5, "w", max_active=1) == []
    assert [c.key for c in await store.claim_intents(5, 5, "w", max_active=2)] == ["fresh"]
    counts = await store.admission()
    assert counts["unconfirmed"] == 2 and counts["unknown"] == 1


async def test_a_provider_that_forgets_keys_bills_a_resend_again(store: PgStore,
                                                                 fake: FakeSume, client):
    # the fake's key lifetime: past it, the same key is a new request (what a re-send much
    # later than the provider's key lifetime risks: see RELIABILITY.md)
    fake.config.key_ttl_s = 0.0
    first = await client.create_video(PAYLOAD, "old-key")
    second = await client.create_video(PAYLOAD, "old-key")
    assert first.status == second.status == 202
    assert json.loads(first.body)["job_id"] != json.loads(second.body)["job_id"]
    assert fake.billed_by_key["old-key"] == 2
    fake.config.key_ttl_s = None
    third = await client.create_video(PAYLOAD, "old-key")
    assert json.loads(third.body)["job_id"] == json.loads(second.body)["job_id"]


# --- the operator: intents resolve, list, stats ------------------------------------------------

def unknown_intent(db_url: str, key: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO video_intents (idempotency_key, payload, state, attempts, "
                     "unknown_outcome_at, error_code, error_message) VALUES (%s, %s, "
                     "'unknown', 3, now(), 'insufficient_credits', 'top up')",
                     (key, json.dumps(PAYLOAD)))


def vidpoll(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vidpoll.cli", *args],
                          env=cli_env(db_url, "http://127.0.0.1:9"), text=True,
                          capture_output=True, timeout=120)


def row_of(db_url: str, key: str) -> dict[str, object]:
    with psycopg.connect(db_url) as conn:
        cur = conn.execute("SELECT * FROM video_intents WHERE idempotency_key = %s", (key,))
        names = [d.name for d in cur.description or ()]
        values = cur.fetchone()
        assert values is not None
        return dict(zip(names, values, strict=True))


@pytest.mark.slow
def test_intents_resolve_both_ways_and_unknown_shows_in_list_and_stats(db_url: str):
    unknown_intent(db_url, "billed")
    unknown_intent(db_url, "not-billed")
    listed = vidpoll(db_url, "intents", "list", "--state", "unknown", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(i["key"] for i in json.loads(listed.stdout)) == ["billed", "not-billed"]
    text = vidpoll(db_url, "intents", "list", "--state", "unknown")
    assert "billed\tunknown\tattempts=3\tinsufficient_credits: top up" in text.stdout
    stats = json.loads(vidpoll(db_url, "intents", "stats", "--json").stdout)
    assert stats["states"]["unknown"] == 2 and stats["unknown"] == 2
    assert stats["unconfirmed"] == 2  # they hold their slots

    job_id = f"vid_{uuid.uuid4().hex[:12]}"
    done = vidpoll(db_url, "intents", "resolve", "billed", "--job-id", job_id)
    assert done.returncode == 0, done.stderr
    assert f"job {job_id} tracked" in done.stdout
    billed = row_of(db_url, "billed")
    assert (billed["state"], billed["job_id"], billed["resolution"]) == (
        "submitted", job_id, "job")
    assert billed["resolved_at"] is not None and billed["unknown_outcome_at"] is not None
    with psycopg.connect(db_url) as conn:
        job = conn.execute("SELECT state, idempotency_key, next_poll_at <= now() "
                           "FROM video_jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert job == ("pending", "billed", True)  # tracked, due now

    dropped = vidpoll(db_url, "intents", "resolve", "not-billed", "--not-billed")
    assert dropped.returncode == 0, dropped.stderr
    assert "rejected for good" in dropped.stdout
    gone = row_of(db_url, "not-billed")
    assert (gone["state"], gone["job_id"], gone["resolution"]) == ("rejected", None,
                                                                   "not_billed")
    assert gone["error_code"] == "insufficient_credits"  # Sume's last refusal is kept

    # refused: already submitted; a job id of another key; neither or both flags
    again = vidpoll(db_url, "intents", "resolve", "billed", "--not-billed")
    assert again.returncode == 1 and "already submitted" in again.stderr
    unknown_intent(db_url, "third")
    stolen = vidpoll(db_url, "intents", "resolve", "third", "--job-id", job_id)
    assert stolen.returncode == 1 and "another key" in stolen.stderr
    assert row_of(db_url, "third")["state"] == "unknown"
    assert vidpoll(db_url, "intents", "resolve", "third").returncode == 2
    assert vidpoll(db_url, "intents", "resolve", "third", "--job-id", "x",
                   "--not-billed").returncode == 2
    missing = vidpoll(db_url, "intents", "resolve", "nope", "--not-billed")
    assert missing.returncode == 1 and "no intent" in missing.stderr


async def test_resolve_refuses_an_intent_being_sent_right_now(store: PgStore, db_url: str):
    unknown_intent(db_url, "busy")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE video_intents SET next_attempt_at = now() - interval '1 s' "
                     "WHERE idempotency_key = 'busy'")
    [claimed] = await store.claim_intents(1, 30, "w", max_active=None)
    assert claimed.key == "busy" and claimed.state == UNKNOWN
    assert not await store.resolve_intent("busy", not_billed=True)
    assert not await store.resolve_intent("busy", job_id="vid_x")
    assert (await store.get_intent("busy")).state == UNKNOWN  # type: ignore[union-attr]


async def test_the_dashboard_lists_unknown_intents_with_the_counts(store: PgStore, db_url: str):
    import aiohttp

    from vidpoll.web import make_app, start_server

    unknown_intent(db_url, "dash-u")
    runner, url = await start_server(make_app(store, None, loopback_only=True), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"{url}/intents?state=unknown") as resp:
            assert resp.status == 200
            html = await resp.text()
    finally:
        await runner.cleanup()
    assert "dash-u" in html and "insufficient_credits" in html
    assert 'unknown</a>: 1' in html
