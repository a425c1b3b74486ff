"""decide(): one status read in, the row's next state and due time out.

Pure: a fixed `now`, a seeded `random.Random`, no database, no socket, no sleep.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.models import GAVE_UP, NOT_FOUND, PENDING, ClaimedJob, ErrorClass, HttpAnswer, Outcome
from vidpoll.policy import (
    AuthPause,
    Misrouted,
    PollPolicy,
    backoff_delay,
    decide,
)
from vidpoll.providers.sume.rules import RULES as SUME

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
POLICY = PollPolicy()
TOKEN = uuid.UUID("00000000-0000-4000-8000-000000000001")


def make_job(*, age_s: float = 60.0, consecutive_errors: int = 0, not_found_count: int = 0,
             job_id: str = "vid_123") -> ClaimedJob:
    """A claimed job that started polling `age_s` seconds before NOW."""
    return ClaimedJob(job_id=job_id, claim_token=TOKEN, due_at=NOW,
                      polling_since=NOW - timedelta(seconds=age_s), polls=3,
                      consecutive_errors=consecutive_errors, not_found_count=not_found_count)


def js(value: Any) -> bytes:
    """JSON bytes, as Sume would send them."""
    return json.dumps(value).encode()


NOT_FOUND_BODY = js({"error": {"code": "not_found", "message": "no such job"}})
"""Sume's own 404: a bare 404 (no envelope) is a wrong URL, not a missing job."""


def run(answer: HttpAnswer, job: ClaimedJob | None = None, policy: PollPolicy = POLICY,
        seed: int = 0) -> Outcome | AuthPause:
    return decide(job or make_job(), answer, NOW, policy, random.Random(seed), SUME)


def outcome(answer: HttpAnswer, job: ClaimedJob | None = None, policy: PollPolicy = POLICY,
            seed: int = 0) -> Outcome:
    result = run(answer, job, policy, seed)
    assert isinstance(result, Outcome), result
    return result


def first_backoff_bounds(policy: PollPolicy = POLICY) -> tuple[float, float]:
    """[low, high] of the delay after a first failure (attempt 1)."""
    exp = min(policy.backoff_max_s, policy.backoff_base_s)
    return max(policy.min_poll_s, exp / 2), max(policy.min_poll_s, exp)


# --- 200, terminal ---------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "state"), [
    ("completed", "completed"),
    ("COMPLETED ", "completed"),
    ("  Failed\n", "failed"),
    ("\tCANCELED", "canceled"),
    ("expired", "expired"),
])
def test_terminal_answer_records_the_lower_cased_stripped_status(raw: str, state: str) -> None:
    body = {"terminal": True, "sume_status": raw, "video_url": "https://cdn.example/v.mp4"}
    out = outcome(HttpAnswer(200, js(body)))
    assert out.state == state
    assert out.provider_status == state
    assert out.read_ok is True
    assert out.is_final is True
    assert out.body == body
    assert out.delay_s == 0.0
    assert out.http_status == 200
    assert out.error is None
    assert out.error_class is None
    assert (out.job_id, out.claim_token) == ("vid_123", TOKEN)


@pytest.mark.parametrize("raw", [None, "", "   ", "pending", " PENDING ", 42, True, ["done"]])
def test_terminal_answer_without_a_usable_status_is_malformed(raw: Any) -> None:
    body: dict[str, Any] = {"terminal": True}
    if raw is not None:
        body["sume_status"] = raw
    out = outcome(HttpAnswer(200, js(body)))
    assert out.state == PENDING
    assert out.read_ok is False
    assert out.error_class is ErrorClass.MALFORMED
    assert out.error is not None
    assert "sume_status" in out.error
    assert out.body == body
    low, high = first_backoff_bounds()
    assert low <= out.delay_s <= high


def test_terminal_answer_past_the_deadline_still_records_the_terminal_state() -> None:
    job = make_job(age_s=POLICY.max_age_s + 10_000)
    out = outcome(HttpAnswer(200, js({"terminal": True, "sume_status": "Completed"})), job)
    assert out.state == "completed"
    assert out.read_ok is True


