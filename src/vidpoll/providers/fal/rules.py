"""What fal's queue answers mean: its status words and their one terminal word, its two error
bodies, the create answer's id and URLs, where a model's output lists its files, which
`--model` (endpoint id) it takes, and whether a request in its history is the one an
unanswered create started. Pure; no I/O.

Facts (fal's queue docs, docs.fal.ai/model-endpoints/queue and the inference-api page; its
errors pages, fal.ai/docs/documentation/model-apis/errors and .../request-errors; the platform
API's request history, docs.fal.ai/platform-apis/v1/models/requests/by-endpoint; fal_client
1.0.3's `client.py`; PROVIDERS.md (project notes) section 5 and its 2026-12-06
"Updates"):

- a status answer's `status` is `IN_QUEUE` (with `queue_position`, the requests ahead),
  `IN_PROGRESS` or `COMPLETED` (HTTP 202 while queued or running, 200 once completed); a
  failed request is `COMPLETED` with `error` and `error_type`, not a word of its own; fal
  sends no poll hint;
- errors are `{"detail": "..."}` (request errors add `error_type`, also sent as the
  `X-Fal-Error-Type` header) or, for a model's own validation errors, `{"detail": [{"loc",
  "msg", "type", ...}]}` (FastAPI's shape, HTTP 422); a wrong key answers 401 `{"detail": "No
  user found for Key ID and Secret"}`; the result URL of a request not completed answers 400
  `{"detail": "Request is still in progress"}`;
- a create answers `request_id` with `status_url`, `response_url` and `cancel_url` ("do not
  build these URLs yourself": they name only owner/app, never the endpoint's subpath);
- the history lists each request with `endpoint_id`, `sent_at`, `started_at` and, with
  `expand=payloads`, `json_input` (null when the create sent `X-Fal-Store-IO: 0`);
- cost: a status answer carries no cost figure (Model APIs bill per output at each model's
  price, docs.fal.ai/documentation/model-apis/pricing); "Server errors (HTTP 500+) are never
  charged", while an invalid input (422) "may still be charged if a runner spent GPU time"
  (docs.fal.ai/faq). The request-error types whose typical status is 5xx
  (docs.fal.ai/documentation/model-apis/request-errors) are such server errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from vidpoll.errors import InvalidJobId
from vidpoll.media import media_urls as _media_urls
from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT, parsed_json_object, validate_job_id
from vidpoll.providers import render_time as rt
from vidpoll.providers.base import (
    CURRENCY,
    Cost,
    NeutralOutcome,
    Pending,
    ResultSource,
    StatusView,
    Terminal,
    Unreadable,
)
from vidpoll.providers.echo import Match, fields_verdict, holds_data_uri, json_strings

COMPLETED = "completed"
WORDS: Mapping[str, NeutralOutcome] = {COMPLETED: "succeeded"}
"""Every terminal word and the outcome of a writer that names none: fal has one, `COMPLETED`
(its outcome is read from the answer: `error` makes it failed)."""
IN_PROGRESS_STATUSES = frozenset({"in_queue", "in_progress"})
"""The words of a request that has not ended; any other word keeps it polled, logged."""
CANCELLED_TYPE = "client_cancelled"
"""The `error_type` of a request cancelled by its owner (fal's request-errors page): outcome
`canceled`, not `failed`."""
SERVER_ERROR_TYPES = frozenset({
    "request_timeout", "startup_timeout", "runner_scheduling_failure",
    "runner_connection_timeout", "runner_disconnected", "runner_connection_refused",
    "runner_connection_error", "runner_incomplete_response", "runner_server_error",
    "internal_error"})
"""The `error_type`s of fal's request-errors page whose typical status is 500 or above: a
request that failed so is never charged (fal's FAQ)."""
DETAIL_CODE = "detail"
"""The code of an error body that names none of its own (`{"detail": "..."}`)."""
MAX_CODE_TEXT = 200
STILL_RUNNING = "still in progress"
"""What the result URL's 400 says before the request completed ("Request is still in
progress")."""
HANDLE_FIELDS = ("status_url", "response_url", "cancel_url")
"""What a create answer holds beyond the request id that later reads must use."""
MAX_HANDLE_URL = 2048
MAX_SEGMENTS = 16

_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""One segment of an endpoint id: starts with a letter or a digit (never `.` or `..`, which a
server could read as a directory)."""


def model_problem(model: str) -> str | None:
    """Why `model` cannot be a fal endpoint id (`owner/app` or `owner/app/sub/path`), in one
    line; None when it can."""
    parts = model.split("/")
    if (2 <= len(parts) <= MAX_SEGMENTS and all(_SEGMENT.fullmatch(p) for p in parts)
            and ".." not in model):
        return None
    return (f"--model {model[:100]!r} is not a fal endpoint id (owner/app, optionally with more "
            f"/segments, like fal-ai/kling-video/v2/master/text-to-video; each segment letters, "
            f"digits, '.', '_' and '-', starting with a letter or a digit, no '..')")


def owner_app(model: str) -> str | None:
    """The `owner/app` of an endpoint id (its queue URLs name only these); None when `model`
    is not an endpoint id."""
    if model_problem(model) is not None:
        return None
    owner, app = model.split("/")[:2]
    return f"{owner}/{app}"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _validation_item(item: Any) -> bool:
    return isinstance(item, dict) and (isinstance(item.get("msg"), str)
                                       or isinstance(item.get("type"), str))


def problem(body: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(code, message) of fal's error body; (None, None) for any other body.

    `{"detail": "text"[, "error_type": T]}` gives (T or `detail`, the text); `{"detail":
    [{"loc", "msg", "type"}, ...]}` (a model's validation error) gives (the first item's
    `type`, its `msg`); a body with only `error_type` gives (it, None)."""
    if not isinstance(body, dict):
        return None, None
    error_type = _text(body.get("error_type"))
    detail = body.get("detail")
    code: str | None = None
    message: str | None = None
    if _text(detail) is not None:
        code, message = DETAIL_CODE, str(detail)
    elif isinstance(detail, list) and detail and all(_validation_item(i) for i in detail):
        first = detail[0]
        code = _text(first.get("type")) or "validation_error"
        message = _text(first.get("msg"))
        if message is not None and len(detail) > 1:
            message = f"{message} (and {len(detail) - 1} more)"
    elif isinstance(detail, dict) and (_text(detail.get("msg")) or _text(detail.get("message"))
                                       or _text(detail.get("type"))):
        code = _text(detail.get("type")) or DETAIL_CODE
        message = _text(detail.get("msg")) or _text(detail.get("message"))
    if error_type is not None:
        code = error_type
    if code is None:
        return None, None
    return code[:MAX_CODE_TEXT], message[:MAX_ERROR_TEXT] if message is not None else None


_strings = json_strings
_holds_data_uri = holds_data_uri


def match_created(entry: Any, payload: dict[str, Any], model: str | None) -> Match:
    """Whether `entry` (one item of fal's request history, read with `expand=payloads`) is a
    create of `payload` for the endpoint `model`.

    `other`: another endpoint, or an input field of `payload` recorded with another value
    (compared as JSON: 1 == 1.0, true is not 1); also every entry for a model this client
    never sends (none, or not an endpoint id: `create_video` refuses it unsent).
    `unsure`: the endpoint matches (or the entry does not say it) but the input cannot prove
    it: not recorded (`json_input` null: the create asked fal not to store payloads), a field
    of `payload` missing from it, or a field holding a `data:` URI recorded differently (fal
    may keep an upload as a file URL of its own).
    `same`: the endpoint matches and every field of `payload` is recorded with an equal value
    (fields fal or the model added, their defaults, do not count)."""
    if not isinstance(entry, dict) or model is None or model_problem(model) is not None:
        return "other"
    seen_endpoint = entry.get("endpoint_id")
    endpoint_shown = isinstance(seen_endpoint, str)
    if endpoint_shown and seen_endpoint != model:
        return "other"
    recorded = entry.get("json_input")
    if not isinstance(recorded, dict):
        return "unsure"
    return fields_verdict(payload, recorded, endpoint_shown)


class FalRules:
    """fal's answers (`vidpoll.providers.base.Rules`)."""

    result_source = ResultSource.SEPARATE
    """A completed request's output is at its `response_url`: a call of its own."""
    idempotency_header = None
    """fal documents none: an unanswered create is looked up in the request history
    (`FalClient.list_created`), never sent again blindly."""
    takes_model = True
    """`submit --model` names the endpoint id (`fal-ai/kling-video/v2/master/text-to-video`)."""
    min_poll_s = 1.0
    """fal documents no request-rate limit (its SDK polls every 0.1 s); a video takes minutes:
    one read a second of a job is plenty."""
    rate_limit_headers = ("", "")
    """fal documents no rate-limit headers (its limits are on concurrency: requests queue)."""
    words = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        """A request's `status`: `IN_QUEUE`/`IN_PROGRESS` pending (no hint: fal gives none;
        the queue position shown beside the word: `in_queue (position 3)`), `COMPLETED`
        terminal, failed when it carries an `error` (or `error_type`), canceled when that type
        is `client_cancelled`."""
        word = _text(body.get("status"))
        if word is None:
            return Unreadable("no 'status' word")
        word = word.strip().lower()
        if word != COMPLETED:
            position = body.get("queue_position")
            detail = (f"position {position}" if isinstance(position, int)
                      and not isinstance(position, bool) and 0 <= position < 10**9 else None)
            return Pending(word, None, known=word in IN_PROGRESS_STATUSES, detail=detail)
        error, error_type = body.get("error"), _text(body.get("error_type"))
        if error_type is None and error in (None, "", [], {}):
            return Terminal(COMPLETED, "succeeded")
        text = error if isinstance(error, str) and error.strip() else None
        said = ": ".join(p for p in (error_type, text) if p) or None
        return Terminal(COMPLETED, "canceled" if error_type == CANCELLED_TYPE else "failed",
                        said[:MAX_ERROR_TEXT] if said else None)

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        return problem(body)

    def cost(self, body: dict[str, Any], outcome: NeutralOutcome) -> Cost | None:
        """Nothing for a request that failed with a server error (`error_type` one of
        SERVER_ERROR_TYPES); None otherwise: fal's answers carry no cost figure, and a failed
        input or a cancelled request may have been charged."""
        error_type = _text(body.get("error_type"))
        if outcome == "failed" and error_type is not None and (
                error_type.strip().lower() in SERVER_ERROR_TYPES):
            return Cost(Decimal(0), CURRENCY)
        return None

    def duration_key(self, payload: dict[str, Any], model: str | None) -> str | None:
        """The clip length of the model's input (the body): its `duration` as fal's video
        endpoints write it (an integer, `"5"` or `"8s"`: fal.ai/models/{endpoint}/llms.txt,
        e.g. fal-ai/kling-video/v2.1/master/text-to-video, fal-ai/kling-video/v4), else its
        `num_frames` (a whole number: `121f`), and its `resolution` (`720p`); None when the
        input names none of them. Each endpoint has its own schema: a value in another form
        (an object, prose) gives no part."""
        clip = rt.seconds(rt.dig(payload, "duration")) or rt.frames(rt.dig(payload, "num_frames"))
        return rt.key(clip, rt.word(rt.dig(payload, "resolution")))

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """The `request_id` of a create answer (or a webhook's body)."""
        value = body.get("request_id") if isinstance(body, dict) else None
        if not isinstance(value, str):
            return None
        try:
            return validate_job_id(value)
        except InvalidJobId:
            return None

    def created_handle(self, body: dict[str, Any] | None,
                       model: str | None = None) -> dict[str, Any] | None:
        """The create answer's `status_url`, `response_url` and `cancel_url` (the strings as
        sent; the client checks each before using it); None when it holds none."""
        if not isinstance(body, dict):
            return None
        handle = {name: value for name in HANDLE_FIELDS
                  if isinstance(value := body.get(name), str)
                  and value.strip() and len(value) <= MAX_HANDLE_URL}
        return handle or None

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        """The result URL's 400 "Request is still in progress"."""
        if answer.status != 400:
            return False
        detail = (parsed_json_object(answer.body) or {}).get("detail")
        return isinstance(detail, str) and STILL_RUNNING in detail.lower()

    def media_urls(self, result: Any) -> list[str]:
        """The files of a model's output: every http(s) URL under a `url`-like key (fal's
        File objects: `{"video": {"url": ...}}`, `{"images": [{"url": ...}]}`), in order,
        without repeats."""
        return _media_urls(result) if isinstance(result, dict) else []

    def model_problem(self, model: str) -> str | None:
        """Why `--model` cannot name a fal endpoint (one line); None when it can."""
        return model_problem(model)

    def match_created(self, entry: Any, payload: dict[str, Any], model: str | None) -> Match:
        """See `match_created`."""
        return match_created(entry, payload, model)


RULES = FalRules()
