"""What Runway's API answers mean: a task's status words and what they carry, Runway's error
envelope, the create answer's id, which `--model` (endpoint) it takes, where a succeeded task
lists its outputs. Pure; no I/O.

Facts (runwayml 5.24's `types/task_retrieve_response.py`, `resources/tasks.py`,
`_client.py`, `lib/polling.py`; docs.dev.runwayml.com/api-details/errors and /usage/tiers;
PROVIDERS.md section 3 and its 2026-12-06 "Updates"):
- a create is `POST /v1/{endpoint}` (`image_to_video`, `text_to_video`, `video_to_video`,
  `video_upscale`, `character_performance`, `generate/video`, ...) with a body that names
  Runway's own `model`; it answers `{"id", "estimatedCost"?}`: the id is the only handle;
- a task is read with `GET /v1/tasks/{id}`; its `status` is `PENDING`, `THROTTLED` (over the
  organisation's concurrency limit for that model: stored, queued in about submission order),
  `RUNNING` (with `progress`, 0 to 1), `SUCCEEDED` (`output`: a list of URLs), `FAILED`
  (`failure`, a human-friendly reason, and `failureCode`) or `CANCELLED` ("a cancelled or
  deleted task");
- the output URLs are CloudFront URLs signed with a `_jwt` query; they "will expire within
  24-48 hours; fetch the task again to get fresh URLs" (the client's `fresh_media`);
- "Consumers of this API should not expect updates more frequent than once every five seconds
  for a given task" (`min_poll_s`); no header hint;
- errors are `{"error": "<human-readable explanation>"}`, with `docUrl` (a bad
  `X-Runway-Version`) or `issues` (a body that failed validation, [A]: the shape of its items
  is not documented) beside it; an unknown task answers 404 `{"error": "Could not find
  Task"}`: Runway's own "no such job", never a wrong URL;
- no idempotency key, and no task list: a create whose outcome is unknown cannot be looked up,
  and is parked for an operator (or, by the account's choice, sent again);
- a 429 on create is the daily generation cap ("No maximum requests-per-minute limit");
- an ended task (SUCCEEDED, FAILED, CANCELLED) carries `cost: {"credits": int}`, "Final cost
  in credits for a terminal task. A refunded task reports 0" (runwayml's OpenAPI types on the
  SDK's `next` branch, 827e092, 2026-08-07, `types/task_retrieve_response.py`; tasks still
  running carry `estimatedCost` instead); PROVIDERS.md "Updates".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from vidpoll.errors import InvalidJobId
from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT, validate_job_id
from vidpoll.providers import render_time as rt
from vidpoll.providers.base import (
    Cost,
    NeutralOutcome,
    Pending,
    ResultSource,
    StatusView,
    Terminal,
    Unreadable,
)

SUCCEEDED_WORD, FAILED_WORD, CANCELLED_WORD = "succeeded", "failed", "cancelled"
WORDS: Mapping[str, NeutralOutcome] = {SUCCEEDED_WORD: "succeeded", FAILED_WORD: "failed",
                                       CANCELLED_WORD: "canceled"}
"""Every terminal word (lower-cased, as kept in `state`) and its outcome."""
PENDING_WORDS = frozenset({"pending", "throttled", "running"})
"""The words of a task that has not ended; any other word keeps it polled, logged once."""
THROTTLED_DETAIL = "waiting for capacity"
"""What a THROTTLED task is doing: queued behind the organisation's concurrency limit."""
DOCS_POLL_S = 5.0
"""Runway: no updates more often than once every five seconds for a task."""
CREDIT = "credit"
"""The unit of an ended task's `cost.credits` (`Provider.cost_units`)."""
ERROR_CODE = "error"
"""The code of Runway's envelope, which names none of its own (`{"error": "..."}`)."""
MAX_CODE_TEXT = 200
MAX_ISSUES_SHOWN = 3
ENDPOINTS = ("image_to_video", "text_to_video", "video_to_video", "video_upscale",
             "character_performance", "generate/video")
"""Runway's video creates (runwayml 5.24's `api.md`): `--model` names one of them; another
path of the same shape is sent as named (Runway adds endpoints often)."""
_ENDPOINT = re.compile(r"[a-z0-9_]{1,64}(?:/[a-z0-9_]{1,64})?")
_NOT_CREATES = frozenset({"tasks", "organization", "uploads"})
"""First path words under /v1/ that are no create of a render."""


def model_problem(model: str) -> str | None:
    """Why `model` cannot name a Runway create endpoint (the path under `/v1/`), in one line;
    None when it can."""
    if _ENDPOINT.fullmatch(model) and model.split("/")[0] not in _NOT_CREATES:
        return None
    return (f"--model {model[:100]!r} is not a Runway create endpoint: the path under /v1/, "
            f"one or two lower-case words of letters, digits and '_' ({', '.join(ENDPOINTS)}); "
            f"Runway's own model goes in the request body's \"model\"")


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _issue(item: Any) -> str | None:
    """One validation issue as `path: message` (`path` joined with `.`)."""
    if not isinstance(item, dict):
        return _text(item)
    message = _text(item.get("message")) or _text(item.get("code"))
    path = item.get("path")
    where = ".".join(str(p) for p in path if isinstance(p, str | int)) if isinstance(
        path, list) else _text(path)
    if message is None:
        return None
    return f"{where}: {message}" if where else message


