"""Pure rules of submission: classifying a create answer, keys, payloads, bulk lines."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.bulk import BadLine, BulkLine, KeyDeriver, parse_param
from vidpoll.config import Settings
from vidpoll.errors import ConfigError, InvalidIntent
from vidpoll.models import (
    QUEUED,
    REJECTED,
    SUBMITTED,
    UNKNOWN,
    ClaimedIntent,
    ErrorClass,
    HttpAnswer,
    SubmitOutcome,
)
from vidpoll.policy import (
    AuthPause,
    MisroutedCreate,
    PollPolicy,
    decide_submit,
    validate_key,
    validate_payload,
)
from vidpoll.providers.sume.rules import RULES as SUME
from vidpoll.providers.sume.rules import (
    created_job_id,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
POLICY = PollPolicy()


def intent(errors: int = 0) -> ClaimedIntent:
    return ClaimedIntent("k-1", uuid.uuid4(), {"prompt": "x"}, attempts=1,
                         consecutive_errors=errors)


def envelope(code: str, message: str = "msg") -> bytes:
    return json.dumps({"error": {"code": code, "message": message},
                       "request_id": "req_abc"}).encode()


def decide(answer: HttpAnswer, errors: int = 0) -> SubmitOutcome | AuthPause:
    return decide_submit(intent(errors), answer, NOW, POLICY, random.Random(1), SUME)


@pytest.mark.parametrize("body", [
    {"job_id": "vid_1"}, {"id": "vid_1"}, {"data": {"job_id": "vid_1"}}, {"data": {"id": "vid_1"}},
])
@pytest.mark.parametrize("status", [200, 201, 202])
def test_a_2xx_with_a_job_id_is_submitted(status, body):
    out = decide(HttpAnswer(status, json.dumps(body).encode()))
    assert isinstance(out, SubmitOutcome)
    assert (out.state, out.job_id, out.error_class) == (SUBMITTED, "vid_1", None)


@pytest.mark.parametrize("body", [b"", b"<html>", b"[]", b'{"job_id": 5}', b'{"job_id": ""}',
                                  b'{"status": "queued"}', b'{"job_id": "a\\u0000b"}',
                                  json.dumps({"job_id": "x" * 2000}).encode()])
def test_a_2xx_without_a_usable_job_id_is_an_unknown_outcome(body):
    out = decide(HttpAnswer(202, body))
    assert isinstance(out, SubmitOutcome)
    assert out.state == QUEUED and out.error_class is ErrorClass.MALFORMED and out.delay_s > 0


@pytest.mark.parametrize(("answer", "cls"), [
    pytest.param(HttpAnswer(None, transport_error=ErrorClass.TIMEOUT), ErrorClass.TIMEOUT,
                 id="timeout"),
    pytest.param(HttpAnswer(None, transport_error=ErrorClass.CONNECTION),
                 ErrorClass.CONNECTION, id="connection"),
    pytest.param(HttpAnswer(500, envelope("internal_error")), ErrorClass.SERVER_ERROR,
                 id="500"),
    pytest.param(HttpAnswer(502, b"<html>bad gateway</html>"), ErrorClass.SERVER_ERROR,
                 id="502-html"),
    pytest.param(HttpAnswer(503, b""), ErrorClass.UNAVAILABLE, id="503"),
    pytest.param(HttpAnswer(408, b""), ErrorClass.TIMEOUT, id="408"),
    pytest.param(HttpAnswer(409, envelope("idempotency_in_progress")), ErrorClass.CONFLICT,
                 id="409"),
    pytest.param(HttpAnswer(429, envelope("rate_limit_exceeded")), ErrorClass.RATE_LIMITED,
                 id="429"),
    pytest.param(HttpAnswer(425, b""), ErrorClass.CLIENT_ERROR, id="425-not-sume"),
    pytest.param(HttpAnswer(302, b""), ErrorClass.CLIENT_ERROR, id="302"),
])
def test_unknown_outcomes_keep_the_intent_queued_with_backoff(answer, cls):
    out = decide(answer)
    assert isinstance(out, SubmitOutcome)
    assert out.state == QUEUED and out.error_class is cls
    assert out.job_id is None and out.error_code is None
    assert POLICY.min_poll_s <= out.delay_s <= POLICY.backoff_max_s


def test_backoff_grows_with_consecutive_errors():
    first = decide(HttpAnswer(500, b""), errors=0)
    tenth = decide(HttpAnswer(500, b""), errors=9)
    assert isinstance(first, SubmitOutcome) and isinstance(tenth, SubmitOutcome)
    assert first.delay_s <= 2.0 and tenth.delay_s >= POLICY.backoff_max_s / 2


@pytest.mark.parametrize("status", [429, 503, 500, 409])
def test_retry_after_is_honoured(status):
    out = decide(HttpAnswer(status, b"", retry_after="42"))
    assert isinstance(out, SubmitOutcome) and out.delay_s == 42.0


@pytest.mark.parametrize(("status", "code"), [(402, "insufficient_credits"),
                                              (422, "invalid_request"), (400, "bad_request"),
                                              (404, "not_found"), (413, "payload_too_large")])
def test_sume_refusing_in_its_own_words_is_a_final_rejection(status, code):
    out = decide(HttpAnswer(status, envelope(code, "why it was refused")))
    assert isinstance(out, SubmitOutcome)
    assert out.state == REJECTED
    assert (out.error_code, out.error_message, out.request_id) == (
        code, "why it was refused", "req_abc")


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_pause_and_never_reject(status):
    out = decide(HttpAnswer(status, envelope("unauthorized", "key sk-abc is wrong")))
    assert isinstance(out, AuthPause)
    assert "sk-abc" not in out.detail


@pytest.mark.parametrize(("answer", "kind"), [
    pytest.param(HttpAnswer(404, b"404: Not Found"), "plain text", id="404-wrong-path"),
    pytest.param(HttpAnswer(400, b"<html>proxy</html>"), "an HTML page", id="400-proxy"),
    pytest.param(HttpAnswer(405, b""), "an empty body", id="405"),
    pytest.param(HttpAnswer(404, b'{"detail": "Not Found"}'), "JSON without an error envelope",
                 id="404-framework-json"),
])
@pytest.mark.parametrize("state", [QUEUED, UNKNOWN])
def test_a_4xx_without_sumes_envelope_pauses_and_records_nothing(answer, kind, state):
    # a wrong URL or a proxy: the request never reached Sume's create; the account's
    # submitting pauses (a status read probes it), the intent is given back untouched: no
    # attempt counted, no unknown outcome recorded (issue 17)
    claimed = ClaimedIntent("k-1", uuid.uuid4(), {"prompt": "x"}, attempts=1,
                            consecutive_errors=0, state=state, outcome_unknown=state == UNKNOWN)
    out = decide_submit(claimed, answer, NOW, POLICY, random.Random(1), SUME)
    assert isinstance(out, MisroutedCreate) and isinstance(out, AuthPause)
    assert out.http_status == answer.status and out.detail == f"HTTP {answer.status} ({kind})"


def test_created_job_id_ignores_non_objects():
    assert created_job_id(None) is None
    assert created_job_id({"data": "x"}) is None


@given(st.binary(max_size=300), st.integers(100, 599))
def test_any_answer_is_classified(body, status):
    out = decide(HttpAnswer(status, body))
    if isinstance(out, SubmitOutcome):
        assert out.state in (QUEUED, SUBMITTED, REJECTED)
        if out.state == SUBMITTED:
            assert 200 <= status < 300 and out.job_id
        if out.state == REJECTED:
            assert 400 <= status < 500 and status not in (401, 403, 408, 409, 429)
    elif isinstance(out, MisroutedCreate):
        assert 400 <= status < 500 and status not in (401, 403, 408, 409, 425, 429)
    else:
        assert status in (401, 403)


@pytest.mark.parametrize("key", ["k", "0f8fa0a3-4c5e-4a7e-9a83-0e4a1b0c7d12", "a:b/c?d#e",
                                 "x" * 255])
def test_valid_keys(key):
    assert validate_key(key) == key


@pytest.mark.parametrize("key", ["", " ", "a b", "a\nb", "a\r\nX-Evil: 1", "é", "x" * 256,
                                 "\x00", "tab\there"])
def test_invalid_keys_are_refused_with_a_reason(key):
    with pytest.raises(InvalidIntent, match="idempotency key"):
        validate_key(key)


@pytest.mark.parametrize("payload", [[], "prompt", None, {"x": float("nan")},
                                     {"x": "a\x00b"}, {"x": {1, 2}}, {"x": "\ud800"}])
def test_unstorable_payloads_are_refused(payload):
    with pytest.raises(InvalidIntent):
        validate_payload(payload)


def test_bulk_keys_are_stable_and_distinct():
    lines = ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": "a"}', "",
             '{"prompt": "c", "priority": 3}', '{"id": 7, "prompt": "d"}',
             '{"key": "mine", "payload": {"prompt": "e"}}']
    first_run, second_run = KeyDeriver("p-"), KeyDeriver("p-")
    first = [first_run.parse(i + 1, t) for i, t in enumerate(lines)]
    again = [second_run.parse(i + 1, t) for i, t in enumerate(lines)]
    assert first == again
    parsed = [x for x in first if isinstance(x, BulkLine)]
    assert first[3] is None
    keys = [x.key for x in parsed]
    assert len(set(keys)) == len(keys) == 6
    assert keys[2] == keys[0] + ".2"  # an identical line is a second render, not a duplicate
    assert keys[4] == "p-7" and keys[5] == "mine"
    assert parsed[3].priority == 3 and parsed[3].payload == {"prompt": "c"}
    assert parsed[5].payload == {"prompt": "e"}


def test_bulk_keys_do_not_depend_on_line_numbers():
    a = KeyDeriver().parse(1, '{"prompt": "x"}')
    b = KeyDeriver().parse(500, '{"prompt": "x"}')
    assert isinstance(a, BulkLine) and isinstance(b, BulkLine) and a.key == b.key


@pytest.mark.parametrize(("text", "reason"), [
    ("not json", "not JSON"), ("[1, 2]", "JSON object"), ('{"priority": "high"}', "priority"),
    ('{"key": "a b", "prompt": "x"}', "idempotency key"), ('{"key": 5}', "'key'"),
    ('{"id": [1]}', "'id'"), ('{"payload": [1]}', "payload"), ('{"x": NaN}', "not JSON"),
])
def test_bad_bulk_lines_say_why(text, reason):
    out = KeyDeriver().parse(3, text)
    assert isinstance(out, BadLine) and out.line_no == 3 and reason in out.reason


@pytest.mark.parametrize(("text", "expected"), [
    ("duration=8", ("duration", 8)), ("loop=true", ("loop", True)),
    ("style=noir", ("style", "noir")), ("meta={\"a\": 1}", ("meta", {"a": 1})),
    ("empty=", ("empty", "")), ("eq=a=b", ("eq", "a=b")),
])
def test_params(text, expected):
    assert parse_param(text) == expected


@pytest.mark.parametrize("text", ["noequals", "=value"])
def test_bad_params(text):
    with pytest.raises(InvalidIntent):
        parse_param(text)


@pytest.mark.parametrize(("raw", "expected"), [("", 50), ("7", 7), ("unlimited", None),
                                               ("None", None)])
def test_max_active_setting(raw, expected):
    assert Settings.from_env({"VIDPOLL_MAX_ACTIVE": raw}).max_active == expected


@pytest.mark.parametrize("raw", ["0", "-1", "many", "1.5"])
def test_bad_max_active_setting(raw):
    with pytest.raises(ConfigError, match="VIDPOLL_MAX_ACTIVE"):
        Settings.from_env({"VIDPOLL_MAX_ACTIVE": raw})


def test_bulk_default_priority_applies_to_lines_without_one():
    deriver = KeyDeriver(default_priority=7)
    a = deriver.parse(1, '{"prompt": "a"}')
    b = deriver.parse(2, '{"prompt": "b", "priority": -1}')
    assert isinstance(a, BulkLine) and isinstance(b, BulkLine)
    assert (a.priority, b.priority) == (7, -1)


def _claim(attempts: int = 1):
    from vidpoll.models import ClaimedResult

    return ClaimedResult("j1", uuid.uuid4(), attempts)


@pytest.mark.parametrize(("answer", "state"), [
    (HttpAnswer(200, b'{"videos": []}'), "fetched"),
    (HttpAnswer(200, b"<html>"), "pending"),
    (HttpAnswer(409, envelope("job_not_completed")), "pending"),
    (HttpAnswer(404, envelope("not_found")), "pending"),
    (HttpAnswer(429, envelope("rate_limit_exceeded"), retry_after="7"), "pending"),
    (HttpAnswer(503, b""), "pending"),
    (HttpAnswer(None, transport_error=ErrorClass.TIMEOUT), "pending"),
    (HttpAnswer(400, b"proxy says no"), "pending"),
    (HttpAnswer(400, envelope("bad_request")), "failed"),
    (HttpAnswer(410, envelope("gone")), "failed"),
])
def test_result_fetch_outcomes(answer, state):
    from vidpoll.policy import decide_result

    out = decide_result(_claim(), answer, NOW, POLICY, random.Random(1), SUME)
    assert out.state == state
    if answer.retry_after:
        assert out.delay_s == 7.0
    if state == "fetched":
        assert out.result == {"videos": []}


def test_result_fetch_gives_up_after_many_tries_but_not_for_pacing():
    from vidpoll.policy import MAX_RESULT_ATTEMPTS, decide_result

    out = decide_result(_claim(MAX_RESULT_ATTEMPTS), HttpAnswer(409, b""), NOW, POLICY,
                        random.Random(1), SUME)
    assert out.state == "failed" and out.error and "gave up" in out.error
    # a 429 is pacing, never a used-up try; a refused key is one more try, not a pause
    paced = decide_result(_claim(MAX_RESULT_ATTEMPTS), HttpAnswer(429, b"", retry_after="5"),
                          NOW, POLICY, random.Random(1), SUME)
    assert paced.state == "pending" and paced.delay_s == 5
    assert decide_result(_claim(), HttpAnswer(401, b""), NOW, POLICY,
                         random.Random(1), SUME).state == "pending"
