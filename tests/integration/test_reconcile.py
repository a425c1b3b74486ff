"""Reconciling unknown creates of a provider without an idempotency key, in the core.

The provider here is a few lines of memory, written for these tests: a list of the creates
it "billed" (model, input, time) that `find_created` searches as a provider's own list endpoint
would. What is checked is the submitter and the store: an unknown create is looked up, never
sent again blindly; found → adopted exactly as after a 201; proven absent → sent once more;
ambiguous or unreadable past the deadline → parked as `unknown`; a job another intent holds
is never adopted; a crash mid-POST is looked up, not re-sent. Replicate's own client and fake
run the same paths end to end in tests/integration/test_replicate.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from vidpoll import reconcile
from vidpoll.models import ErrorClass, HttpAnswer
from vidpoll.policy import PollPolicy
from vidpoll.providers.base import Created, CreatedPage
from vidpoll.providers.sume.rules import SumeRules
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig

from ..conftest import FAST_POLICY

ACCOUNT = "ledger"
POLICY = dataclasses.replace(FAST_POLICY, reconcile_settle_s=0.05, reconcile_deadline_s=60.0)


class NoKeyRules(SumeRules):
    idempotency_header = None

    def match_created(self, entry: Any, payload: dict[str, Any], model: str | None) -> str:
        return "same" if entry["model"] == model and entry["input"] == payload else "other"


class LedgerClient:
    """Creates billed into a list; `find_created` reads it back. `script`: what each create
    does, in order ("ok", "lost": billed, no answer; "down": 500 before billing; "refused")."""

    rules = NoKeyRules()

    def __init__(self, script: list[str] | None = None) -> None:
        self.script = list(script or [])
        self.records: list[dict[str, Any]] = []
        self.creates = 0
        self.lookups = 0
        self.lookup_failures = 0
        """Look-ups still to fail (a list endpoint down)."""
        self.fails_in_walk = 0

    def bill(self, payload: dict[str, Any], model: str | None) -> str:
        job_id = f"pred_{len(self.records) + 1}"
        self.records.append({"id": job_id, "model": model, "input": json.loads(
            json.dumps(payload)), "at": datetime.now(UTC)})
        return job_id

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        self.creates += 1
        step = self.script.pop(0) if self.script else "ok"
        if step == "down":
            return HttpAnswer(500, b'{"error": {"code": "internal", "message": "down"}}')
        if step == "refused":
            return HttpAnswer(422, b'{"error": {"code": "invalid", "message": "no"}}')
        job_id = self.bill(payload, model)
        if step == "lost":
            return HttpAnswer(None, transport_error=ErrorClass.TIMEOUT, detail="no answer")
        return HttpAnswer(201, json.dumps({"id": job_id}).encode())

    def list_scope(self, model: str | None) -> str:
        return ""

    async def list_created(self, model: str | None, since: datetime, until: datetime,
                           cursor: str | None) -> CreatedPage:
        """The whole ledger as one page (a failure: `lookup_failures` walks in a row, each
        page tried PAGE_TRIES times by the core, answer 503)."""
        if cursor is None and self.fails_in_walk == 0:
            self.lookups += 1  # a walk begins (its page tried again in place counts once)
        if self.lookup_failures > 0:
            if self.fails_in_walk == reconcile.PAGE_TRIES - 1:
                self.lookup_failures -= 1
                self.fails_in_walk = 0
            else:
                self.fails_in_walk += 1
            return CreatedPage(failure=HttpAnswer(503, b""), detail="HTTP 503")
        return CreatedPage(tuple(Created(r["id"], r, r["at"]) for r in self.records
                                 if since <= r["at"] <= until))


def submitter(store: PgStore, client: Any, policy: PollPolicy = POLICY) -> Submitter:
    return Submitter(store, {ACCOUNT: client}, SubmitterConfig(
        policy=policy, lease_s=5.0, http_timeout_s=1.0, first_poll_s=0.0, max_active=None,
        drain=True, accounts=(ACCOUNT,)))


async def add(store: PgStore, key: str, prompt: str) -> None:
    await store.add_intent(key, {"prompt": prompt, "seconds": 4}, account=ACCOUNT,
                           provider="sume", model="acme/gen:v1")


async def drain(store: PgStore, client: Any, policy: PollPolicy = POLICY) -> Submitter:
    sub = submitter(store, client, policy)
    await asyncio.wait_for(sub.run(), 30)
    return sub


async def test_a_lost_reply_is_adopted_from_the_records_never_sent_again(
        store: PgStore) -> None:
    client = LedgerClient(["lost"])
    await add(store, "k1", "a heron")
    sub = await drain(store, client)
    assert client.creates == 1 and len(client.records) == 1
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "submitted"
    assert intent.job_id == client.records[0]["id"]
    job = await store.get_job(intent.job_id)
    assert job is not None and job["idempotency_key"] == "k1" and job["state"] == "pending"
    assert (sub.stats.lookups, sub.stats.adopted, sub.stats.resent) == (1, 1, 0)
    assert "adopted" in (intent.last_error or "")


async def test_a_create_that_never_reached_the_provider_is_sent_once_more(
        store: PgStore) -> None:
    client = LedgerClient(["down"])  # a 500 before anything was billed
    await add(store, "k1", "a heron")
    sub = await drain(store, client)
    assert client.creates == 2 and len(client.records) == 1  # billed once, by the re-send
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "submitted"
    assert intent.job_id == client.records[0]["id"]
    assert (sub.stats.adopted, sub.stats.resent) == (0, 1)


async def test_identical_inputs_on_purpose_stay_two_jobs(store: PgStore) -> None:
    # the first is answered; the second's reply is lost: its look-up sees both jobs of that
    # input, and must take the one no intent holds
    client = LedgerClient(["ok", "lost"])
    await add(store, "k1", "same")
    await drain(store, client)
    await add(store, "k2", "same")
    await drain(store, client)
    first, second = await store.get_intent("k1"), await store.get_intent("k2")
    assert first is not None and second is not None
    assert {first.job_id, second.job_id} == {r["id"] for r in client.records}
    assert first.job_id != second.job_id and client.creates == 2

    # the third never reached the provider: the two jobs there are other intents', so it is
    # proven absent and sent once more
    client.script = ["down"]
    await add(store, "k3", "same")
    await drain(store, client)
    third = await store.get_intent("k3")
    assert third is not None and third.state == "submitted"
    assert len(client.records) == 3 and third.job_id == client.records[2]["id"]


async def test_two_unheld_jobs_of_one_input_are_ambiguous_and_parked(store: PgStore) -> None:
    client = LedgerClient(["lost"])
    await add(store, "k1", "twice")
    client.bill({"prompt": "twice", "seconds": 4}, "acme/gen:v1")  # made elsewhere, same input
    sub = await drain(store, client)
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "unknown" and intent.job_id is None
    assert client.creates == 1  # never a second paid create
    assert "pred_1" in (intent.last_error or "") and "pred_2" in (intent.last_error or "")
    assert "intents resolve k1" in (intent.last_error or "")
    assert sub.stats.parked == 1
    # an operator settles it with one of them
    assert await store.resolve_intent("k1", job_id="pred_2")
    settled = await store.get_intent("k1")
    assert settled is not None and settled.state == "submitted" and settled.job_id == "pred_2"


async def test_an_unreadable_list_is_retried_then_parked_at_the_deadline(
        store: PgStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # each walk tries its page PAGE_TRIES times a moment apart: moments of 10 ms here
    monkeypatch.setattr(reconcile, "QUICK_RETRY_S", (0.01,) * len(reconcile.QUICK_RETRY_S))
    client = LedgerClient(["lost"])
    client.lookup_failures = 2
    await add(store, "k1", "retry me")
    await drain(store, client)
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "submitted"  # the third look-up found it
    assert client.lookups == 3 and client.creates == 1

    client.script, client.lookup_failures = ["lost"], 10**6
    await add(store, "k2", "never readable")
    await drain(store, client, dataclasses.replace(POLICY, reconcile_deadline_s=0.3))
    parked = await store.get_intent("k2")
    assert parked is not None and parked.state == "unknown" and parked.job_id is None
    assert "could not be read" in (parked.last_error or "")
    assert client.creates == 2  # one per intent, never more


async def test_a_crash_mid_post_is_looked_up_not_sent_again(store: PgStore,
                                                           db_url: str) -> None:
    client = LedgerClient()
    await add(store, "k1", "crash")
    # a submitter claims it and dies with the POST sent (billed), its answer never recorded
    [claimed] = await store.claim_intents(1, 0.2, "dead-submitter", None, account=ACCOUNT)
    client.bill(claimed.payload, claimed.model)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                           "WHERE idempotency_key = 'k1'")  # its lease is over
    sub = await drain(store, client)
    assert client.creates == 0  # looked up, never POSTed again
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "submitted" and intent.job_id == "pred_1"
    assert sub.stats.adopted == 1


async def test_a_refusal_without_a_key_is_final(store: PgStore) -> None:
    client = LedgerClient(["refused"])
    await add(store, "k1", "nope")
    await drain(store, client)
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "rejected" and intent.error_code == "invalid"
    assert client.lookups == 0


class NoListClient(LedgerClient):
    list_created = None  # type: ignore[assignment]  # a provider without a list endpoint


@pytest.mark.parametrize("script", [["lost"]])
async def test_a_provider_without_records_to_search_parks_it(store: PgStore,
                                                             script: list[str]) -> None:
    client = NoListClient(script)
    await add(store, "k1", "nowhere to look")
    await drain(store, client)
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "unknown"
    assert "cannot be searched" in (intent.last_error or "") and client.creates == 1


async def test_one_job_is_never_adopted_for_two_keys(store: PgStore) -> None:
    from vidpoll.models import SUBMITTED, SubmitOutcome
    await add(store, "k1", "same")
    await add(store, "k2", "same")
    claimed = await store.claim_intents(2, 5.0, "w", None, account=ACCOUNT)
    assert len(claimed) == 2
    outcomes = [SubmitOutcome(c.key, c.claim_token, SUBMITTED, job_id="pred_x", adopted=True)
                for c in claimed]
    landed = await asyncio.gather(*(store.record_submit(o) for o in outcomes))
    assert sorted(landed) == [False, True]  # whichever came first holds it
    states = {c.key: (await store.get_intent(c.key)) for c in claimed}
    holders = [k for k, i in states.items() if i is not None and i.job_id == "pred_x"]
    assert len(holders) == 1
    job = await store.get_job("pred_x")
    assert job is not None and job["idempotency_key"] == holders[0]


async def test_a_user_rerunning_submit_after_a_crash_gets_a_look_up_not_a_second_create(
        store: PgStore, db_url: str) -> None:
    client = LedgerClient()
    await add(store, "k1", "rerun")
    [claimed] = await store.claim_intents(1, 0.2, "killed-submit", None, account=ACCOUNT)
    client.bill(claimed.payload, claimed.model)  # sent and billed; the process was killed
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                           "WHERE idempotency_key = 'k1'")  # its lease is over
    # `vidpoll submit --key k1` again: makes it due, then sends it through a claim
    assert await store.requeue_intents(["k1"]) == ["k1"]
    await drain(store, client)
    assert client.creates == 0
    intent = await store.get_intent("k1")
    assert intent is not None and intent.state == "submitted" and intent.job_id == "pred_1"
