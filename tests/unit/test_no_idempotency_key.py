"""A provider whose creates have no idempotency key (Replicate, fal, Veo...): an unknown create
is never sent again blindly. It becomes `reconciling`, looked up in the provider's own records
once they have settled (the submitter: tests/integration/test_reconcile.py)."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime

import pytest

from vidpoll.models import (
    QUEUED,
    RECONCILING,
    REJECTED,
    SUBMITTED,
    ClaimedIntent,
    ErrorClass,
    HttpAnswer,
    SubmitOutcome,
)
from vidpoll.policy import PollPolicy, decide_submit
from vidpoll.providers.sume.rules import SumeRules

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


class NoKeyRules(SumeRules):
    idempotency_header = None


NO_KEY = NoKeyRules()


def decide(answer: HttpAnswer, *, unknown_before: bool = False,
           rules: SumeRules = NO_KEY) -> SubmitOutcome:
    claimed = ClaimedIntent("k", uuid.uuid4(), {"prompt": "x"}, attempts=2, consecutive_errors=0,
                            outcome_unknown=unknown_before)
    out = decide_submit(claimed, answer, NOW, PollPolicy(), random.Random(1), rules)
    assert isinstance(out, SubmitOutcome)
    return out


def envelope(code: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": "no"}}).encode()


@pytest.mark.parametrize("answer", [
    HttpAnswer(None, transport_error=ErrorClass.TIMEOUT),
    HttpAnswer(None, transport_error=ErrorClass.CONNECTION),
    HttpAnswer(500, envelope("internal_error")), HttpAnswer(503, b""),
    HttpAnswer(202, b"{}"),  # accepted, but no job id: a render may run
    HttpAnswer(409, envelope("conflict")),
])
def test_an_unknown_create_is_looked_up_never_sent_again(answer: HttpAnswer) -> None:
    out = decide(answer)
    assert out.state == RECONCILING and out.delay_s == PollPolicy().reconcile_settle_s
    assert "looked up in the provider's own records" in (out.error or "")
    # the same answer from a provider with a key: sent again with that key, soon
    assert decide(answer, rules=SumeRules()).delay_s < 300


def test_clear_answers_stay_clear_without_a_key() -> None:
    assert decide(HttpAnswer(201, b'{"id": "vid_1"}')).state == SUBMITTED
    assert decide(HttpAnswer(422, envelope("invalid_prompt"))).state == REJECTED
    # a 429 created nothing: sent again later, as with a key
    throttled = decide(HttpAnswer(429, envelope("rate_limited"), retry_after="3"))
    assert throttled.state == QUEUED and throttled.delay_s == 3


def test_a_refusal_is_final_without_a_key() -> None:
    # a create without a key goes out only once every earlier one is settled (adopted or
    # proven absent), so a refusal in the provider's envelope proves nothing was billed
    out = decide(HttpAnswer(402, envelope("insufficient_credits")), unknown_before=True)
    assert out.state == REJECTED and out.error_code == "insufficient_credits"
