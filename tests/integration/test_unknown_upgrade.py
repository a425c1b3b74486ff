"""An unknown outcome recorded by a submitter from before migration 0010 is still unknown.

A rolling upgrade migrates first and restarts submitters after: meanwhile an old submitter
records a timeout with the old query, which clears the claim and sets no unknown_outcome_at.
The next claim must still know that attempt's outcome was unknown, or a 402 from a provider that
checks credits before the key would reject an intent whose render may be billed (found in
review: the claim only looked at unknown_outcome_at).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import psycopg

from vidpoll.models import REJECTED, UNKNOWN, HttpAnswer
from vidpoll.policy import (
    PollPolicy,
    decide_submit,
)
from vidpoll.providers.sume.rules import RULES as SUME

ENVELOPE_402 = (b'{"error": {"code": "insufficient_credits", "message": "top up"}, '
                b'"request_id": "req_1"}')


async def test_a_retry_recorded_the_old_way_still_counts_as_an_unknown_outcome(store, db_url):
    await store.add_intent("k-old", {"prompt": "a"})
    [first] = await store.claim_intents(1, 30.0, "old-submitter", None)
    assert not first.outcome_unknown
    with psycopg.connect(db_url, autocommit=True) as conn:
        # what 784782a's record_intent_retry wrote after a timeout: no unknown_outcome_at
        conn.execute("UPDATE video_intents SET next_attempt_at = now(), claim_token = NULL, "
                     "consecutive_errors = consecutive_errors + 1, unknown_outcome_at = NULL "
                     "WHERE idempotency_key = 'k-old'")
    [again] = await store.claim_intents(1, 30.0, "new-submitter", None)
    assert again.outcome_unknown
    decision = decide_submit(again, HttpAnswer(402, body=ENVELOPE_402), datetime.now(UTC),
                             PollPolicy(), random.Random(1), SUME)
    assert decision.state == UNKNOWN and decision.state != REJECTED


async def test_an_attempt_given_back_unsent_is_not_an_unknown_outcome(store, db_url):
    await store.add_intent("k-released", {"prompt": "a"})
    [first] = await store.claim_intents(1, 30.0, "s", None)
    await store.release_intent(first, 0.0)  # never sent (a stop, or a refused key)
    [again] = await store.claim_intents(1, 30.0, "s", None)
    assert not again.outcome_unknown  # a 402 now is a plain rejection: nothing was sent before
