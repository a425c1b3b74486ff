"""A 4xx status answer without the provider's error envelope is a misconfiguration (a wrong
base URL, a proxy answering in the provider's place), never "this job does not exist"
(issue 17, item 1). Pure: decide() and probe_verdict() on fixed answers."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vidpoll import policy
from vidpoll.models import GAVE_UP, NOT_FOUND, PENDING, ClaimedJob, ErrorClass, HttpAnswer, Outcome
from vidpoll.policy import (
    AuthPause,
    PollPolicy,
    decide,
)
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.rules import RULES as SUME

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
POLICY = PollPolicy()
TOKEN = uuid.UUID("00000000-0000-4000-8000-000000000001")
NGINX_404 = (b"<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 "
             b"Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def envelope(code: str) -> bytes:
    return js({"error": {"code": code, "message": "from the provider"}, "request_id": "req_1"})


def job(*, not_found_count: int = 0, age_s: float = 60.0) -> ClaimedJob:
    return ClaimedJob(job_id="vid_123", claim_token=TOKEN, due_at=NOW,
                      polling_since=NOW - timedelta(seconds=age_s), polls=3,
                      consecutive_errors=2, not_found_count=not_found_count)


MISROUTED = [
    pytest.param(HttpAnswer(404, b"404: Not Found"), "plain text", id="aiohttp-404"),
    pytest.param(HttpAnswer(404, NGINX_404), "an HTML page", id="nginx-404"),
    pytest.param(HttpAnswer(404, b""), "an empty body", id="empty-404"),
    pytest.param(HttpAnswer(404, js({"detail": "Not Found"})),
                 "JSON without an error envelope", id="framework-json-404"),
    pytest.param(HttpAnswer(404, js({"error": "Not Found", "status": 404})),
                 "JSON without an error envelope", id="error-as-a-string"),
    pytest.param(HttpAnswer(404, js({"error": {"message": "no route"}})),
                 "JSON without an error envelope", id="envelope-without-a-code"),
    pytest.param(HttpAnswer(404, js(["not", "an", "object"])), "JSON without an error envelope",
                 id="json-array"),
    pytest.param(HttpAnswer(400, b"400 Bad Request: plain HTTP sent to the HTTPS port"),
                 "plain text", id="text-400"),
    pytest.param(HttpAnswer(405, b"<!DOCTYPE html><title>405</title>"), "an HTML page",
                 id="html-405"),
    pytest.param(HttpAnswer(410, b""), "an empty body", id="410"),
    pytest.param(HttpAnswer(422, js({"message": "Unprocessable"})),
                 "JSON without an error envelope", id="json-422"),
]


@pytest.mark.parametrize(("answer", "kind"), MISROUTED)
@pytest.mark.parametrize("not_found_count", [0, 7])
def test_a_4xx_without_the_envelope_pauses_the_account_and_never_counts_as_not_found(
        answer: HttpAnswer, kind: str, not_found_count: int) -> None:
    # the 8th 404 (not_found_count 7) ends a job as not_found today: not when no provider said it
    result = decide(job(not_found_count=not_found_count), answer, NOW, POLICY,
                    random.Random(0), SUME)
    assert isinstance(result, AuthPause), result  # the refused key's path: rows untouched
    assert isinstance(result, policy.Misrouted)
    assert result.http_status == answer.status
    assert result.detail == f"HTTP {answer.status} ({kind})"
    # what the row gets if the worker learns that only this row's URL is refused: an error
    # with backoff, never not_found
    row = result.row_outcome
    assert row.state == PENDING and row.error_class is ErrorClass.CLIENT_ERROR
    assert row.error.startswith(f"HTTP {answer.status} (not the provider's error answer)")
    assert row.read_ok is False and 4.0 <= row.delay_s <= 8.0  # 3rd error in a row


def test_a_misrouted_answer_past_the_deadline_is_still_a_pause() -> None:
    result = decide(job(age_s=POLICY.max_age_s * 2), HttpAnswer(404, b"404: Not Found"), NOW,
                    POLICY, random.Random(0), SUME)
    assert isinstance(result, policy.Misrouted)
    assert result.row_outcome.state == GAVE_UP  # only if it is about this row alone


@pytest.mark.parametrize(("answer", "error_class", "state"), [
    # the provider's own "no such job" still counts (8 tries, as before)
    pytest.param(HttpAnswer(404, envelope("not_found")), ErrorClass.NOT_FOUND, NOT_FOUND,
                 id="404-envelope"),
    # the provider refusing this request in its own words: an error with backoff, as before
    pytest.param(HttpAnswer(400, envelope("bad_request")), ErrorClass.CLIENT_ERROR, PENDING,
                 id="400-envelope"),
    # "not now" whoever says it: retried with backoff, as before
    pytest.param(HttpAnswer(408, b"Request Timeout"), ErrorClass.CLIENT_ERROR, PENDING,
                 id="408"),
    pytest.param(HttpAnswer(425, b""), ErrorClass.CLIENT_ERROR, PENDING, id="425"),
    pytest.param(HttpAnswer(429, b"<html>slow down</html>"), ErrorClass.RATE_LIMITED, PENDING,
                 id="429-html"),
    # a redirect is never followed; it stays an error of the row (as before)
    pytest.param(HttpAnswer(302, b""), ErrorClass.CLIENT_ERROR, PENDING, id="302"),
])
def test_enveloped_and_retryable_answers_keep_their_rules(answer: HttpAnswer,
                                                          error_class: ErrorClass,
                                                          state: str) -> None:
    result = decide(job(not_found_count=7), answer, NOW, POLICY, random.Random(0), SUME)
    assert isinstance(result, Outcome) and not isinstance(result, policy.Misrouted)
    assert result.error_class is error_class and result.state == state


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("body", [b"", b"<html>Forbidden</html>", envelope("unauthorized")])
def test_a_refused_key_stays_a_refused_key(status: int, body: bytes) -> None:
    result = decide(job(), HttpAnswer(status, body), NOW, POLICY, random.Random(0), SUME)
    assert isinstance(result, AuthPause) and not isinstance(result, policy.Misrouted)


@pytest.mark.parametrize(("answer", "verdict"), [
    # an id that cannot exist: the provider's own "not found" proves URL and key right
    (HttpAnswer(404, envelope("not_found")), "provider"),
    (HttpAnswer(200, js({"terminal": False, "sume_status": "queued"})), "provider"),
    (HttpAnswer(400, envelope("bad_request")), "provider"),
    (HttpAnswer(503, envelope("internal_error")), "provider"),
    (HttpAnswer(401, envelope("unauthorized")), "key_refused"),
    (HttpAnswer(403, b""), "key_refused"),
    (HttpAnswer(404, b"404: Not Found"), "misrouted"),
    (HttpAnswer(404, NGINX_404), "misrouted"),
    (HttpAnswer(400, js({"detail": "Bad Request"})), "misrouted"),
    # a redirect or a page that is no JSON: probably not the API, but the provider itself may
    # send a broken body now and then, so it is a warning and no pause (is_not_api)
    (HttpAnswer(200, b"<!doctype html><html>a web site</html>"), "not_api"),
    (HttpAnswer(301, b""), "not_api"),
    (HttpAnswer(200, b'["a", "list"]'), "not_api"),
    (HttpAnswer(None, transport_error=ErrorClass.CONNECTION, detail="refused"), "no_answer"),
    (HttpAnswer(None, transport_error=ErrorClass.TIMEOUT, detail="no answer"), "no_answer"),
    (HttpAnswer(502, b"<html>Bad Gateway</html>"), "unsure"),
    (HttpAnswer(429, b""), "unsure"),
])
def test_probe_verdict(answer: HttpAnswer, verdict: str) -> None:
    assert policy.probe_verdict(answer, SUME) == verdict


def test_the_url_shown_for_a_status_read_has_no_credentials_query_or_key() -> None:
    client = SumeClient("https://user:pw@api.example.com/wrong/", "sk-secret-key")
    shown = client.shown_status_url("a b?c/d")
    assert shown == "https://api.example.com/wrong/v1/jobs/a%20b%3Fc%2Fd/status"
    assert "sk-secret-key" not in shown and "pw" not in shown


@pytest.mark.parametrize(("answer", "not_api"), [
    (HttpAnswer(302, b""), True),
    (HttpAnswer(200, b"<html>a web site</html>"), True),
    (HttpAnswer(200, b""), True),
    (HttpAnswer(200, js({"sume_status": 3})), False),  # JSON from the provider, odd shape
    (HttpAnswer(404, b"404: Not Found"), False),  # misrouted: a pause, not a streak
    (HttpAnswer(502, b"<html>Bad Gateway</html>"), False),
    (HttpAnswer(None, transport_error=ErrorClass.TIMEOUT), False),
])
def test_is_not_api(answer: HttpAnswer, not_api: bool) -> None:
    assert policy.is_not_api(answer) is not_api
    # decide keeps such answers one row's error with backoff (never a pause, never not_found)
    if not_api:
        result = decide(job(), answer, NOW, POLICY, random.Random(0), SUME)
        assert isinstance(result, Outcome) and result.state == PENDING and not result.read_ok


def test_the_create_url_shown_has_no_credentials_query_or_key() -> None:
    client = SumeClient("https://user:pw@api.example.com/wrong/", "sk-secret-key")
    assert client.shown_create_url() == "https://api.example.com/wrong/v1/videos"


@pytest.mark.parametrize("key", ["sk-ab\x01cd", "sk-ab\ncd", "sk-ab\x7fcd", "sk-ab\tcd"])
async def test_a_key_no_header_can_carry_is_never_sent_nor_raised(key: str) -> None:
    async with SumeClient("http://127.0.0.1:9", key) as client:
        assert client.key_problem is not None
        for answer in (await client.read_status("j"),
                       await client.create_video({"prompt": "x"}, "k-1")):
            assert answer.status is None and answer.transport_error is ErrorClass.CONNECTION
            assert answer.detail.startswith("not sent: the API key") and key not in answer.detail