def test_long_provider_status_is_cut_for_the_state_column() -> None:
    out = outcome(HttpAnswer(200, js({"terminal": True, "sume_status": "x" * 100})))
    assert out.state == "x" * 64


# --- 200, not terminal -----------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "delay"), [
    (30, 30.0),
    (2.5, 2.5),
    ("45", 45.0),
    (" 7.5 ", 7.5),
    ("1e2", 100.0),
    (0, 1.0),
    (0.2, 1.0),
    (1_000_000, 3600.0),
    ("99999", 3600.0),
])
def test_not_terminal_uses_next_poll_after_seconds_clamped(raw: Any, delay: float) -> None:
    body = {"terminal": False, "sume_status": "RUNNING", "next_poll_after_seconds": raw}
    out = outcome(HttpAnswer(200, js(body)))
    assert out.state == PENDING
    assert out.read_ok is True
    assert out.delay_s == delay
    assert out.provider_status == "running"
    assert out.body == body
    assert out.error_class is None
    assert out.is_final is False


@pytest.mark.parametrize("raw", [
    "absent", None, -1, -0.5, "soon", "", [], {}, True, False, "nan", "inf", "-inf",
])
def test_not_terminal_without_a_usable_hint_waits_the_default(raw: Any) -> None:
    body: dict[str, Any] = {"terminal": False, "sume_status": "queued"}
    if raw != "absent":
        body["next_poll_after_seconds"] = raw
    out = outcome(HttpAnswer(200, js(body)))
    assert out.state == PENDING
    assert out.read_ok is True
    assert out.delay_s == 15.0


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_standard_json_literals_make_the_body_malformed(literal: bytes) -> None:
    # Python's json accepts NaN/Infinity; PostgreSQL's jsonb does not, so the body could not
    # be stored: it is a malformed answer (backoff), never a write that fails the batch.
    body = b'{"terminal": false, "next_poll_after_seconds": ' + literal + b"}"
    out = outcome(HttpAnswer(200, body))
    assert out.state == "pending" and out.error_class is ErrorClass.MALFORMED
    assert out.body is None


@pytest.mark.parametrize("body", [b'{"terminal": false, "x": "\\u0000"}',
                                  b'{"terminal": true, "sume_status": "\\ud800"}',
                                  b"[" * 100_000])
def test_bodies_postgres_cannot_store_are_malformed(body: bytes) -> None:
    out = outcome(HttpAnswer(200, body))
    assert out.error_class is ErrorClass.MALFORMED and out.body is None


def test_not_terminal_clamps_to_a_custom_policy() -> None:
    policy = PollPolicy(min_poll_s=5.0, max_poll_s=60.0)
    low = outcome(HttpAnswer(200, js({"terminal": False, "next_poll_after_seconds": 1})),
                  policy=policy)
    high = outcome(HttpAnswer(200, js({"terminal": False, "next_poll_after_seconds": 600})),
                   policy=policy)
    assert (low.delay_s, high.delay_s) == (5.0, 60.0)


def test_not_terminal_past_the_deadline_gives_up() -> None:
    body = {"terminal": False, "sume_status": "running", "next_poll_after_seconds": 30}
    at_deadline = outcome(HttpAnswer(200, js(body)), make_job(age_s=POLICY.max_age_s))
    just_before = outcome(HttpAnswer(200, js(body)), make_job(age_s=POLICY.max_age_s - 1))
    assert at_deadline.state == GAVE_UP
    assert at_deadline.is_final is True
    assert at_deadline.read_ok is True
    assert just_before.state == PENDING


def test_other_2xx_is_read_like_200() -> None:
    out = outcome(HttpAnswer(202, js({"terminal": True, "sume_status": "completed"})))
    assert out.state == "completed"
    assert out.http_status == 202