def runway_error(body: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(code, message) of Runway's envelope `{"error": "text", "docUrl"?, "issues"?}`: the
    code `error` (Runway names none) and the text, with the first validation issues after it;
    (None, None) for any other body."""
    if not isinstance(body, dict):
        return None, None
    text = _text(body.get("error"))
    if text is None:
        return None, None
    issues = body.get("issues")
    if isinstance(issues, list) and issues:
        shown = [s for s in (_issue(i) for i in issues[:MAX_ISSUES_SHOWN]) if s]
        if shown:
            more = len(issues) - MAX_ISSUES_SHOWN
            text = f"{text} ({'; '.join(shown)}{f'; and {more} more' if more > 0 else ''})"
    return ERROR_CODE, text[:MAX_ERROR_TEXT]


def failure(body: dict[str, Any]) -> str | None:
    """Why a FAILED task failed, in one line: `failureCode: failure`, or either alone."""
    code, reason = _text(body.get("failureCode")), _text(body.get("failure"))
    said = ": ".join(p for p in (code, reason) if p)
    return said[:MAX_ERROR_TEXT] if said else None


def progress_detail(value: Any) -> str | None:
    """A RUNNING task's `progress` (0 to 1) as `progress 40%`; None when it is not one."""
    if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
            or not 0 <= value <= 1):
        return None
    return f"progress {round(value * 100)}%"


def outputs(result: Any) -> list[str]:
    """A task's `output` URLs (http or https), in order, without repeats."""
    listed = result.get("output") if isinstance(result, dict) else None
    found: list[str] = []
    for url in listed if isinstance(listed, list) else ():
        if (isinstance(url, str) and url[:8].lower().startswith(("http://", "https://"))
                and url not in found):
            found.append(url)
    return found


class RunwayRules:
    """Runway's answers (`vidpoll.providers.base.Rules`)."""

    result_source = ResultSource.INLINE
    """A SUCCEEDED task lists its `output`: no result call."""
    idempotency_header = None
    """Runway documents none (its SDK sets `_idempotency_header = None`), and has no task
    list to look a create up in: an unknown create is parked for an operator (or, with the
    account's `on_unknown_create = "resend"`, sent again)."""
    takes_model = True
    """`submit --model` names the create endpoint (`image_to_video`, `generate/video`, ...);
    Runway's own model id stays in the request body."""
    min_poll_s = DOCS_POLL_S
    rate_limit_headers = ("", "")
    """Runway sends none (its limits are concurrency, queued as THROTTLED, and a daily cap)."""
    words = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        """A task's `status`: PENDING, THROTTLED (shown `throttled (waiting for capacity)`)
        and RUNNING (`running (progress 40%)`) pending, without a hint; SUCCEEDED, FAILED
        (with `failureCode: failure`) and CANCELLED terminal; any other word pending, logged
        as unknown."""
        raw = _text(body.get("status"))
        if raw is None:
            return Unreadable("no 'status' word")
        word = raw.lower()
        if word == SUCCEEDED_WORD:
            return Terminal(SUCCEEDED_WORD, "succeeded")
        if word == FAILED_WORD:
            return Terminal(FAILED_WORD, "failed", failure(body))
        if word == CANCELLED_WORD:
            return Terminal(CANCELLED_WORD, "canceled", "cancelled or deleted")
        detail = (THROTTLED_DETAIL if word == "throttled"
                  else progress_detail(body.get("progress")) if word == "running" else None)
        return Pending(word[:64], None, known=word in PENDING_WORDS, detail=detail)

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        return runway_error(body)

    def cost(self, body: dict[str, Any], outcome: NeutralOutcome) -> Cost | None:
        """An ended task's `cost.credits` (a whole number; 0 when Runway refunded it); None
        without one."""
        spent = body.get("cost")
        credits = spent.get("credits") if isinstance(spent, dict) else None
        if isinstance(credits, bool) or not isinstance(credits, int) or credits < 0:
            return None
        return Cost(Decimal(credits), CREDIT)

    def duration_key(self, payload: dict[str, Any], model: str | None) -> str | None:
        """The body's `duration` (whole seconds: `5s`) and its output size: `resolution`
        (`720p`, `4k`), else a `ratio` written as a size (`1280:720`, "The resolution of the
        output video"; an aspect ratio like `16:9` is left out); under `input` for
        `generate/video` (runwayml's `types/*_create_params.py`, `types/generate/
        video_create_params.py`); None when the body names none of them."""
        nested = rt.dig(payload, "input")
        holder = nested if isinstance(nested, dict) else payload
        return rt.key(rt.seconds(rt.dig(holder, "duration")),
                      rt.word(rt.dig(holder, "resolution")) or rt.size(rt.dig(holder, "ratio")))

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """The task `id` of a create answer."""
        value = body.get("id") if isinstance(body, dict) else None
        if not isinstance(value, str) or not value.strip():
            return None
        try:
            return validate_job_id(value)
        except InvalidJobId:
            return None

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        return False  # inline results: there is no result call to be early for

    def media_urls(self, result: Any) -> list[str]:
        """A succeeded task's `output` URLs, in order (stored without their signature: the
        downloader gets them signed from `RunwayClient.fresh_media`)."""
        return outputs(result)

    def model_problem(self, model: str) -> str | None:
        """Why `--model` cannot name a Runway create endpoint (one line); None when it can."""
        return model_problem(model)


RULES = RunwayRules()
