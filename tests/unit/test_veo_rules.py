"""Veo's rules without a server (the Gemini API's and Vertex AI's: one set): every shape an
operation comes in, Google's error envelope, the create answer's name, which `--model` it
takes, where a finished operation lists its videos (inline bytes as `inline:{n}`), and the
Vertex client's pure parts (operation names, dropping inline bytes)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from vidpoll.download import INLINE_PREFIX as DOWNLOAD_INLINE_PREFIX
from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT
from vidpoll.providers import registry
from vidpoll.providers.base import Pending, ResultSource, Terminal, Unreadable
from vidpoll.providers.veo.client import operation_path, retry_delay
from vidpoll.providers.veo.rules import (
    DONE,
    INLINE_PREFIX,
    RULES,
    RUNNING,
    google_error,
    operation_failure,
    samples,
)
from vidpoll.providers.vertex.client import parse_operation, strip_inline

GEMINI_NAME = "models/veo-3.1-generate-preview/operations/ren0ubieaocs"
VERTEX_NAME = ("projects/my-proj/locations/us-central1/publishers/google/models/"
               "veo-3.1-generate-001/operations/a1b07c8e-7b5a-4aba-bb34-3e1ccb8afcc8")
FILE_URI = ("https://generativelanguage.googleapis.com/v1beta/files/abc123:download"
            "?alt=media")
REASON = ("Unable to generate videos because the prompt may violate our policies. You will "
          "not be charged for blocked videos.")


def gemini_done(*uris: str, **extra: Any) -> dict[str, Any]:
    inner: dict[str, Any] = {"generatedSamples": [{"video": {"uri": u}} for u in uris], **extra}
    return {"name": GEMINI_NAME, "done": True, "response": {
        "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta."
                 "PredictLongRunningResponse", "generateVideoResponse": inner}}


def vertex_done(videos: list[dict[str, Any]] | None, **extra: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"@type": "type.googleapis.com/cloud.ai.large_models.vision."
                                         "GenerateVideoResponse", **extra}
    if videos is not None:
        response["videos"] = videos
    return {"name": VERTEX_NAME, "done": True, "response": response}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- the provider's fixed answers ------------------------------------------------------------

def test_both_surfaces_share_these_rules_and_their_fixed_answers() -> None:
    assert registry.load("veo").rules is RULES
    assert registry.load("vertex").rules is RULES
    assert RULES.result_source is ResultSource.INLINE
    assert RULES.idempotency_header is None  # Google documents none: unknown creates park
    assert RULES.takes_model is True
    assert RULES.min_poll_s == 10.0  # the docs' samples read every 10 s
    assert dict(RULES.words) == {DONE: "succeeded"}
    assert RULES.result_not_ready(HttpAnswer(404, b"{}"), "NOT_FOUND") is False


# --- status shapes ---------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"name": GEMINI_NAME},
    {"name": GEMINI_NAME, "done": False},
    {"name": VERTEX_NAME, "done": None},
    {"name": GEMINI_NAME, "metadata": {"@type": "x"}},
])
def test_an_operation_not_done_is_pending_with_no_hint(body: dict[str, Any]) -> None:
    assert RULES.read_status(body) == Pending(RUNNING, None)


def test_done_with_an_error_fails_and_says_why() -> None:
    body = {"name": GEMINI_NAME, "done": True,
            "error": {"code": 13, "message": "Video generation failed due to an internal error."}}
    assert RULES.read_status(body) == Terminal(
        DONE, "failed", "error 13: Video generation failed due to an internal error.")
    assert RULES.failure(body) == "error 13: Video generation failed due to an internal error."
    assert operation_failure({"done": True, "error": {"code": 3}}) == "error 3"


def test_done_with_gemini_samples_succeeds_and_lists_their_uris_in_order() -> None:
    second = FILE_URI.replace("abc123", "def456")
    body = gemini_done(FILE_URI, second, FILE_URI)
    assert RULES.read_status(body) == Terminal(DONE, "succeeded")
    assert RULES.failure(body) is None
    assert RULES.media_urls(body) == [FILE_URI, second]  # no repeats, query kept (alt=media)


def test_done_with_vertex_gcs_videos_succeeds_and_downloads_nothing() -> None:
    body = vertex_done([{"gcsUri": "gs://bucket/out/1/sample_0.mp4", "mimeType": "video/mp4"}])
    assert RULES.read_status(body) == Terminal(DONE, "succeeded")
    assert RULES.media_urls(body) == []  # in the user's bucket: recorded, not fetched


def test_done_with_vertex_inline_bytes_lists_each_as_inline_n() -> None:
    body = vertex_done([{"bytesBase64Encoded": b64(b"one"), "mimeType": "video/mp4"},
                        {"bytesBase64Encoded": b64(b"two"), "mimeType": "video/mp4"}])
    assert RULES.read_status(body) == Terminal(DONE, "succeeded")
    assert RULES.media_urls(body) == [f"{INLINE_PREFIX}0", f"{INLINE_PREFIX}1"]
    assert INLINE_PREFIX == DOWNLOAD_INLINE_PREFIX  # the downloader reads these names


def test_inline_bytes_as_the_vertex_client_leaves_them_still_name_the_videos() -> None:
    stripped, _ = strip_inline(vertex_done([{"bytesBase64Encoded": b64(b"one")},
                                            {"gcsUri": "gs://b/x.mp4"},
                                            {"bytesBase64Encoded": b64(b"three")}]))
    assert RULES.read_status(stripped) == Terminal(DONE, "succeeded")
    assert RULES.media_urls(stripped) == ["inline:0", "inline:2"]  # n counts every video


@pytest.mark.parametrize("shape", ["gemini", "vertex"])
def test_done_with_every_video_filtered_fails_with_the_reasons(shape: str) -> None:
    extra = {"raiMediaFilteredCount": 2, "raiMediaFilteredReasons": [REASON]}
    body = gemini_done(**extra) if shape == "gemini" else vertex_done(None, **extra)
    why = RULES.failure(body)
    assert RULES.read_status(body) == Terminal(DONE, "failed", why)  # kept as last_error
    assert why is not None and why.startswith("no video: the safety filters removed 2")
    assert "may violate our policies" in why
    assert RULES.media_urls(body) == []


def test_a_partial_filter_still_succeeds_with_the_videos_left() -> None:
    body = gemini_done(FILE_URI, raiMediaFilteredCount=1, raiMediaFilteredReasons=[REASON])
    assert RULES.read_status(body) == Terminal(DONE, "succeeded")
    assert RULES.failure(body) is None
    assert RULES.media_urls(body) == [FILE_URI]
    body = vertex_done([{"bytesBase64Encoded": b64(b"x")}], raiMediaFilteredCount=3)
    assert RULES.read_status(body) == Terminal(DONE, "succeeded")


def test_done_with_no_video_and_no_filter_count_fails() -> None:
    for body in (vertex_done(None), vertex_done([]), gemini_done(),
                 {"name": GEMINI_NAME, "done": True},
                 vertex_done([{"gcsUri": ""}, {"bytesBase64Encoded": ""}, {"uri": 5}, "x"])):
        assert RULES.read_status(body) == Terminal(
            DONE, "failed", "no video in the finished operation"), body
        assert RULES.failure(body) == "no video in the finished operation"


@pytest.mark.parametrize(("body", "why"), [
    ({}, "not an operation"),
    ({"status": "done"}, "not an operation"),
    ({"name": GEMINI_NAME, "done": "yes"}, "'done' is not true or false"),
    ({"name": GEMINI_NAME, "done": 1}, "'done' is not true or false"),
    ({"name": GEMINI_NAME, "done": True, "error": "boom"}, "'error' is not an object"),
])
def test_garbage_is_unreadable_never_an_end(body: dict[str, Any], why: str) -> None:
    view = RULES.read_status(body)
    assert isinstance(view, Unreadable) and why in view.why


@pytest.mark.parametrize("result", [None, "x", [], {"response": "x"},
                                    {"response": {"videos": "x"}},
                                    {"response": {"generateVideoResponse": {
                                        "generatedSamples": [{"video": "x"}, 3]}}}])
def test_media_urls_of_garbage_is_nothing(result: Any) -> None:
    assert RULES.media_urls(result) == []
    assert samples(result.get("response") if isinstance(result, dict) else None) == []


def test_a_uri_that_is_not_http_is_not_fetched() -> None:
    assert RULES.media_urls(gemini_done("files/abc123", "ftp://x/y", FILE_URI)) == [FILE_URI]


# --- Google's error envelope -----------------------------------------------------------------

def test_api_key_invalid_names_its_reason() -> None:
    body = {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                      "status": "INVALID_ARGUMENT", "details": [{
                          "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                          "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]}}
    assert RULES.error_code(body) == ("INVALID_ARGUMENT (API_KEY_INVALID)",
                                      "API key not valid. Please pass a valid API key.")


def test_resource_exhausted_with_retry_info() -> None:
    raw = {"error": {"code": 429, "message": "Quota exceeded.", "status": "RESOURCE_EXHAUSTED",
                     "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                  "retryDelay": "30s"}]}}
    assert RULES.error_code(raw) == ("RESOURCE_EXHAUSTED", "Quota exceeded.")
    assert retry_delay(json.dumps(raw).encode()) == "30"
    raw["error"]["details"][0]["retryDelay"] = "1.5s"
    assert retry_delay(json.dumps(raw).encode()) == "1.5"
    for delay in ("30", "-1s", "abc", 30, "1e3s"):
        raw["error"]["details"][0]["retryDelay"] = delay
        assert retry_delay(json.dumps(raw).encode()) is None, delay
    assert retry_delay(b"not json") is None
    assert retry_delay(b"") is None


@pytest.mark.parametrize(("body", "found"), [
    ({"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}},
     ("NOT_FOUND", "not found")),
    ({"error": {"code": 13, "message": "internal"}}, ("13", "internal")),
    ({"error": {"status": "UNAVAILABLE"}}, ("UNAVAILABLE", None)),
    # vidpoll's own envelope of a call not sent: its reason is the code the logs show
    ({"error": {"code": "not sent: x", "message": "not sent: x"}},
     ("not sent: x", "not sent: x")),
    ({"error": {"message": "  "}}, ("error", None)),
    ({"error": {"code": 403, "message": "Method doesn't allow unregistered callers",
                "status": "PERMISSION_DENIED"}},
     ("PERMISSION_DENIED", "Method doesn't allow unregistered callers")),
])
def test_google_envelopes(body: dict[str, Any], found: tuple[str | None, str | None]) -> None:
    assert google_error(body) == found


@pytest.mark.parametrize("body", [None, {}, {"error": "x"}, {"error": {"code": 404}},
                                  {"error": {"code": True}}, {"message": "x"}, {"detail": "x"}])
def test_anything_else_is_no_envelope(body: Any) -> None:
    assert RULES.error_code(body) == (None, None)


def test_envelope_text_is_bounded() -> None:
    code, message = google_error({"error": {"status": "X" * 1000, "message": "m" * 10_000,
                                            "details": [{"reason": "R" * 500}]}})
    assert code is not None and len(code) <= 200
    assert message is not None and len(message) <= MAX_ERROR_TEXT


# --- creates and models ----------------------------------------------------------------------

@pytest.mark.parametrize("name", [GEMINI_NAME, VERTEX_NAME, "operations/abc"])
def test_created_job_id_is_the_operation_name(name: str) -> None:
    assert RULES.created_job_id({"name": name}) == name


@pytest.mark.parametrize("body", [None, {}, {"name": 5}, {"name": ""}, {"name": "models/x"},
                                  {"name": "models/x/operations/../y"},
                                  {"name": "models/x/operations/a\x00b"},
                                  {"id": GEMINI_NAME}])
def test_created_job_id_refuses_anything_else(body: Any) -> None:
    assert RULES.created_job_id(body) is None


@pytest.mark.parametrize("model", ["veo-3.1-generate-preview", "veo-2.0-generate-001",
                                   "veo_3", "V3"])
def test_model_ids_are_taken(model: str) -> None:
    assert RULES.model_problem(model) is None


@pytest.mark.parametrize("model", ["", "-veo", "veo/3", "veo 3", "../veo", "veo..3", "veo:3",
                                   "veo?x", "v" * 200, "véo"])
def test_model_ids_that_cannot_be_one_path_segment_are_refused(model: str) -> None:
    problem = RULES.model_problem(model)
    assert problem is not None and "--model" in problem


# --- operation names as the clients check them ---------------------------------------------

def test_gemini_operation_paths() -> None:
    assert operation_path(GEMINI_NAME) == GEMINI_NAME
    for odd in ("x", "models/x", "models/x/operations/", "models//operations/y",
                "models/x/operations/../y", "models/x/operations/y?alt=media",
                "models/x/operations/y#z", "models/x/operations/%2e%2e", "/models/x/operations/y",
                "models/x/operations/y/", "models/x/files/y", "models/x/operations/a b"):
        assert operation_path(odd) is None, odd


def test_vertex_operation_names() -> None:
    assert parse_operation(VERTEX_NAME) == (
        "my-proj", "us-central1", "veo-3.1-generate-001", "a1b07c8e-7b5a-4aba-bb34-3e1ccb8afcc8")
    parts = VERTEX_NAME.split("/")
    for i in range(len(parts)):
        for bad in ("", "..", "a/b", "x?y"):
            odd = "/".join([*parts[:i], bad, *parts[i + 1:]])
            assert parse_operation(odd) is None, odd
    for odd in (GEMINI_NAME, VERTEX_NAME + "/x", VERTEX_NAME.replace("google", "other"),
                VERTEX_NAME.replace("/operations/", "/ops/")):
        assert parse_operation(odd) is None, odd


# --- inline bytes, dropped -------------------------------------------------------------------

def test_strip_inline_keeps_size_and_digest_and_the_bytes_asked_for() -> None:
    one, two = b"\x00first video" * 100, b"second"
    body = vertex_done([{"bytesBase64Encoded": b64(one), "mimeType": "video/mp4"},
                        {"gcsUri": "gs://b/x"}, {"bytesBase64Encoded": b64(two)}])
    stripped, kept = strip_inline(json.loads(json.dumps(body)), keep=2)
    assert kept == two
    videos = stripped["response"]["videos"]
    assert videos[0] == {"inlineBytes": len(one), "sha256": hashlib.sha256(one).hexdigest(),
                         "mimeType": "video/mp4"}
    assert videos[1] == {"gcsUri": "gs://b/x"}
    assert videos[2]["inlineBytes"] == len(two)
    assert "bytesBase64Encoded" not in json.dumps(stripped)
    _, nothing = strip_inline(json.loads(json.dumps(body)), keep=7)
    assert nothing is None


def test_strip_inline_marks_bytes_that_are_not_base64() -> None:
    stripped, kept = strip_inline(vertex_done([{"bytesBase64Encoded": "abc"}]), keep=0)
    assert kept is None
    assert stripped["response"]["videos"][0] == {
        "inlineProblem": "bytesBase64Encoded was not valid base64"}
    # still a video of a succeeded render: its download fails, saying so
    assert RULES.read_status(stripped) == Terminal(DONE, "succeeded")
    assert RULES.media_urls(stripped) == ["inline:0"]