# --- 429 / 503 -------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "cls"), [
    (429, ErrorClass.RATE_LIMITED),
    (503, ErrorClass.UNAVAILABLE),
])
@pytest.mark.parametrize(("retry_after", "delay"), [
    ("30", 30.0),
    (" 12 ", 12.0),
    ("2.5", 2.5),
    ("0", 1.0),
    ("-5", 1.0),
    ("86400", 3600.0),
    (format_datetime(NOW + timedelta(seconds=120), usegmt=True), 120.0),
    (format_datetime(NOW + timedelta(days=3), usegmt=True), 3600.0),
    (format_datetime(NOW - timedelta(hours=1), usegmt=True), 1.0),
])
def test_retry_after_is_honoured_and_clamped(status: int, cls: ErrorClass, retry_after: str,
                                             delay: float) -> None:
    out = outcome(HttpAnswer(status, b"", retry_after=retry_after))
    assert out.state == PENDING
    assert out.error_class is cls
    assert out.read_ok is False
    assert out.http_status == status
    assert out.delay_s == pytest.approx(delay)


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("retry_after", [None, "", "soon", "inf", "nan", "Mon, 99 Foo"])
def test_unusable_retry_after_falls_back_to_backoff(status: int, retry_after: str | None
                                                    ) -> None:
    job = make_job(consecutive_errors=4)  # attempt 5: exp = 2 * 2**4 = 32
    delays = {outcome(HttpAnswer(status, b"", retry_after=retry_after), job, seed=s).delay_s
              for s in range(20)}
    assert all(16.0 <= d <= 32.0 for d in delays), delays
    assert len(delays) > 1, "backoff must be jittered"


def test_retry_after_respects_a_custom_window() -> None:
    policy = PollPolicy(min_poll_s=10.0, max_poll_s=100.0)
    assert outcome(HttpAnswer(429, b"", retry_after="3"), policy=policy).delay_s == 10.0
    assert outcome(HttpAnswer(429, b"", retry_after="300"), policy=policy).delay_s == 100.0


# --- errors that stay pending and back off ---------------------------------------------------

ERROR_CASES = [
    pytest.param(HttpAnswer(500), ErrorClass.SERVER_ERROR, id="500"),
    pytest.param(HttpAnswer(502, b"<html>Bad Gateway</html>"), ErrorClass.SERVER_ERROR,
                 id="502-html"),
    pytest.param(HttpAnswer(504), ErrorClass.SERVER_ERROR, id="504"),
    pytest.param(HttpAnswer(400, js({"error": {"code": "bad_request"}})),
                 ErrorClass.CLIENT_ERROR, id="400"),
    pytest.param(HttpAnswer(422, js({"error": {"code": "invalid_request"}})),
                 ErrorClass.CLIENT_ERROR, id="422"),
    pytest.param(HttpAnswer(None, transport_error=ErrorClass.TIMEOUT, detail="no answer"),
                 ErrorClass.TIMEOUT, id="timeout"),
    pytest.param(HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                            detail="ConnectionResetError"), ErrorClass.CONNECTION,
                 id="connection"),
    pytest.param(HttpAnswer(200, b"not json at all"), ErrorClass.MALFORMED, id="non-json"),
    pytest.param(HttpAnswer(200, b""), ErrorClass.MALFORMED, id="empty-body"),
    pytest.param(HttpAnswer(200, b"\xff\xfe\x00garbage"), ErrorClass.MALFORMED, id="bad-utf8"),
    pytest.param(HttpAnswer(200, b"<!doctype html><html><body>Login</body></html>"),
                 ErrorClass.MALFORMED, id="html"),
    pytest.param(HttpAnswer(200, js([{"terminal": True, "sume_status": "completed"}])),
                 ErrorClass.MALFORMED, id="json-array"),
    pytest.param(HttpAnswer(200, js("completed")), ErrorClass.MALFORMED, id="json-string"),
    pytest.param(HttpAnswer(200, b"null"), ErrorClass.MALFORMED, id="json-null"),
    # no usable flag and no status word (with a word, the word decides: test_status_shapes)
    pytest.param(HttpAnswer(200, js({"job_id": "vid_123"})), ErrorClass.MALFORMED,
                 id="terminal-missing"),
    pytest.param(HttpAnswer(200, js({"terminal": "true", "sume_status": 3})),
                 ErrorClass.MALFORMED, id="terminal-string"),
    pytest.param(HttpAnswer(200, js({"terminal": 1})), ErrorClass.MALFORMED, id="terminal-int"),
    pytest.param(HttpAnswer(200, js({"terminal": None, "sume_status": "  "})),
                 ErrorClass.MALFORMED, id="terminal-null"),
]


