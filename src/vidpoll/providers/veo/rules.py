"""What Google's Veo answers mean, on the Gemini API and on Vertex AI: a long-running
operation, its end, its videos, Google's error envelope. Pure; no I/O.

Facts (google-genai 2.34's `models.py` generate_videos, `operations.py`, `types.py`; the Gemini
API video docs; shared/reference/PROVIDERS.md section 2 and its 2026-12-06 updates):
- a create answers `{"name": "models/{model}/operations/{id}"}` (Vertex:
  `projects/{p}/locations/{l}/publishers/google/models/{model}/operations/{id}`): the name is
  the only handle, and the job id;
- an operation not finished has no `done` (or `done: false`); a finished one has `done: true`
  and either `error` (a `google.rpc.Status`: a numeric `code` such as 13, a `message`) or a
  `response`: on the Gemini API `response.generateVideoResponse.generatedSamples[].video.uri`,
  on Vertex AI `response.videos[]` with `bytesBase64Encoded` or `gcsUri`; a response with no
  video at all is a render the safety filters removed (`raiMediaFilteredCount`,
  `raiMediaFilteredReasons`): a failure, never a success;
- errors are `{"error": {"code", "message", "status", "details"?}}` (a wrong API key: 400
  INVALID_ARGUMENT with reason API_KEY_INVALID; no key: 403 PERMISSION_DENIED; 429
  RESOURCE_EXHAUSTED with a `google.rpc.RetryInfo` `retryDelay` in its details);
- no poll hint; the docs' samples read every 10 s (`min_poll_s`);
- no idempotency key, and no list that could tell one create from another (a listed operation
  carries neither its request nor its creation time): an unknown create is parked.

Terminal word: Veo has none, so vidpoll writes `done` for every end (the outcome says how it
ended: `succeeded`, or `failed` for an error or a filtered render).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vidpoll.errors import InvalidJobId
from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT, validate_job_id
from vidpoll.providers import render_time as rt
from vidpoll.providers.base import (
    NeutralOutcome,
    Pending,
    ResultSource,
    StatusView,
    Terminal,
    Unreadable,
)

DONE = "done"
"""The word vidpoll keeps as `state` for every finished operation."""
WORDS: Mapping[str, NeutralOutcome] = {DONE: "succeeded"}
"""The fallback for a writer that names no outcome (vidpoll's worker always names one)."""
RUNNING = "running"
"""The word shown while an operation has not finished (Veo sends none)."""
DOCS_POLL_S = 10.0
"""The Gemini API docs' samples read an operation every 10 seconds."""
MAX_CODE_TEXT = 200
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A model id as it goes in `models/{model}:predictLongRunning`: one path segment (no model id
is written in vidpoll's code: Google retires them often)."""
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,255}")
"""One segment of an operation's name (`models`, `veo-x`, `operations`, its id)."""
INLINE_PREFIX = "inline:"
"""A video that came back as bytes in the operation (Vertex AI without `storageUri`): its
media "URL" names its place, `inline:{n}`, and the client reads the bytes again to download
them (they are never stored in the database)."""


def operation_path(name: str) -> str | None:
    """An operation's `name` as a path under the API version, each segment checked (letters,
    digits, `.`, `_`, `~`, `-`; never `.` or `..`) and ending `operations/{id}`; None when it
    is not one."""
    parts = name.split("/")
    if (len(parts) < 2 or parts[-2] != "operations"
            or not all(_SEGMENT.fullmatch(p) for p in parts)):
        return None
    return name


def google_error(body: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(code, message) of Google's envelope `{"error": {"code", "message", "status"}}`: the
    `status` word (`RESOURCE_EXHAUSTED`), else the numeric code as text, and a reason from
    `details` when there is one (`API_KEY_INVALID`). (None, None) for any other body."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None, None
    status, code, message = error.get("status"), error.get("code"), error.get("message")
    if not isinstance(message, str) and not isinstance(status, str):
        return None, None
    # a text code: vidpoll's own envelope of a call it did not send (veo.client.refused_unsent)
    word = status if isinstance(status, str) and status else (
        str(code) if isinstance(code, int | str) and not isinstance(code, bool) and code
        else "error")
    reason = _reason(error.get("details"))
    if reason:
        word = f"{word} ({reason})"
    text = message.strip() if isinstance(message, str) and message.strip() else None
    return word[:MAX_CODE_TEXT], text[:MAX_ERROR_TEXT] if text else None


def _reason(details: Any) -> str | None:
    for item in details if isinstance(details, list) else ():
        if isinstance(item, dict) and isinstance(item.get("reason"), str):
            return str(item["reason"])[:64]
    return None


def operation_failure(body: dict[str, Any]) -> str | None:
    """Why a finished operation made no video, in one line: its `error`, or the safety
    filters' reasons; None when it holds a video."""
    error = body.get("error")
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
        return (f"error {code}: {message}" if message else f"error {code}")[:MAX_ERROR_TEXT]
    if samples(body.get("response")):
        return None
    response = body.get("response") if isinstance(body.get("response"), dict) else {}
    inner = _inner(response)
    count = inner.get("raiMediaFilteredCount")
    reasons = inner.get("raiMediaFilteredReasons")
    shown = "; ".join(r for r in reasons if isinstance(r, str))[:300] if isinstance(
        reasons, list) else ""
    if count or shown:
        return f"no video: the safety filters removed {count or 'it'}" + (
            f" ({shown})" if shown else "")
    return "no video in the finished operation"


def _inner(response: Any) -> dict[str, Any]:
    """The part of a response that holds the videos and the filter counts: the Gemini API's
    `generateVideoResponse`, or Vertex AI's response itself."""
    if not isinstance(response, dict):
        return {}
    inner = response.get("generateVideoResponse")
    return inner if isinstance(inner, dict) else response


def samples(response: Any) -> list[dict[str, Any]]:
    """The videos of a response, each as `{"uri"}` (Gemini API), `{"gcsUri"}` or
    `{"bytesBase64Encoded"}` (Vertex AI), in order."""
    inner = _inner(response)
    listed = inner.get("generatedSamples")
    videos = [s.get("video") for s in listed if isinstance(s, dict)] if isinstance(
        listed, list) else []
    listed = inner.get("videos")
    videos += listed if isinstance(listed, list) else []
    return [v for v in videos if isinstance(v, dict) and (
        any(isinstance(v.get(k), str) and v[k] for k in ("uri", "gcsUri"))
        or is_inline(v))]


def is_inline(video: dict[str, Any]) -> bool:
    """Whether a video came back as bytes in the operation: `bytesBase64Encoded` as Google
    sends it, or as the Vertex client leaves it in place of the bytes (`inlineBytes`, their
    decoded size, and `sha256`; `inlineProblem` when they were not valid base64)."""
    data = video.get("bytesBase64Encoded")
    if isinstance(data, str) and data:
        return True
    size = video.get("inlineBytes")
    return ((isinstance(size, int) and not isinstance(size, bool) and size > 0)
            or bool(video.get("inlineProblem")))


class VeoRules:
    """Veo's answers on the Gemini API (`vidpoll.providers.base.Rules`); Vertex AI's are the
    same but for where its videos are (`vidpoll.providers.vertex`)."""

    result_source = ResultSource.INLINE
    """The finished operation holds the videos: no result call."""
    idempotency_header = None
    """Google documents none, and no list tells one create from another: an unknown create is
    parked for an operator (or, by the account's choice, sent again)."""
    takes_model = True
    """`submit --model MODEL_ID`: the model goes in the create's path."""
    min_poll_s = DOCS_POLL_S
    rate_limit_headers = ("", "")
    words = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        """An operation: not `done` → pending (no hint); done → `done`, succeeded with a
        video, failed with an error or when the filters removed every video."""
        done = body.get("done", False)
        if done is False or done is None:
            if not isinstance(body.get("name"), str) and "error" not in body:
                return Unreadable("not an operation (no 'name', no 'done')")
            return Pending(RUNNING, None)
        if done is not True:
            return Unreadable("'done' is not true or false")
        if isinstance(body.get("error"), dict):
            return Terminal(DONE, "failed", operation_failure(body))
        if "error" in body and body["error"] is not None:
            return Unreadable("'error' is not an object")
        if samples(body.get("response")):
            return Terminal(DONE, "succeeded")
        return Terminal(DONE, "failed", operation_failure(body))

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        return google_error(body)

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """The operation's `name`, if it is one a client can read (`operation_path`): a name
        no read could send is no job (the create's outcome is then unknown, and parked)."""
        value = body.get("name") if isinstance(body, dict) else None
        if not isinstance(value, str) or operation_path(value) is None:
            return None
        try:
            return validate_job_id(value)
        except InvalidJobId:
            return None

    def duration_key(self, payload: dict[str, Any], model: str | None) -> str | None:
        """`parameters.durationSeconds` (`8s`) and `parameters.resolution` (`720p`,
        `1080p`, `4k`) of the request, where google-genai's `generate_videos` puts its
        `duration_seconds` and `resolution` (ai.google.dev/gemini-api/docs/video), on the
        Gemini API and Vertex AI alike; None when the body names neither (the model's
        defaults apply)."""
        parameters = rt.dig(payload, "parameters")
        return rt.key(rt.seconds(rt.dig(parameters, "durationSeconds")),
                      rt.word(rt.dig(parameters, "resolution")))

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        return False  # inline results: there is no result call to be early for

    def media_urls(self, result: Any) -> list[str]:
        """Each video's `uri` (the Gemini API's files, which want the key), in order; Vertex
        AI's `bytesBase64Encoded` as `inline:{n}`. `gcsUri` (a Cloud Storage object in the
        user's bucket) is recorded in the result, not downloaded."""
        found: list[str] = []
        for n, video in enumerate(samples(result.get("response") if isinstance(
                result, dict) else None)):
            uri = video.get("uri")
            if isinstance(uri, str) and uri[:8].lower().startswith(("http://", "https://")):
                found.append(uri)
            elif is_inline(video):
                found.append(f"{INLINE_PREFIX}{n}")
        return list(dict.fromkeys(found))

    def model_problem(self, model: str) -> str | None:
        """Why `--model` cannot name a Veo model (one line); None when it can."""
        if _MODEL.fullmatch(model) and ".." not in model:
            return None
        return (f"--model {model[:100]!r} is not a model id (letters, digits, '.', '_' and '-', "
                f"starting with a letter or digit, like the ids Google's model list shows)")

    def failure(self, body: dict[str, Any]) -> str | None:
        """Why a finished operation made no video (see `operation_failure`)."""
        return operation_failure(body)


RULES = VeoRules()
