"""Kling's rules without a server: every task word, its envelope (a code other than 0 under
HTTP 200 and the status each code pairs with), the create answer's task id and handle, where a
finished task lists its videos, the `external_task_id` derived from a key, which bodies and
`--model` words it takes, and the JWT every request carries (decoded with PyJWT)."""

from __future__ import annotations

import json
import re
from typing import Any

import jwt
import pytest

from vidpoll.models import HttpAnswer
from vidpoll.providers import registry
from vidpoll.providers.base import AccountOption, Pending, ResultSource, Terminal, Unreadable
from vidpoll.providers.kling import DEFAULT_BASE_URL
from vidpoll.providers.kling.client import (
    KlingClient,
    invalid_unsent,
    is_repeated_id,
    refused_unsent,
    with_envelope_status,
)
from vidpoll.providers.kling.rules import (
    CODE_STATUS,
    EXTERNAL_ID_PREFIX,
    JWT_LIFE_S,
    MAX_EXTERNAL_ID,
    RULES,
    UNKNOWN_CODE_STATUS,
    envelope_code,
    external_task_id,
    mint_token,
    status_for_code,
    token_claims,
)

TASK_ID = "867283741759111202"
VIDEO = "https://cdn.klingai.com/bs2/upload-kling-api/7466/ab/out.mp4"
ACCESS = "ak-9c1e7f3a"
SECRET = "sk-0b4d2e8f-secret-5a6c7d9e1f2a3b4c"
"""32 bytes or more: PyJWT warns of a shorter HMAC key when it verifies one."""
NOW_S = 1_774_805_076.4


def envelope(data: Any, code: int = 0, message: str = "SUCCEED") -> dict[str, Any]:
    return {"code": code, "message": message, "request_id": "c0656403-1e6e", "data": data}


def task(word: str, **extra: Any) -> dict[str, Any]:
    return envelope({"task_id": TASK_ID, "task_status": word,
                     "task_info": {"external_task_id": "k-1"},
                     "created_at": 1722769557708, "updated_at": 1722769557708, **extra})


# --- the provider's fixed answers ------------------------------------------------------------

def test_the_provider_and_its_fixed_answers() -> None:
    provider = registry.load("kling")
    assert provider.rules is RULES and provider.name == "kling" and provider.title == "Kling"
    assert provider.default_base_url == DEFAULT_BASE_URL == "https://api-singapore.klingai.com"
    assert provider.env_prefix == "KLING" and provider.webhooks is None
    assert provider.default_rates == (None, None)
    options = provider.account_options  # type: ignore[attr-defined]
    assert options == {"secret_key_env": AccountOption("secret_env", default=None,
                                                       example="KLING_SECRET_KEY")}
    assert RULES.result_source is ResultSource.INLINE
    assert RULES.idempotency_header is None and RULES.takes_model is True
    assert dict(RULES.words) == {"succeed": "succeeded", "failed": "failed"}
    assert RULES.rate_limit_headers == ("", "") and RULES.min_poll_s > 0
    assert RULES.result_not_ready(HttpAnswer(404, b"{}"), "1203") is False


# --- task words ------------------------------------------------------------------------------

@pytest.mark.parametrize("word", ["submitted", "processing", "SUBMITTED", " processing "])
def test_a_task_not_ended_is_pending_with_no_hint(word: str) -> None:
    assert RULES.read_status(task(word)) == Pending(word.strip().lower(), None)


def test_succeed_is_succeeded_and_lists_its_videos_in_order_without_repeats() -> None:
    second = VIDEO.replace("out", "out2")
    body = task("succeed", task_result={"videos": [
        {"id": "v1", "url": VIDEO, "duration": "5.1"}, {"id": "v2", "url": second},
        {"id": "v1", "url": VIDEO}]})
    assert RULES.read_status(body) == Terminal("succeed", "succeeded")
    assert RULES.media_urls(body) == [VIDEO, second]
    # a callback's bare task object is read the same way
    assert RULES.media_urls(body["data"]) == [VIDEO, second]