@pytest.mark.parametrize(("answer", "cls"), ERROR_CASES)
def test_errors_stay_pending_with_their_class_and_back_off(answer: HttpAnswer,
                                                          cls: ErrorClass) -> None:
    out = outcome(answer)
    assert out.state == PENDING
    assert out.error_class is cls
    assert out.read_ok is False
    assert out.http_status == answer.status
    assert out.provider_status is None
    assert out.error
    low, high = first_backoff_bounds()
    assert low <= out.delay_s <= high
    assert out.delay_s >= POLICY.min_poll_s


@pytest.mark.parametrize(("answer", "cls"), ERROR_CASES)
def test_errors_past_the_deadline_give_up(answer: HttpAnswer, cls: ErrorClass) -> None:
    out = outcome(answer, make_job(age_s=POLICY.max_age_s + 1))
    assert out.state == GAVE_UP
    assert out.error_class is cls
    assert out.is_final is True


@pytest.mark.parametrize("attempt", range(1, 14))
def test_backoff_grows_exponentially_within_equal_jitter_bounds(attempt: int) -> None:
    job = make_job(consecutive_errors=attempt - 1)
    exp = min(POLICY.backoff_max_s, POLICY.backoff_base_s * 2 ** (attempt - 1))
    low, high = max(POLICY.min_poll_s, exp / 2), max(POLICY.min_poll_s, exp)
    for seed in range(30):
        delay = outcome(HttpAnswer(500), job, seed=seed).delay_s
        assert low <= delay <= high, (attempt, seed, delay)
        assert delay <= POLICY.backoff_max_s


def test_backoff_never_shrinks_as_errors_pile_up() -> None:
    for seed in range(20):
        delays = [outcome(HttpAnswer(500), make_job(consecutive_errors=n), seed=seed).delay_s
                  for n in range(12)]
        assert delays == sorted(delays), delays
        assert delays[0] <= 2.0
        assert delays[-1] >= POLICY.backoff_max_s / 2


def test_backoff_caps_even_after_very_many_errors() -> None:
    out = outcome(HttpAnswer(500), make_job(consecutive_errors=10_000))
    assert POLICY.backoff_max_s / 2 <= out.delay_s <= POLICY.backoff_max_s


def test_backoff_is_floored_at_min_poll() -> None:
    policy = PollPolicy(min_poll_s=5.0, backoff_base_s=2.0)
    assert outcome(HttpAnswer(500), policy=policy).delay_s == 5.0


def test_backoff_delay_treats_attempt_zero_as_the_first() -> None:
    assert backoff_delay(0, POLICY, random.Random(0)) == backoff_delay(1, POLICY,
                                                                       random.Random(0))
    assert 1.0 <= backoff_delay(0, POLICY, random.Random(0)) <= 2.0


def test_backoff_honours_an_explicit_cap() -> None:
    delays = [backoff_delay(20, POLICY, random.Random(s), cap_s=10.0) for s in range(20)]
    assert all(5.0 <= d <= 10.0 for d in delays), delays


# --- 401 / 403 -------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_pause_instead_of_touching_the_row(status: int) -> None:
    body = js({"error": {"code": "invalid_api_key", "message": "key revoked"},
               "request_id": "req_1"})
    result = run(HttpAnswer(status, body))
    assert isinstance(result, AuthPause)
    assert result.http_status == status
    # only the code: the provider's message may echo part of the rejected key
    assert result.detail == f"HTTP {status}: invalid_api_key"


def test_auth_failure_past_the_deadline_is_still_a_pause() -> None:
    result = run(HttpAnswer(401), make_job(age_s=POLICY.max_age_s * 2))
    assert isinstance(result, AuthPause)
    assert result.detail == "HTTP 401"


