"""decide_submit() after an unknown outcome (issue 15, item 3): a refusal is no proof that
nothing was billed. Pure: a fixed `now`, a seeded random source, no database, no socket."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime

import pytest

from vidpoll.models import (
    QUEUED,
    REJECTED,
    SUBMITTED,
    UNKNOWN,
    UNKNOWN_RESEND_MAX_S,
    ClaimedIntent,
    ErrorClass,
    HttpAnswer,
    SubmitOutcome,
)
from vidpoll.policy import (
    AuthPause,
    PollPolicy,
    decide_submit,
    unknown_resend_delay,
)
from vidpoll.providers.sume.rules import RULES as SUME

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
POLICY = PollPolicy()


def intent(*, state: str = QUEUED, outcome_unknown: bool = False,
           attempts: int = 2) -> ClaimedIntent:
    return ClaimedIntent("k-1", uuid.uuid4(), {"prompt": "x"}, attempts=attempts,
                         consecutive_errors=1, state=state, outcome_unknown=outcome_unknown)


def envelope(code: str, message: str = "msg") -> bytes:
    return json.dumps({"error": {"code": code, "message": message},
                       "request_id": "req_402"}).encode()


def decide(claimed: ClaimedIntent, answer: HttpAnswer, policy: PollPolicy = POLICY,
           seed: int = 1) -> SubmitOutcome:
    out = decide_submit(claimed, answer, NOW, policy, random.Random(seed), SUME)
    assert isinstance(out, SubmitOutcome), out
    return out


REFUSALS = [
    pytest.param(HttpAnswer(402, envelope("insufficient_credits")), id="402"),
    pytest.param(HttpAnswer(422, envelope("invalid_request")), id="422"),
    pytest.param(HttpAnswer(400, envelope("bad_request")), id="400"),
    pytest.param(HttpAnswer(404, envelope("not_found")), id="404"),
]


@pytest.mark.parametrize("answer", REFUSALS)
def test_a_refusal_after_an_unknown_outcome_is_unknown_not_rejected(answer):
    out = decide(intent(outcome_unknown=True), answer)
    assert out.state == UNKNOWN
    assert out.error_code is not None and out.error_message == "msg"
    assert out.request_id == "req_402"
    assert 0 < out.delay_s <= UNKNOWN_RESEND_MAX_S


@pytest.mark.parametrize("answer", REFUSALS)
def test_a_refusal_with_every_earlier_answer_clear_is_still_a_rejection(answer):
    out = decide(intent(outcome_unknown=False, attempts=1), answer)
    assert out.state == REJECTED


@pytest.mark.parametrize("answer", REFUSALS)
def test_an_unknown_intent_refused_again_stays_unknown(answer):
    assert decide(intent(state=UNKNOWN, outcome_unknown=True), answer).state == UNKNOWN


@pytest.mark.parametrize("answer", [
    pytest.param(HttpAnswer(None, transport_error=ErrorClass.TIMEOUT), id="timeout"),
    pytest.param(HttpAnswer(503, envelope("internal_error"), retry_after="3600"),
                 id="503-long-retry-after"),
    pytest.param(HttpAnswer(429, envelope("rate_limit_exceeded"), retry_after="86400"),
                 id="429-day"),
    pytest.param(HttpAnswer(202, b"{}"), id="2xx-no-id"),
    pytest.param(HttpAnswer(302, b"<html>moved</html>"), id="redirect"),
    # (a proxy's 404 without Sume's envelope pauses the account instead, the intent untouched:
    # test_submit_rules.test_a_4xx_without_sumes_envelope_pauses_and_records_nothing)
])
def test_an_unknown_intent_without_an_answer_stays_unknown_and_is_resent_within_2_minutes(
        answer):
    out = decide(intent(state=UNKNOWN, outcome_unknown=True), answer)
    assert out.state == UNKNOWN
    assert out.error_class is not None
    assert POLICY.min_poll_s <= out.delay_s <= UNKNOWN_RESEND_MAX_S == 120.0


def test_an_unknown_intent_answered_with_its_job_is_submitted():
    out = decide(intent(state=UNKNOWN, outcome_unknown=True),
                 HttpAnswer(202, json.dumps({"job_id": "vid_1"}).encode()))
    assert (out.state, out.job_id) == (SUBMITTED, "vid_1")


def test_a_refused_key_never_settles_an_unknown_intent():
    out = decide_submit(intent(state=UNKNOWN, outcome_unknown=True),
                        HttpAnswer(401, envelope("unauthorized")), NOW, POLICY,
                        random.Random(1), SUME)
    assert isinstance(out, AuthPause)


def test_a_queued_intent_retried_stays_queued_with_its_backoff():
    # the memory of the unknown outcome is written by the store (record_intent_retry)
    out = decide(intent(), HttpAnswer(None, transport_error=ErrorClass.TIMEOUT))
    assert out.state == QUEUED


@pytest.mark.parametrize("seed", range(50))
def test_the_slow_schedule_is_about_a_minute_and_never_past_two(seed):
    delay = unknown_resend_delay(POLICY, random.Random(seed))
    assert 45.0 <= delay <= 60.0
    slow = PollPolicy(unknown_resend_s=3600)
    assert unknown_resend_delay(slow, random.Random(seed)) <= UNKNOWN_RESEND_MAX_S
    assert unknown_resend_delay(POLICY, random.Random(seed), hinted_s=10**6) == 120.0
    fast = PollPolicy(min_poll_s=0.05, unknown_resend_s=0.2)
    assert 0.15 <= unknown_resend_delay(fast, random.Random(seed)) <= 0.2