def test_failed_is_failed_with_its_task_status_msg() -> None:
    body = task("failed", task_status_msg="Failure to pass the risk control system")
    assert RULES.read_status(body) == Terminal(
        "failed", "failed", "Failure to pass the risk control system")
    assert RULES.read_status(task("failed")) == Terminal(
        "failed", "failed", "the task failed (no task_status_msg)")
    assert RULES.media_urls(body) == []


def test_an_unknown_word_keeps_polling_and_is_flagged() -> None:
    assert RULES.read_status(task("queueing")) == Pending("queueing", None, known=False)


@pytest.mark.parametrize(("body", "why"), [
    ({}, "no 'data'"),
    ({"code": 0, "message": "x", "data": None}, "no 'data'"),
    (envelope({"task_id": TASK_ID}), "no task_status"),
    (envelope({"task_id": TASK_ID, "task_status": 3}), "no task_status"),
    (envelope(None, code=5000, message="internal"), "code 5000"),
])
def test_garbage_is_unreadable_never_an_end(body: dict[str, Any], why: str) -> None:
    view = RULES.read_status(body)
    assert isinstance(view, Unreadable) and why in view.why, view


@pytest.mark.parametrize("result", [
    None, "x", [], {"data": "x"}, envelope({"task_result": "x"}),
    envelope({"task_result": {"videos": "x"}}),
    envelope({"task_result": {"videos": [3, {"url": 5}, {"url": "ftp://x/y"}, {"id": "v"}]},
              "task_info": {"image_url": "https://in.example/input.png"}}),
])
def test_media_urls_of_garbage_or_of_inputs_is_nothing(result: Any) -> None:
    assert RULES.media_urls(result) == []


# --- the envelope ----------------------------------------------------------------------------

def test_error_code_reads_the_envelope_and_only_it() -> None:
    assert RULES.error_code(envelope(None, 1201, "Invalid parameters")) == (
        "1201", "Invalid parameters")
    assert RULES.error_code({"code": 1004, "message": "", "request_id": "r"}) == ("1004", None)
    assert RULES.error_code({"code": "1302", "message": "busy"}) == ("1302", "busy")
    # success is no error; other shapes are not Kling's (a proxy, a wrong URL)
    for body in (envelope({}), None, {}, {"code": 1201}, {"error": {"code": 400}},
                 {"code": True, "message": "x"}, {"code": "12x", "message": "x"},
                 {"detail": "Not Found"}):
        assert RULES.error_code(body) == (None, None), body
    assert envelope_code({"code": 0, "request_id": "r"}) == 0


def test_a_path_no_route_of_kling_takes_is_a_wrong_url_never_a_jobs_404() -> None:
    from vidpoll.policy import is_misrouted

    wrong_route = envelope(None, 1202, "The requested method is invalid")
    assert RULES.error_code(wrong_route) == (None, None)
    assert is_misrouted(404, wrong_route, RULES)
    no_task = envelope(None, 1203, "The requested resource does not exist")
    assert RULES.error_code(no_task) == ("1203", "The requested resource does not exist")
    assert not is_misrouted(404, no_task, RULES)


@pytest.mark.parametrize(("code", "status"), [
    (1000, 401), (1001, 401), (1002, 401), (1003, 401), (1004, 401),
    (1100, 429), (1101, 429), (1102, 429), (1103, 403),
    (1200, 400), (1201, 400), (1202, 404), (1203, 404), (1300, 400), (1301, 400),
    (1302, 429), (1303, 429), (1304, 429),
    (5000, 500), (5001, 503), (5002, 504), (1999, UNKNOWN_CODE_STATUS), (7, 502)])
def test_each_code_pairs_with_the_status_kling_documents(code: int, status: int) -> None:
    assert status_for_code(code) == status
    assert UNKNOWN_CODE_STATUS == 502 and set(CODE_STATUS) >= {1302, 1303, 5000, 5001, 5002}


def answer(status: int, body: Any) -> HttpAnswer:
    return HttpAnswer(status, json.dumps(body).encode(), request_id="r1", retry_after="3")