# --- 404 -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("not_found_count", "age_s", "state"), [
    (0, 60.0, PENDING),
    (6, 60.0, PENDING),           # 7th 404 of 8
    (7, 60.0, NOT_FOUND),         # 8th 404: tries exhausted
    (50, 60.0, NOT_FOUND),
    (1, 3600.0, PENDING),         # old, but only the 2nd try
    (2, 3600.0, NOT_FOUND),       # old and the 3rd try
    (2, 3599.0, PENDING),         # 3rd try, but not old yet
    (0, 48 * 3600.0, GAVE_UP),    # past the polling deadline, not yet gone
    (7, 48 * 3600.0, NOT_FOUND),  # gone wins over the deadline
])
def test_not_found_stays_pending_until_tries_or_age_run_out(not_found_count: int,
                                                            age_s: float, state: str) -> None:
    job = make_job(not_found_count=not_found_count, age_s=age_s)
    out = outcome(HttpAnswer(404, js({"error": {"code": "job_not_found", "message": "no job"}})),
                  job)
    assert out.state == state
    assert out.error_class is ErrorClass.NOT_FOUND
    assert out.read_ok is False
    assert out.http_status == 404
    assert out.error == "HTTP 404: job_not_found: no job"


def test_not_found_with_a_custom_policy() -> None:
    policy = PollPolicy(not_found_max_tries=1)
    assert outcome(HttpAnswer(404, NOT_FOUND_BODY), policy=policy).state == NOT_FOUND
    policy = PollPolicy(not_found_max_age_s=10.0, not_found_min_tries_when_old=1)
    gone = HttpAnswer(404, NOT_FOUND_BODY)
    assert outcome(gone, make_job(age_s=10.0), policy=policy).state == NOT_FOUND
    assert outcome(gone, make_job(age_s=9.0), policy=policy).state == PENDING


def test_not_found_backoff_follows_consecutive_errors() -> None:
    out = outcome(HttpAnswer(404, NOT_FOUND_BODY),
                  make_job(consecutive_errors=3, not_found_count=0))
    assert 8.0 <= out.delay_s <= 16.0


# --- error text and request id ---------------------------------------------------------------

def test_error_text_carries_the_envelope_code_and_message() -> None:
    body = js({"error": {"code": "overloaded", "message": "try again later"},
               "request_id": "req_abc"})
    out = outcome(HttpAnswer(503, body, request_id="hdr_1"))
    assert out.error == "HTTP 503: overloaded: try again later"
    assert out.request_id == "req_abc"
    assert out.body == json.loads(body)


def test_error_text_with_code_only() -> None:
    out = outcome(HttpAnswer(500, js({"error": {"code": "internal"}})))
    assert out.error == "HTTP 500: internal"


def test_error_text_falls_back_to_transport_detail() -> None:
    out = outcome(HttpAnswer(None, transport_error=ErrorClass.TIMEOUT,
                             detail="no answer within 15 s"))
    assert out.error == "timeout: no answer within 15 s"
    assert out.http_status is None
    assert out.request_id is None


def test_error_text_is_bounded() -> None:
    body = js({"error": {"code": "big", "message": "x" * 5000}})
    out = outcome(HttpAnswer(500, body))
    assert out.error is not None
    assert len(out.error) == 500
    assert out.error.startswith("HTTP 500: big: xxx")


@pytest.mark.parametrize(("body", "header", "expected"), [
    (js({"terminal": False, "request_id": "req_body"}), "req_hdr", "req_body"),
    (js({"terminal": False}), "req_hdr", "req_hdr"),
    (js({"terminal": False, "request_id": 12345}), "req_hdr", "req_hdr"),
    (b"<html>oops</html>", "req_hdr", "req_hdr"),
    (js({"terminal": False}), None, None),
])
def test_request_id_comes_from_the_body_then_the_header(body: bytes, header: str | None,
                                                        expected: str | None) -> None:
    assert outcome(HttpAnswer(200, body, request_id=header)).request_id == expected


def test_request_id_from_the_body_of_an_error() -> None:
    body = js({"error": {"code": "boom", "message": "m"}, "request_id": "req_err"})
    assert outcome(HttpAnswer(500, body, request_id="hdr")).request_id == "req_err"


def test_request_id_from_the_body_is_bounded() -> None:
    out = outcome(HttpAnswer(200, js({"terminal": False, "request_id": "r" * 1000})))
    assert out.request_id == "r" * 200


