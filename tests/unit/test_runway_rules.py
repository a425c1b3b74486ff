"""Runway's rules without a server: every status word and shape a task comes in (THROTTLED's
wait and RUNNING's progress shown beside the word), Runway's error envelope (its 404 "Could
not find Task" is its own answer, never a wrong URL), the create answer's id, which `--model`
(create endpoint) it takes, where a succeeded task lists its outputs, and the provider's fixed
answers (no idempotency key, no list, no webhooks, the 5 s floor)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT, is_misrouted, is_misrouted_create, probe_verdict
from vidpoll.providers import registry
from vidpoll.providers.base import Pending, ResultSource, Terminal, Unreadable
from vidpoll.providers.runway import DEFAULT_API_VERSION, DEFAULT_BASE_URL, PROVIDER
from vidpoll.providers.runway.client import RunwayClient, refused_unsent
from vidpoll.providers.runway.rules import (
    ENDPOINTS,
    ERROR_CODE,
    RULES,
    THROTTLED_DETAIL,
    WORDS,
    model_problem,
    progress_detail,
    runway_error,
)

TASK_ID = "17f20503-6c24-4c16-946b-35dbbce2af2f"
SIGNED = ("https://dnznrvs05pmza.cloudfront.net/3a7e/task_output.mp4"
          "?_jwt=eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjE3MDB9.c2lnbmF0dXJl")


def task(status: str, **extra: Any) -> dict[str, Any]:
    return {"id": TASK_ID, "createdAt": "2026-12-06T10:00:00.000Z", "status": status, **extra}


# --- the provider's fixed answers ------------------------------------------------------------

def test_the_provider_is_found_by_name_with_its_fixed_answers() -> None:
    assert "runway" in registry.names()
    provider = registry.load("runway")
    assert provider is PROVIDER and provider.rules is RULES
    assert (provider.name, provider.title, provider.env_prefix) == (
        "runway", "Runway", "RUNWAYML")
    assert provider.default_base_url == DEFAULT_BASE_URL == "https://api.dev.runwayml.com"
    assert provider.webhooks is None  # Runway has no native webhooks
    assert provider.default_rates == (None, None)  # "No maximum requests-per-minute limit"
    option = PROVIDER.account_options["api_version"]
    assert (option.kind, option.default) == ("text", DEFAULT_API_VERSION) == ("text",
                                                                               "2024-11-06")
    assert RULES.result_source is ResultSource.INLINE
    assert RULES.idempotency_header is None  # none documented: unknown creates park
    assert RULES.takes_model is True
    assert RULES.min_poll_s == 5.0  # "no updates more frequent than once every five seconds"
    assert dict(RULES.words) == {"succeeded": "succeeded", "failed": "failed",
                                 "cancelled": "canceled"}
    assert RULES.result_not_ready(HttpAnswer(404, b"{}"), ERROR_CODE) is False


def test_the_client_has_no_list_so_an_unknown_create_is_parked() -> None:
    client = PROVIDER.client(DEFAULT_BASE_URL, "key_x", timeout_s=1.0, max_connections=1)
    assert isinstance(client, RunwayClient)
    assert not hasattr(client, "list_created") and not hasattr(client, "find_created")
    assert callable(getattr(client, "fresh_media", None))
    assert client.media_headers() == {} and client.media_auth_hosts() == frozenset()


# --- status words and shapes -----------------------------------------------------------------

@pytest.mark.parametrize(("body", "view"), [
    (task("PENDING", estimatedCost={"credits": 25}), Pending("pending", None)),
    (task("THROTTLED", estimatedCost={"credits": 25}),
     Pending("throttled", None, detail=THROTTLED_DETAIL)),
    (task("RUNNING", progress=0.4), Pending("running", None, detail="progress 40%")),
    (task("RUNNING", progress=0), Pending("running", None, detail="progress 0%")),
    (task("RUNNING", progress=1), Pending("running", None, detail="progress 100%")),
    (task("RUNNING", progress=0.125), Pending("running", None, detail="progress 12%")),
    (task("RUNNING"), Pending("running", None)),
    (task("running", progress=0.5), Pending("running", None, detail="progress 50%")),
])
def test_a_task_not_ended_is_pending_with_no_hint(body: dict[str, Any], view: Pending) -> None:
    assert RULES.read_status(body) == view


@pytest.mark.parametrize("progress", [-0.1, 1.5, 40, "0.4", True, None, float("nan"),
                                      float("inf"), [0.4]])
def test_a_progress_that_is_no_fraction_is_not_shown(progress: Any) -> None:
    assert progress_detail(progress) is None
    assert RULES.read_status(task("RUNNING", progress=progress)) == Pending("running", None)


def test_an_unknown_word_keeps_the_task_polled_and_is_flagged() -> None:
    assert RULES.read_status(task("QUEUED_FOR_REVIEW")) == Pending(
        "queued_for_review", None, known=False)
    assert RULES.read_status(task("  Pending ")) == Pending("pending", None)


def test_succeeded_lists_its_output_in_order() -> None:
    second = SIGNED.replace("task_output", "task_output_2")
    body = task("SUCCEEDED", output=[SIGNED, second, SIGNED], cost={"credits": 25})
    assert RULES.read_status(body) == Terminal("succeeded", "succeeded")
    assert RULES.media_urls(body) == [SIGNED, second]  # no repeats, as given
    stripped = task("SUCCEEDED", output=[SIGNED.split("?")[0]])  # as stored
    assert RULES.media_urls(stripped) == [SIGNED.split("?")[0]]


def test_failed_says_why_with_its_code() -> None:
    body = task("FAILED", failure="The input image was flagged by content moderation.",
                failureCode="SAFETY.INPUT.IMAGE", cost={"credits": 0})
    assert RULES.read_status(body) == Terminal(
        "failed", "failed",
        "SAFETY.INPUT.IMAGE: The input image was flagged by content moderation.")
    assert RULES.read_status(task("FAILED", failure="Internal error")) == Terminal(
        "failed", "failed", "Internal error")
    assert RULES.read_status(task("FAILED", failureCode="INTERNAL")) == Terminal(
        "failed", "failed", "INTERNAL")
    assert RULES.read_status(task("FAILED")) == Terminal("failed", "failed", None)
    long = RULES.read_status(task("FAILED", failure="x" * 10_000))
    assert isinstance(long, Terminal) and len(long.detail or "") == MAX_ERROR_TEXT
    assert RULES.media_urls(body) == []


def test_cancelled_is_canceled() -> None:
    view = RULES.read_status(task("CANCELLED", cost={"credits": 0}))
    assert isinstance(view, Terminal)
    assert (view.word, view.outcome) == ("cancelled", "canceled")
    assert WORDS[view.word] == view.outcome


@pytest.mark.parametrize("body", [{}, {"id": TASK_ID}, {"status": None}, {"status": ""},
                                  {"status": 3}, {"status": ["SUCCEEDED"]}])
def test_a_body_without_a_status_word_is_unreadable_never_an_end(body: dict[str, Any]) -> None:
    assert isinstance(RULES.read_status(body), Unreadable)


@pytest.mark.parametrize("result", [None, "x", [], {}, {"output": "https://x/y.mp4"},
                                    {"output": [3, None, {"url": "https://x/y"}]},
                                    {"output": ["/relative.mp4", "ftp://x/y", "data:x"]}])
def test_media_urls_of_garbage_is_nothing(result: Any) -> None:
    assert RULES.media_urls(result) == []


# --- Runway's error envelope -----------------------------------------------------------------

@pytest.mark.parametrize(("body", "found"), [
    ({"error": "Could not find Task"}, (ERROR_CODE, "Could not find Task")),
    ({"error": "Invalid API version", "docUrl": "https://docs.dev.runwayml.com/api"},
     (ERROR_CODE, "Invalid API version")),
    ({"error": "Validation of body failed",
      "issues": [{"code": "invalid_type", "path": ["promptImage"], "message": "Required"},
                 {"code": "too_big", "path": ["duration"], "message": "Too big"}]},
     (ERROR_CODE, "Validation of body failed (promptImage: Required; duration: Too big)")),
    ({"error": "Bad", "issues": [{"path": ["a", 0], "message": "m"}, "plain", {}, 5,
                                 {"code": "c"}]},
     (ERROR_CODE, "Bad (a.0: m; plain; and 2 more)")),
    ({"error": "Bad", "issues": "nope"}, (ERROR_CODE, "Bad")),
    ({"error": "You have exceeded your daily task limit."},
     (ERROR_CODE, "You have exceeded your daily task limit.")),
])
def test_runway_envelopes(body: dict[str, Any], found: tuple[str, str]) -> None:
    assert RULES.error_code(body) == found


@pytest.mark.parametrize("body", [None, {}, {"error": ""}, {"error": "  "}, {"error": 404},
                                  {"error": {"code": 404, "message": "x"}}, {"message": "x"},
                                  {"detail": "Not Found"}, {"errors": ["x"]}])
def test_anything_else_is_no_envelope(body: Any) -> None:
    assert runway_error(body) == (None, None)


def test_envelope_text_is_bounded() -> None:
    code, message = runway_error({"error": "m" * 10_000})
    assert code == ERROR_CODE and len(message or "") == MAX_ERROR_TEXT


def test_runways_own_404_is_no_wrong_url_but_a_bare_404_is() -> None:
    ours = {"error": "Could not find Task"}
    assert not is_misrouted(404, ours, RULES)
    assert is_misrouted(404, None, RULES) and is_misrouted(404, {"message": "x"}, RULES)
    assert probe_verdict(HttpAnswer(404, json.dumps(ours).encode()), RULES) == "provider"
    assert not is_misrouted_create(400, {"error": "Invalid API version"}, RULES)
    assert is_misrouted_create(404, {"detail": "Not Found"}, RULES)


def test_an_unsent_call_answers_in_runways_envelope() -> None:
    answer = refused_unsent(401, "the API key cannot go into an HTTP header: x")
    code, message = RULES.error_code(json.loads(answer.body))
    assert answer.status == 401 and code == ERROR_CODE
    assert message == "not sent: the API key cannot go into an HTTP header: x"


# --- the create's answer and --model ---------------------------------------------------------

@pytest.mark.parametrize(("body", "job_id"), [
    ({"id": TASK_ID}, TASK_ID),
    ({"id": TASK_ID, "estimatedCost": {"credits": 25}}, TASK_ID),
    ({"id": ""}, None), ({"id": "  "}, None), ({"id": 7}, None), ({"id": None}, None),
    ({"id": "a\x00b"}, None), ({"id": "x" * 2000}, None), ({}, None), (None, None),
    ({"task": {"id": TASK_ID}}, None),
])
def test_the_created_task_id(body: Any, job_id: str | None) -> None:
    assert RULES.created_job_id(body) == job_id


@pytest.mark.parametrize("model", [*ENDPOINTS, "text_to_image", "generate/image", "v2_video"])
def test_a_create_endpoint_is_a_model(model: str) -> None:
    assert model_problem(model) is None
    assert RULES.model_problem(model) is None


@pytest.mark.parametrize("model", [
    "", "gen4_turbo/", "/image_to_video", "Image_To_Video", "image-to-video", "gen4.5",
    "a/b/c", "generate/video/x", "../tasks", "image_to_video?x=1", "image_to_video ",
    "tasks", "tasks/abc", "organization", "uploads", "x" * 65, "généré",
])
def test_anything_else_is_refused_in_one_line(model: str) -> None:
    why = model_problem(model)
    assert why is not None and "\n" not in why
    assert "is not a Runway create endpoint" in why and "image_to_video" in why
    assert len(why) < 400