@pytest.mark.parametrize(("code", "status"), [
    (1302, 429), (1303, 429), (5000, 500), (5001, 503), (5002, 504), (1201, 400),
    (1004, 401), (1203, 404), (4242, 502)])
def test_a_code_under_http_200_becomes_its_status_with_the_body_kept(code: int,
                                                                      status: int) -> None:
    sent = answer(200, envelope(None, code, "said so"))
    got = with_envelope_status(sent)
    assert got.status == status and got.body == sent.body
    assert got.request_id == "r1" and got.retry_after == "3"
    assert f"code {code}" in got.detail


def test_success_and_bodies_without_the_envelope_come_back_as_they_came() -> None:
    for sent in (answer(200, task("submitted")), answer(200, {"task_id": "x"}),
                 HttpAnswer(200, b"<html>"), HttpAnswer(None, detail="timeout"),
                 answer(404, {"detail": "Not Found"}), answer(400, envelope(None, 1201, "x")),
                 answer(500, envelope(None, 5000, "x"))):
        assert with_envelope_status(sent) is sent
        assert with_envelope_status(sent, create=True) is sent


def test_a_create_refused_for_a_repeated_external_id_is_a_409() -> None:
    said = "external_task_id already exists"
    for status in (200, 400):
        got = with_envelope_status(answer(status, envelope(None, 1201, said)), create=True)
        assert got.status == 409 and json.loads(got.body)["message"] == said
    # a read is never taken for it, nor another refusal
    assert with_envelope_status(answer(200, envelope(None, 1201, said))).status == 400
    assert not is_repeated_id(1201, "prompt is too long")
    assert not is_repeated_id(1004, said) and not is_repeated_id(1201, None)


def test_unsent_answers_are_kling_envelopes_the_core_reads() -> None:
    refused = refused_unsent("the account's secret key is empty")
    assert refused.status == 401 and refused.transport_error is None
    assert RULES.error_code(json.loads(refused.body))[0] == "1000"
    invalid = invalid_unsent("no endpoint")
    assert invalid.status == 400 and RULES.error_code(json.loads(invalid.body))[0] == "1201"


# --- the create answer -----------------------------------------------------------------------

def test_the_create_answer_gives_the_task_id_and_the_handle_the_endpoint() -> None:
    body = task("submitted")
    assert RULES.created_job_id(body) == TASK_ID
    assert RULES.created_job_id(envelope({"task_id": 867283741759111202})) == TASK_ID
    assert RULES.created_handle(body, "image2video") == {"endpoint": "image2video"}
    assert RULES.created_handle(body, None) is None
    assert RULES.created_handle(body, "../x") is None


@pytest.mark.parametrize("body", [
    None, {}, envelope(None), envelope({}), envelope({"task_id": ""}),
    envelope({"task_id": None}), envelope({"task_id": True}), envelope({"task_id": "a\x00b"}),
    envelope({"task_id": TASK_ID}, code=5000, message="internal")])
def test_no_usable_task_id_is_none(body: Any) -> None:
    assert RULES.created_job_id(body) is None


# --- external_task_id ------------------------------------------------------------------------

_SENT = re.compile(r"[a-z0-9][a-z0-9_-]*")


@pytest.mark.parametrize("key", [
    "3f2b8c1e-7a4d-4e0b-9c1a-5d6e7f8a9b0c", "job_1", "a", "x" * 64])
def test_a_plain_key_is_its_own_external_id(key: str) -> None:
    assert external_task_id(key) == key


@pytest.mark.parametrize("key", [
    "12345", "Job-1", "job.1", "job:1", "x" * 65, "a" * 255, "vp-0123", "-lead", "_lead",
    "k/../1", "k%2F", "k?x=1", "~!@#$%^&*()"])
def test_any_other_key_is_a_hash_of_it(key: str) -> None:
    derived = external_task_id(key)
    assert derived.startswith(EXTERNAL_ID_PREFIX) and derived != key
    assert len(derived) == len(EXTERNAL_ID_PREFIX) + 40