# --- a JSON integer too large for a float (found by review) ---------------------------------

def test_huge_integer_poll_hint_does_not_raise() -> None:
    body = b'{"terminal": false, "next_poll_after_seconds": ' + b"9" * 400 + b"}"
    out = outcome(HttpAnswer(200, body))
    assert out.delay_s == POLICY.max_poll_s


# --- properties ------------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-(10**15), 10**15)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(json_scalars,
                           lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=10)
status_words = st.sampled_from(["completed", "FAILED ", "pending", "running", "", "  "])
sume_like = st.fixed_dictionaries({}, optional={
    "terminal": st.booleans() | json_scalars,
    "sume_status": status_words | json_scalars,
    "next_poll_after_seconds": json_scalars | st.integers(-(10**6), 10**6).map(str),
    "request_id": json_scalars,
    "error": st.fixed_dictionaries({}, optional={"code": json_scalars,
                                                 "message": json_scalars}) | json_values,
}).map(js)
bodies = st.binary(max_size=64) | json_values.map(js) | sume_like
retry_afters = (st.none() | st.text(max_size=30)
                | st.floats(allow_nan=True, allow_infinity=True).map(str)
                | st.integers(-(10**6), 10**9).map(str)
                | st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1),
                               timezones=st.just(UTC)).map(
                                   lambda d: format_datetime(d, usegmt=True)))
answers = st.one_of(
    st.builds(HttpAnswer, status=st.integers(100, 599), body=bodies, retry_after=retry_afters,
              request_id=st.none() | st.text(max_size=20)),
    st.builds(HttpAnswer, status=st.none() | st.integers(100, 599), body=bodies,
              transport_error=st.sampled_from(list(ErrorClass)), detail=st.text(max_size=40)),
)
jobs = st.builds(
    lambda age, errors, nf: make_job(age_s=age, consecutive_errors=errors, not_found_count=nf),
    st.floats(0, 4 * POLICY.max_age_s), st.integers(0, 500), st.integers(0, 50))


@st.composite
def policies(draw: st.DrawFn) -> PollPolicy:
    min_poll = draw(st.floats(0.01, 30))
    return PollPolicy(
        default_poll_s=draw(st.floats(0, 10_000)),
        min_poll_s=min_poll,
        max_poll_s=draw(st.floats(min_poll, 10_000)),
        backoff_base_s=draw(st.floats(0.01, 100)),
        backoff_max_s=draw(st.floats(0.01, 1000)),
        not_found_max_tries=draw(st.integers(1, 20)),
        max_age_s=draw(st.floats(1, 10 * 24 * 3600)),
    )


def check_delay(result: Outcome | AuthPause, policy: PollPolicy) -> None:
    if isinstance(result, Misrouted):  # a 4xx without Sume's envelope: a wrong URL
        assert 400 <= result.http_status < 500
        assert result.row_outcome.state != NOT_FOUND
        check_delay(result.row_outcome, policy)
        return
    if isinstance(result, AuthPause):
        assert result.http_status in (401, 403)
        return
    assert math.isfinite(result.delay_s)
    assert result.delay_s >= 0
    if result.state == PENDING:
        assert result.delay_s >= policy.min_poll_s
        assert result.delay_s <= max(policy.max_poll_s, policy.backoff_max_s)
    if result.read_ok:
        assert result.error_class is None
    else:
        assert result.error_class is not None
        assert result.error is not None


@given(answer=answers, job=jobs, seed=st.integers(0, 2**32))
def test_decide_never_raises_and_pending_delays_are_bounded(answer: HttpAnswer,
                                                            job: ClaimedJob, seed: int) -> None:
    result = decide(job, answer, NOW, POLICY, random.Random(seed), SUME)
    check_delay(result, POLICY)


@given(answer=answers, job=jobs, policy=policies(), seed=st.integers(0, 2**32))
def test_decide_bounds_hold_for_any_valid_policy(answer: HttpAnswer, job: ClaimedJob,
                                                 policy: PollPolicy, seed: int) -> None:
    result = decide(job, answer, NOW, policy, random.Random(seed), SUME)
    check_delay(result, policy)
