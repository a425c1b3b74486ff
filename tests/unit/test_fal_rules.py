"""fal's rules without a server: every status word and shape (a failure is COMPLETED with an
error), both error bodies and the key refusal, the create answer's id and URLs, which
endpoint ids `--model` takes, every branch of telling whether a request of the history is an
unanswered create's, and where a model's output lists its files."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT, decide_result, is_misrouted
from vidpoll.providers import registry
from vidpoll.providers.base import Pending, ResultSource, Terminal, Unreadable
from vidpoll.providers.fal import DEFAULT_PLATFORM_URL
from vidpoll.providers.fal.rules import RULES, model_problem, owner_app

ENDPOINT = "fal-ai/kling-video/v2/master/text-to-video"
RID = "1f0c2f6e-8a7e-4d7b-9a36-3c3a1d1f2b4c"
URLS = {"status_url": f"https://queue.fal.run/fal-ai/kling-video/requests/{RID}/status",
        "response_url": f"https://queue.fal.run/fal-ai/kling-video/requests/{RID}",
        "cancel_url": f"https://queue.fal.run/fal-ai/kling-video/requests/{RID}/cancel"}


# --- the provider ---------------------------------------------------------------------------

def test_the_provider_is_found_by_name_and_says_what_it_is() -> None:
    provider = registry.load("fal")
    assert provider.name == "fal" and provider.title == "fal"
    assert provider.default_base_url == "https://queue.fal.run"
    assert provider.env_prefix == "FAL"
    assert provider.default_rates == (None, None)
    assert provider.rules is RULES
    assert provider.webhooks is not None
    options = provider.account_options  # type: ignore[attr-defined]
    assert set(options) == {"platform_url", "jwks_url", "start_timeout_s"}
    assert options["platform_url"].kind == "url"
    assert options["platform_url"].default == DEFAULT_PLATFORM_URL == "https://api.fal.ai"
    from vidpoll.providers.fal.webhooks import DEFAULT_JWKS_URL
    assert options["jwks_url"].kind == "url" and options["jwks_url"].default == DEFAULT_JWKS_URL
    assert "completed" in registry.job_states()


def test_the_fixed_rules() -> None:
    assert RULES.result_source is ResultSource.SEPARATE
    assert RULES.idempotency_header is None
    assert RULES.takes_model is True
    assert RULES.min_poll_s == 1.0
    assert RULES.rate_limit_headers == ("", "")
    assert dict(RULES.words) == {"completed": "succeeded"}


# --- status ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "word", "detail"), [
    ({"status": "IN_QUEUE", "queue_position": 3}, "in_queue", "position 3"),
    ({"status": "IN_QUEUE", "queue_position": 0, **URLS}, "in_queue", "position 0"),
    ({"status": "IN_QUEUE", "queue_position": "3"}, "in_queue", None),
    ({"status": "IN_QUEUE", "queue_position": True}, "in_queue", None),
    ({"status": "IN_QUEUE", "queue_position": -1}, "in_queue", None),
    ({"status": "IN_PROGRESS", "logs": None}, "in_progress", None),
    ({"status": "IN_PROGRESS", "logs": [{"message": "Generating", "level": "INFO"}]},
     "in_progress", None),
    ({"status": " in_progress "}, "in_progress", None),
])
def test_a_request_that_has_not_ended_is_pending_with_no_hint(
        body: dict[str, Any], word: str, detail: str | None) -> None:
    # the queue position is no poll hint (seconds): it is shown beside the word
    # (`in_queue (position 3)`), and it stays in the stored answer
    assert RULES.read_status(body) == Pending(word, None, known=True, detail=detail)


@pytest.mark.parametrize("body", [
    {"status": "COMPLETED"},
    {"status": "COMPLETED", "logs": None, "metrics": {"inference_time": 41.2}, **URLS},
    {"status": "COMPLETED", "error": None, "error_type": None},
    {"status": "COMPLETED", "error": ""},
    {"status": "completed"},
])
def test_completed_without_an_error_succeeded(body: dict[str, Any]) -> None:
    assert RULES.read_status(body) == Terminal("completed", "succeeded")


@pytest.mark.parametrize("body", [
    {"status": "COMPLETED", "error": "The content was flagged by a content checker.",
     "error_type": "content_policy_violation"},
    {"status": "COMPLETED", "error": "Runner encountered an internal server error",
     "error_type": "runner_server_error"},
    {"status": "COMPLETED", "error": "Request timed out", "error_type": "request_timeout"},
    {"status": "COMPLETED", "error": "boom"},
    {"status": "COMPLETED", "error": {"msg": "boom"}},
    {"status": "COMPLETED", "error": None, "error_type": "internal_error"},
])
def test_completed_with_an_error_failed(body: dict[str, Any]) -> None:
    view = RULES.read_status(body)
    assert isinstance(view, Terminal) and (view.word, view.outcome) == ("completed", "failed")
    # fal's own words are kept as the row's last_error
    for said in (body.get("error_type"), body.get("error")):
        if isinstance(said, str):
            assert view.detail is not None and said in view.detail


def test_a_request_its_owner_cancelled_is_canceled() -> None:
    body = {"status": "COMPLETED", "error": "Request was cancelled",
            "error_type": "client_cancelled"}
    assert RULES.read_status(body) == Terminal(
        "completed", "canceled", "client_cancelled: Request was cancelled")


def test_an_unknown_word_keeps_polling_and_is_flagged() -> None:
    assert RULES.read_status({"status": "CANCELLATION_REQUESTED"}) == Pending(
        "cancellation_requested", None, known=False)


@pytest.mark.parametrize("body", [{}, {"status": None}, {"status": 3}, {"status": ""},
                                  {"status": "  "}, {"status": ["COMPLETED"]},
                                  {"state": "COMPLETED"}])
def test_a_body_without_a_status_word_is_unreadable(body: dict[str, Any]) -> None:
    assert isinstance(RULES.read_status(body), Unreadable)


# --- errors ---------------------------------------------------------------------------------

def test_a_detail_only_body_is_fals_envelope() -> None:
    assert RULES.error_code({"detail": "Request not found"}) == ("detail", "Request not found")


def test_the_key_refusal_is_fals_envelope() -> None:
    assert RULES.error_code({"detail": "No user found for Key ID and Secret"}) == (
        "detail", "No user found for Key ID and Secret")


def test_a_request_error_gives_its_error_type_as_the_code() -> None:
    body = {"detail": "Runner encountered an internal server error",
            "error_type": "runner_server_error"}
    assert RULES.error_code(body) == ("runner_server_error",
                                      "Runner encountered an internal server error")
    assert RULES.error_code({"detail": "Rate limit exceeded", "error_type": "rate_limited"}) == (
        "rate_limited", "Rate limit exceeded")


def test_a_model_validation_error_gives_its_first_items_type_and_msg() -> None:
    body = {"detail": [{"loc": ["body", "prompt"], "msg": "The content was flagged.",
                        "type": "content_policy_violation",
                        "url": "https://docs.fal.ai/errors#content_policy_violation"}]}
    assert RULES.error_code(body) == ("content_policy_violation", "The content was flagged.")
    two = {"detail": [{"loc": ["body"], "msg": "a", "type": "missing"},
                      {"loc": ["body"], "msg": "b", "type": "missing"}]}
    assert RULES.error_code(two) == ("missing", "a (and 1 more)")
    assert RULES.error_code({"detail": [{"loc": ["body"], "msg": "x"}]}) == (
        "validation_error", "x")


def test_an_object_detail_and_a_bare_error_type_are_envelopes_too() -> None:
    assert RULES.error_code({"detail": {"msg": "bad", "type": "value_error"}}) == (
        "value_error", "bad")
    assert RULES.error_code({"error_type": "bad_request"}) == ("bad_request", None)


@pytest.mark.parametrize("body", [None, {}, {"detail": ""}, {"detail": None}, {"detail": 3},
                                  {"detail": []}, {"detail": ["x"]}, {"detail": [{}]},
                                  {"detail": {}}, {"error": "x"},
                                  {"message": "Not Found"}, {"status": "NOT_FOUND"},
                                  {"items": []}])
def test_a_body_that_is_not_fals_is_no_envelope(body: dict[str, Any] | None) -> None:
    assert RULES.error_code(body) == (None, None)


def test_long_codes_and_messages_are_cut() -> None:
    code, message = RULES.error_code({"detail": "m" * 5000, "error_type": "c" * 500})
    assert code == "c" * 200 and message == "m" * MAX_ERROR_TEXT


@pytest.mark.parametrize(("status", "body"), [
    (404, {"detail": "Request not found"}),
    (404, {"detail": "Application not found", "error_type": "bad_request"}),
    (422, {"detail": [{"loc": ["body"], "msg": "x", "type": "missing"}]}),
    (400, {"detail": "Request is still in progress"}),
])
def test_fals_own_4xx_are_never_taken_for_a_wrong_url(status: int, body: dict[str, Any]) -> None:
    assert not is_misrouted(status, body, RULES)
    assert is_misrouted(404, {"message": "no route"}, RULES)


# --- creates --------------------------------------------------------------------------------

def test_the_create_answers_request_id_is_the_job_id() -> None:
    body = {"status": "IN_QUEUE", "request_id": RID, "gateway_request_id": RID,
            "queue_position": 0, **URLS}
    assert RULES.created_job_id(body) == RID
    for bad in (None, {}, {"request_id": None}, {"request_id": 7}, {"request_id": ""},
                {"id": RID}, {"request_id": "a\x00b"}):
        assert RULES.created_job_id(bad) is None, bad


def test_the_handle_keeps_the_three_urls_as_sent() -> None:
    body = {"status": "IN_QUEUE", "request_id": RID, "queue_position": 2, **URLS}
    assert RULES.created_handle(body) == URLS
    assert RULES.created_handle({"request_id": RID, "status_url": URLS["status_url"],
                                 "response_url": 5, "cancel_url": ""}) == {
        "status_url": URLS["status_url"]}
    assert RULES.created_handle({"request_id": RID}) is None
    assert RULES.created_handle(None) is None
    assert RULES.created_handle({"status_url": "x" * 5000}) is None


# --- results --------------------------------------------------------------------------------

def test_the_result_urls_400_still_in_progress_is_not_yet() -> None:
    early = HttpAnswer(400, json.dumps({"detail": "Request is still in progress"}).encode())
    assert RULES.result_not_ready(early, "detail")
    assert not RULES.result_not_ready(HttpAnswer(400, b'{"detail": "Bad request"}'), "detail")
    assert not RULES.result_not_ready(HttpAnswer(422, early.body), "detail")
    assert not RULES.result_not_ready(HttpAnswer(400, b"<html>"), None)


def test_a_model_error_result_fails_the_fetch_for_good_and_not_yet_waits() -> None:
    import random
    import uuid
    from datetime import UTC, datetime

    from vidpoll.models import ClaimedResult
    from vidpoll.policy import PollPolicy
    claim = ClaimedResult(job_id=RID, token=uuid.uuid4(), attempts=1, account="a")
    now, rng, policy = datetime.now(UTC), random.Random(0), PollPolicy()
    early = HttpAnswer(400, b'{"detail": "Request is still in progress"}')
    assert decide_result(claim, early, now, policy, rng, RULES).state == "pending"
    model_error = HttpAnswer(422, json.dumps({"detail": [
        {"loc": ["body", "prompt"], "msg": "flagged", "type": "content_policy_violation"}]
    }).encode())
    failed = decide_result(claim, model_error, now, policy, rng, RULES)
    assert failed.state == "failed" and "content_policy_violation" in (failed.error or "")


@pytest.mark.parametrize(("result", "urls"), [
    ({"video": {"url": "https://v3b.fal.media/files/b/x/output.mp4",
                "content_type": "video/mp4", "file_name": "output.mp4", "file_size": 1}},
     ["https://v3b.fal.media/files/b/x/output.mp4"]),
    ({"images": [{"url": "https://v3.fal.media/a.png"}, {"url": "https://v3.fal.media/b.png"},
                 {"url": "https://v3.fal.media/a.png"}], "seed": 3},
     ["https://v3.fal.media/a.png", "https://v3.fal.media/b.png"]),
    ({"video": {"url": "https://v3.fal.media/v.mp4"}, "audio": {"url": "data:,x"},
      "prompt": "https://not.a.file/"},
     ["https://v3.fal.media/v.mp4"]),
    ({"video_url": "https://v3.fal.media/v.mp4"}, ["https://v3.fal.media/v.mp4"]),
    ({}, []), (None, []), ([{"url": "https://v3.fal.media/v.mp4"}], []),
])
def test_media_urls_are_the_outputs_file_urls(result: Any, urls: list[str]) -> None:
    assert RULES.media_urls(result) == urls


# --- models ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [ENDPOINT, "fal-ai/kling-video", "fal-ai/flux/dev",
                                   "Owner_1/App.2/v1.5/x-y", "a/b"])
def test_endpoint_ids_are_accepted(model: str) -> None:
    assert model_problem(model) is None
    assert RULES.model_problem(model) is None


@pytest.mark.parametrize("model", ["", "fal-ai", "/fal-ai/x", "fal-ai/x/", "fal-ai//x",
                                   "fal-ai/../x", "fal-ai/x..y", "fal-ai/.x", "fal-ai/-x",
                                   "fal-ai/x y", "fal-ai/x?y=1", "fal-ai/x#y", "fal-ai/é",
                                   "fal-ai/x/" + "/".join(["s"] * 20), "fal-ai/" + "x" * 101,
                                   "https://queue.fal.run/fal-ai/x"])
def test_anything_else_is_refused_in_one_line(model: str) -> None:
    problem = model_problem(model)
    assert problem is not None and "\n" not in problem and "endpoint id" in problem


def test_owner_app_is_the_first_two_segments() -> None:
    assert owner_app(ENDPOINT) == "fal-ai/kling-video"
    assert owner_app("fal-ai/flux") == "fal-ai/flux"
    assert owner_app("fal-ai") is None and owner_app("a/../b") is None


# --- matching a history item with an intent -------------------------------------------------

PAYLOAD = {"prompt": "a heron at dawn", "duration": "5", "seed": 7, "loop": False,
           "cfg": 0.5, "tags": ["a", "b"], "nested": {"x": 1}}


def item(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"request_id": RID, "endpoint_id": ENDPOINT,
                            "started_at": "2026-12-06T10:00:01.5Z",
                            "sent_at": "2026-12-06T10:00:00.25Z", "ended_at": None,
                            "status_code": None, "duration": None,
                            "json_input": dict(PAYLOAD), "json_output": None}
    return {**base, **changes}


def test_the_same_endpoint_and_every_field_equal_is_the_same() -> None:
    assert RULES.match_created(item(), PAYLOAD, ENDPOINT) == "same"
    # fields the model added (its defaults) do not count; 7 == 7.0 as JSON
    added = item(json_input={**PAYLOAD, "seed": 7.0, "aspect_ratio": "16:9"})
    assert RULES.match_created(added, PAYLOAD, ENDPOINT) == "same"


@pytest.mark.parametrize("changes", [
    {"endpoint_id": "fal-ai/kling-video/v2/master/image-to-video"},
    {"endpoint_id": "fal-ai/kling-video"},
    {"json_input": {**PAYLOAD, "prompt": "another"}},
    {"json_input": {**PAYLOAD, "seed": 8}},
    {"json_input": {**PAYLOAD, "loop": 0}},  # false is not 0
    {"json_input": {**PAYLOAD, "duration": 5}},  # "5" is not 5
    {"json_input": {**PAYLOAD, "tags": ["b", "a"]}},
    {"json_input": {**PAYLOAD, "nested": {"x": 1, "y": 2}}},
])
def test_another_endpoint_or_any_field_with_another_value_is_other(
        changes: dict[str, Any]) -> None:
    assert RULES.match_created(item(**changes), PAYLOAD, ENDPOINT) == "other"


@pytest.mark.parametrize("changes", [
    {"json_input": None},  # payloads not stored (X-Fal-Store-IO: 0)
    {"json_input": "a string"},
    {"json_input": {k: v for k, v in PAYLOAD.items() if k != "seed"}},  # a field missing
])
def test_an_input_that_cannot_be_compared_is_unsure(changes: dict[str, Any]) -> None:
    assert RULES.match_created(item(**changes), PAYLOAD, ENDPOINT) == "unsure"
    no_payloads = {k: v for k, v in item().items() if k != "json_input"}  # no expand=payloads
    assert RULES.match_created(no_payloads, PAYLOAD, ENDPOINT) == "unsure"


def test_an_item_that_does_not_name_its_endpoint_is_unsure_at_best() -> None:
    unnamed = {k: v for k, v in item().items() if k != "endpoint_id"}
    assert RULES.match_created(unnamed, PAYLOAD, ENDPOINT) == "unsure"
    assert RULES.match_created({**unnamed, "json_input": {**PAYLOAD, "seed": 1}}, PAYLOAD,
                               ENDPOINT) == "other"


def test_a_data_uri_recorded_differently_is_unsure_not_other() -> None:
    payload = {"prompt": "x", "image_url": "data:image/png;base64,AAAA"}
    stored = item(json_input={"prompt": "x", "image_url": "https://v3.fal.media/files/up.png"})
    assert RULES.match_created(stored, payload, ENDPOINT) == "unsure"
    same = item(json_input=dict(payload))
    assert RULES.match_created(same, payload, ENDPOINT) == "same"


@pytest.mark.parametrize("model", [None, "fal-ai", "fal-ai/../x"])
def test_a_model_this_client_never_sends_matches_nothing(model: str | None) -> None:
    assert RULES.match_created(item(), PAYLOAD, model) == "other"


@pytest.mark.parametrize("entry", [None, "x", 3, [item()]])
def test_an_entry_that_is_not_an_object_is_other(entry: Any) -> None:
    assert RULES.match_created(entry, PAYLOAD, ENDPOINT) == "other"


def test_an_empty_payload_matches_any_recorded_input_of_the_endpoint() -> None:
    assert RULES.match_created(item(), {}, ENDPOINT) == "same"
    assert RULES.match_created(item(json_input=None), {}, ENDPOINT) == "unsure"