def test_external_ids_are_deterministic_short_plain_and_distinct() -> None:
    keys = ["12345", "Job-1", "job-1", "JOB-1", "x" * 65, "x" * 66, "a", "vp-a", "a.b",
            "a:b", *(f"chaos-{i:03d}" for i in range(100)),
            *(external_task_id(k) for k in ("Job-1", "12345"))]  # a derived id as a key
    derived = [external_task_id(k) for k in keys]
    assert derived == [external_task_id(k) for k in keys]  # deterministic
    assert len(set(derived)) == len(set(keys))  # distinct keys, distinct ids
    for value in derived:
        assert _SENT.fullmatch(value) and len(value) <= MAX_EXTERNAL_ID, value
        assert not value.isdigit()  # never read as one of Kling's own (numeric) task ids


# --- what submit refuses ---------------------------------------------------------------------

@pytest.mark.parametrize("model", ["text2video", "image2video", "omni-video", "video-extend",
                                   "multi-image2video", "lip-sync"])
def test_endpoint_words_are_models(model: str) -> None:
    assert RULES.model_problem(model) is None


@pytest.mark.parametrize("model", ["", "Text2Video", "text2video/", "../x", "a/b", "-x",
                                   "x-", "2video", "text2video?x=1", "kling-v3 pro", "é",
                                   "a" * 65, "videos/text2video"])
def test_anything_else_is_refused_in_one_line(model: str) -> None:
    problem = RULES.model_problem(model)
    assert problem is not None and "\n" not in problem and "text2video" in problem


def test_a_body_that_sets_its_own_external_task_id_is_refused() -> None:
    assert RULES.payload_problem({"prompt": "a heron"}, "text2video") is None
    problem = RULES.payload_problem({"prompt": "a heron", "external_task_id": "mine-secret"},
                                    "text2video")
    assert problem is not None and "external_task_id" in problem
    assert "mine-secret" not in problem  # the body's values are never shown
    assert RULES.payload_problem({"external_task_id": None}, None) is not None


# --- the JWT ---------------------------------------------------------------------------------

def test_the_token_is_hs256_with_the_documented_claims() -> None:
    token = mint_token(ACCESS, SECRET, NOW_S)
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "typ": "JWT"}
    claims = jwt.decode(token, SECRET, algorithms=["HS256"], issuer=ACCESS,
                        options={"verify_exp": False, "verify_nbf": False})
    assert claims == token_claims(ACCESS, NOW_S) == {
        "iss": ACCESS, "exp": int(NOW_S) + 1800, "nbf": int(NOW_S) - 5}
    assert claims["exp"] - claims["nbf"] <= 1805 and JWT_LIFE_S <= 1800
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, SECRET + "x", algorithms=["HS256"],
                   options={"verify_exp": False, "verify_nbf": False})
    # a token minted now is valid now, by PyJWT's own checks
    import time
    fresh = mint_token(ACCESS, SECRET, time.time())
    assert jwt.decode(fresh, SECRET, algorithms=["HS256"])["iss"] == ACCESS


def test_a_short_secret_key_mints_without_a_warning() -> None:
    # PyJWT warns of an HMAC key under 32 bytes; the key is Kling's to issue, not vidpoll's
    # (warnings are errors here: a warning would fail this test)
    token = mint_token(ACCESS, "short", NOW_S)
    assert token.count(".") == 2


def test_the_client_never_shows_its_keys() -> None:
    from vidpoll.providers.base import ProviderOptions
    client = KlingClient("https://api-singapore.klingai.com/v1/", ACCESS, options=ProviderOptions(
        extra={"secret_key_env": "KLING_SECRET_KEY"}, secrets={"secret_key_env": SECRET}))
    shown = repr(client) + client.shown_create_url() + client.shown_status_url(TASK_ID)
    assert ACCESS not in shown and SECRET not in shown
    # a trailing /v1 is the API's version, which the paths carry
    assert client.shown_status_url(TASK_ID) == (
        f"https://api-singapore.klingai.com/v1/videos/text2video/{TASK_ID}")
    assert client.media_headers() == {} and client.media_auth_hosts() == frozenset()
