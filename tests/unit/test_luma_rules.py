"""Luma's rules and callbacks without a server: every generation state, its error body, the
create answer's id, where a completed generation lists its video, which `--model` and request
bodies it takes, every branch of telling whether a listed generation is an unanswered
create's, and what an unsigned callback may say."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT
from vidpoll.providers import registry
from vidpoll.providers.base import Pending, ResultSource, Terminal, Unreadable, WebhookHint
from vidpoll.providers.luma.rules import RULES, model_problem, payload_problem
from vidpoll.providers.luma.webhooks import MAX_EVENT_ID_CHARS, WEBHOOKS
from vidpoll.webhook import WebhookRejected

GEN_ID = "9d2cf9a0-6a4e-4f0e-8a77-2b8f1c3e5d41"
VIDEO = "https://storage.cdn-luma.com/dream_machine/9d2cf9a0/video.mp4"


# --- the provider -------------------------------------------------------------------------

def test_the_provider_is_found_by_name_and_says_what_it_is() -> None:
    provider = registry.load("luma")
    assert provider.name == "luma" and provider.title == "Luma"
    assert provider.default_base_url == "https://api.lumalabs.ai/dream-machine/v1"
    assert provider.env_prefix == "LUMAAI"
    assert provider.default_rates == (None, 20.0)  # Build tier: 20 video creates/min
    assert provider.rules is RULES
    assert provider.webhooks is WEBHOOKS
    assert getattr(provider.webhooks, "signed", True) is False
    assert {"completed", "failed"} <= set(registry.job_states())


def test_the_fixed_rules() -> None:
    assert RULES.result_source is ResultSource.INLINE
    assert RULES.idempotency_header is None
    assert RULES.takes_model is True
    assert RULES.min_poll_s == 0.0  # no floor of its own: VIDPOLL_MIN_POLL_S applies
    assert RULES.rate_limit_headers == ("", "")
    assert RULES.result_not_ready(HttpAnswer(404, b""), "detail") is False
    assert getattr(RULES, "created_handle", None) is None  # an id is all a read needs


# --- status -------------------------------------------------------------------------------

@pytest.mark.parametrize("word", ["queued", "dreaming", "QUEUED", " Dreaming "])
def test_a_generation_that_has_not_ended_is_pending_with_no_hint(word: str) -> None:
    assert RULES.read_status({"id": GEN_ID, "state": word}) == Pending(
        word.strip().lower(), None, known=True)


def test_completed_succeeds() -> None:
    body = {"id": GEN_ID, "state": "completed", "failure_reason": None,
            "assets": {"video": VIDEO}}
    assert RULES.read_status(body) == Terminal("completed", "succeeded")


def test_failed_fails_with_its_reason() -> None:
    body = {"id": GEN_ID, "state": "failed", "failure_reason": "Frame moderation failed"}
    assert RULES.read_status(body) == Terminal("failed", "failed", "Frame moderation failed")
    assert RULES.read_status({"state": "Failed"}) == Terminal("failed", "failed", None)
    long = RULES.read_status({"state": "failed", "failure_reason": "x" * 10_000})
    assert isinstance(long, Terminal) and long.detail == "x" * MAX_ERROR_TEXT


def test_the_words_are_exactly_the_terminal_ones() -> None:
    assert dict(RULES.words) == {"completed": "succeeded", "failed": "failed"}


def test_an_unknown_word_keeps_polling_and_is_flagged() -> None:
    assert RULES.read_status({"state": "upscaling"}) == Pending("upscaling", None, known=False)


@pytest.mark.parametrize("body", [{}, {"state": None}, {"state": 3}, {"state": ""},
                                  {"state": "  "}, {"state": ["completed"]},
                                  {"status": "completed"}])
def test_a_body_without_a_state_word_is_unreadable(body: dict[str, Any]) -> None:
    assert isinstance(RULES.read_status(body), Unreadable)


# --- errors -------------------------------------------------------------------------------

def test_a_detail_body_is_lumas_envelope() -> None:
    assert RULES.error_code({"detail": "Invalid API key is provided"}) == (
        "detail", "Invalid API key is provided")
    assert RULES.error_code({"detail": "Generation not found"}) == (
        "detail", "Generation not found")


def test_a_validation_error_gives_the_first_items_type_and_message() -> None:
    body = {"detail": [
        {"type": "enum", "loc": ["body", "model"], "msg": "Input should be 'ray-2'",
         "input": "ray-9"},
        {"type": "string_type", "loc": ["body", "prompt"], "msg": "Input should be a string"}]}
    assert RULES.error_code(body) == ("enum", "Input should be 'ray-2' (and 1 more)")
    assert RULES.error_code({"detail": [{"msg": "bad"}]}) == ("validation_error", "bad")


def test_the_message_and_the_code_are_bounded() -> None:
    code, message = RULES.error_code({"detail": "d" * 10_000})
    assert code == "detail" and message == "d" * MAX_ERROR_TEXT
    code, _ = RULES.error_code({"detail": [{"type": "t" * 1000, "msg": "m"}]})
    assert code == "t" * 200


@pytest.mark.parametrize("body", [None, {}, {"error": {"code": "x", "message": "y"}},
                                  {"detail": ""}, {"detail": 3}, {"detail": None},
                                  {"detail": []}, {"detail": [3]}, {"detail": {"x": 1}},
                                  {"message": "Not Found"}, {"title": "Welcome"}])
def test_any_other_body_is_not_lumas(body: dict[str, Any] | None) -> None:
    assert RULES.error_code(body) == (None, None)


# --- create answer ------------------------------------------------------------------------

def test_the_created_id_is_the_generations_id() -> None:
    assert RULES.created_job_id({"id": GEN_ID, "state": "queued"}) == GEN_ID


@pytest.mark.parametrize("body", [None, {}, {"id": None}, {"id": 42}, {"id": ""},
                                  {"id": "a\x00b"}, {"id": "x" * 2000},
                                  {"generation": {"id": GEN_ID}}])
def test_no_usable_id_is_none(body: dict[str, Any] | None) -> None:
    assert RULES.created_job_id(body) is None


# --- media --------------------------------------------------------------------------------

def test_the_video_is_the_one_file() -> None:
    result = {"state": "completed", "assets": {
        "video": VIDEO, "progress_video": "https://storage.cdn-luma.com/p.mp4",
        "image": "https://storage.cdn-luma.com/i.jpg"}}
    assert RULES.media_urls(result) == [VIDEO]


@pytest.mark.parametrize("result", [None, {}, [], {"assets": None}, {"assets": []},
                                    {"assets": {"video": None}}, {"assets": {"video": 3}},
                                    {"assets": {"video": "ftp://x/v.mp4"}},
                                    {"assets": {"video": "not a url"}},
                                    {"assets": {"progress_video": VIDEO}},
                                    {"assets": {"image": VIDEO}}])
def test_no_video_no_files(result: Any) -> None:
    assert RULES.media_urls(result) == []


# --- models and bodies --------------------------------------------------------------------

@pytest.mark.parametrize("model", ["ray-2", "ray-flash-2", "ray-1-6", "photon-1", "ray_3.1"])
def test_good_models(model: str) -> None:
    assert model_problem(model) is None and RULES.model_problem(model) is None


@pytest.mark.parametrize("model", ["", "-ray", "ray 2", "ray/2", "../x", "ray?x=1", "ray\n",
                                   "x" * 101])
def test_bad_models_say_why_in_one_line(model: str) -> None:
    why = RULES.model_problem(model)
    assert why is not None and "Luma model id" in why and "\n" not in why


def test_a_body_without_a_model_or_with_the_same_one_can_be_sent() -> None:
    assert RULES.payload_problem({"prompt": "a fox"}, "ray-2") is None
    assert RULES.payload_problem({"prompt": "a fox", "model": "ray-2"}, "ray-2") is None
    assert RULES.payload_problem({}, "ray-2") is None


def test_a_body_naming_another_model_is_refused_without_showing_it() -> None:
    why = RULES.payload_problem({"prompt": "a secret prompt", "model": "ray-flash-2"},
                                "ray-2")
    assert why is not None and "--model" in why and "\n" not in why
    assert "secret" not in why and "ray-flash-2" not in why
    why = payload_problem({"model": ["ray-2"]}, "ray-2")
    assert why is not None and "not a string" in why


@pytest.mark.parametrize("payload", [[{"prompt": "a fox"}], "a fox", 3, None])
def test_a_body_that_is_not_an_object_is_refused(payload: Any) -> None:
    why = RULES.payload_problem(payload, "ray-2")
    assert why is not None and "JSON object" in why


# --- matching a listed generation to an unanswered create ---------------------------------

PAYLOAD = {"prompt": "a heron at dawn", "aspect_ratio": "16:9", "loop": False,
           "keyframes": {"frame0": {"type": "image", "url": "https://x.test/a.jpg"}}}
MODEL = "ray-2"


def entry(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": GEN_ID, "generation_type": "video", "state": "dreaming", "model": MODEL,
        "created_at": "2026-12-06T10:00:00.123456Z", "assets": None,
        "request": {"model": MODEL, **PAYLOAD}}
    base.update(over)
    return base


def test_the_same_request_and_model_is_the_same() -> None:
    assert RULES.match_created(entry(), PAYLOAD, MODEL) == "same"


def test_extra_fields_luma_or_the_client_added_do_not_prevent_same() -> None:
    echoed = {**entry()["request"], "generation_type": "video", "duration": "5s",
              "callback_url": "https://hooks.example/webhooks/luma"}
    assert RULES.match_created(entry(request=echoed), PAYLOAD, MODEL) == "same"


def test_the_bodys_own_callback_url_and_model_are_not_compared() -> None:
    # the account's webhook URL replaced the body's callback_url; --model is the body's model
    payload = {**PAYLOAD, "callback_url": "https://mine.example/cb", "model": MODEL}
    echoed = {**entry()["request"], "callback_url": "https://hooks.example/webhooks/luma"}
    assert RULES.match_created(entry(request=echoed), payload, MODEL) == "same"


def test_numbers_compare_as_json_and_true_is_not_one() -> None:
    listed = entry(request={"model": MODEL, "prompt": "p", "n": 5.0, "loop": True})
    assert RULES.match_created(listed, {"prompt": "p", "n": 5, "loop": True}, MODEL) == "same"
    assert RULES.match_created(listed, {"prompt": "p", "loop": 1}, MODEL) == "other"


def test_another_model_is_another() -> None:
    assert RULES.match_created(entry(model="ray-flash-2"), PAYLOAD, MODEL) == "other"
    only_request = entry(request={**entry()["request"], "model": "ray-flash-2"})
    del only_request["model"]
    assert RULES.match_created(only_request, PAYLOAD, MODEL) == "other"


def test_the_model_is_read_from_the_request_when_the_entry_does_not_say_it() -> None:
    listed = entry()
    del listed["model"]
    assert RULES.match_created(listed, PAYLOAD, MODEL) == "same"


def test_an_entry_that_names_no_model_at_all_is_at_most_unsure() -> None:
    listed = entry(request=dict(PAYLOAD))
    del listed["model"]
    assert RULES.match_created(listed, PAYLOAD, MODEL) == "unsure"
    listed["request"] = {**PAYLOAD, "prompt": "another"}
    assert RULES.match_created(listed, PAYLOAD, MODEL) == "other"


def test_a_field_with_another_value_is_another() -> None:
    for field, value in [("prompt", "a crane at dusk"), ("aspect_ratio", "9:16"),
                         ("loop", True),
                         ("keyframes", {"frame0": {"type": "image", "url": "https://x/b.jpg"}})]:
        echoed = {**entry()["request"], field: value}
        assert RULES.match_created(entry(request=echoed), PAYLOAD, MODEL) == "other", field


def test_a_field_missing_from_the_echo_is_unsure() -> None:
    echoed = {k: v for k, v in entry()["request"].items() if k != "keyframes"}
    assert RULES.match_created(entry(request=echoed), PAYLOAD, MODEL) == "unsure"
    # yet a difference elsewhere still proves another
    echoed["prompt"] = "something else"
    assert RULES.match_created(entry(request=echoed), PAYLOAD, MODEL) == "other"


@pytest.mark.parametrize("request_", [None, "a heron", [], 3])
def test_a_request_that_cannot_be_read_is_unsure(request_: Any) -> None:
    listed = entry(request=request_)
    assert RULES.match_created(listed, PAYLOAD, MODEL) == "unsure"
    del listed["request"]
    assert RULES.match_created(listed, PAYLOAD, MODEL) == "unsure"
    # another model is another, request or not
    assert RULES.match_created(entry(request=request_, model="ray-flash-2"), PAYLOAD,
                               MODEL) == "other"


def test_a_data_uri_echoed_differently_is_unsure_and_echoed_alike_is_same() -> None:
    uri = "data:image/png;base64,iVBORw0KGgo="
    payload = {"prompt": "p", "keyframes": {"frame0": {"type": "image", "url": uri}}}
    stored = {"frame0": {"type": "image", "url": "https://storage.cdn-luma.com/up/1.png"}}
    listed = entry(request={"model": MODEL, "prompt": "p", "keyframes": stored})
    assert RULES.match_created(listed, payload, MODEL) == "unsure"
    listed = entry(request={"model": MODEL, **payload})
    assert RULES.match_created(listed, payload, MODEL) == "same"
    listed = entry(request={"model": MODEL, "prompt": "q", "keyframes": stored})
    assert RULES.match_created(listed, payload, MODEL) == "other"


@pytest.mark.parametrize("model", [None, "not a model", "ray/2"])
def test_no_create_is_ever_sent_for_a_model_luma_cannot_take(model: str | None) -> None:
    assert RULES.match_created(entry(), PAYLOAD, model) == "other"


@pytest.mark.parametrize("listed", [None, [], GEN_ID, 3])
def test_a_listed_thing_that_is_no_generation_is_another(listed: Any) -> None:
    assert RULES.match_created(listed, PAYLOAD, MODEL) == "other"


# --- callbacks (unsigned) -----------------------------------------------------------------

def hint(body: bytes, headers: dict[str, str] | None = None) -> WebhookHint:
    return WEBHOOKS.verify(headers or {}, body, "", 0.0, 300.0)


def test_a_callback_names_its_generation_and_its_update() -> None:
    body = json.dumps({"id": GEN_ID, "state": "completed", "assets": {"video": VIDEO},
                       "request": {"prompt": "x"}}).encode()
    assert hint(body) == WebhookHint(GEN_ID, f"{GEN_ID}:completed", f"{GEN_ID}:completed")
    # Luma's retry of the same update is the same event; the next update is another
    assert hint(body) == hint(body)
    dreaming = json.dumps({"id": GEN_ID, "state": "dreaming"}).encode()
    assert hint(dreaming).event_id == f"{GEN_ID}:dreaming" != hint(body).event_id


def test_nothing_but_the_id_and_state_is_read_and_no_header_or_clock_matters() -> None:
    body = json.dumps({"id": GEN_ID.upper(), "state": "Failed", "failure_reason": 3,
                       "assets": "garbage", "request": None}).encode()
    found = WEBHOOKS.verify({"X-Anything": "1"}, body, "whatever", 1e12, 0.0)
    assert found.job_id == GEN_ID.upper() and found.event_id == f"{GEN_ID.upper()}:failed"


@pytest.mark.parametrize("state", [None, 3, "", "no spaces allowed", "x" * 100, "ünïcode"])
def test_a_state_that_is_no_word_is_left_out_of_the_event_id(state: Any) -> None:
    found = hint(json.dumps({"id": GEN_ID, "state": state}).encode())
    assert found.event_id == f"{GEN_ID}:" and len(found.event_id) <= MAX_EVENT_ID_CHARS


@pytest.mark.parametrize("body", [
    b"", b"not json", b"\xff\xfe", b"[]", b"null", b'"9d2cf9a0"', b"{}",
    json.dumps({"id": None}).encode(), json.dumps({"id": 7}).encode(),
    json.dumps({"id": "not-a-uuid"}).encode(), json.dumps({"id": GEN_ID + "0"}).encode(),
    json.dumps({"id": f"{GEN_ID}\n"}).encode(), json.dumps({"id": f"../{GEN_ID}"}).encode(),
    json.dumps({"generation": {"id": GEN_ID}}).encode(), b"[" * 100_000])
def test_a_body_without_a_uuid_id_is_malformed(body: bytes) -> None:
    with pytest.raises(WebhookRejected) as refused:
        hint(body)
    assert refused.value.reason == "malformed"
    assert "UUID" in str(refused.value)
