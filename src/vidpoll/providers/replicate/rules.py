"""What Replicate's answers mean: its status words, its error bodies, its create answer, where
a succeeded prediction lists its files, which `--model` it takes, and whether a prediction in
its list is the one an unanswered create started. Pure; no I/O.

Facts (replicate.com/docs: the HTTP API reference, data-retention, the 2025-10-16 changelog on
prediction deadlines; the SDKs replicate-python and replicate-python-beta): a prediction's
`status` is `starting`, `processing`, `succeeded`, `failed` or `canceled`, or `aborted` (a
deadline that passed before it ran: "not charged" for public models; both official SDKs forget
the word); its `output` is the model's own JSON, files as HTTPS URLs; errors are `{"detail":
...}` or RFC 7807 problem details (`type`, `title`, `status`, `detail`, `instance`: the SDK's
ReplicateError). Inputs and outputs are removed an hour after an API prediction (`data_removed`,
`output: null`).

Cost (`cost`): an ended prediction's `metrics.predict_time`, the seconds it ran. Replicate
bills public models by the time they are "active processing your requests" (docs/billing); a
prediction `canceled` once running is billed "for the time the prediction ran", an `aborted`
one (its deadline passed before it started) is not charged (docs/topics/predictions/lifecycle,
"Billing for predictions with deadlines"). Models Replicate prices per output (most official
video models: per second of video, per video) are billed by that price, not by the time: an
account prices `predict_second` only for models billed by time.
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
    CURRENCY,
    Cost,
    NeutralOutcome,
    Pending,
    ResultSource,
    StatusView,
    Terminal,
    Unreadable,
)
from vidpoll.providers.echo import Match, holds_data_uri, json_strings
from vidpoll.providers.echo import json_equal as json_equal

ABORTED = "aborted"
"""A prediction whose deadline passed before it started: not charged (lifecycle docs)."""
PREDICT_SECOND = "predict_second"
"""The unit of `metrics.predict_time`, the seconds a prediction ran (`Provider.cost_units`)."""
WORDS: Mapping[str, NeutralOutcome] = {
    "succeeded": "succeeded",
    "failed": "failed",
    "canceled": "canceled",
    ABORTED: "canceled",  # its deadline passed before it started (changelog 2025-10-16)
}
"""Every terminal word and its neutral outcome."""
IN_PROGRESS_STATUSES = frozenset({"starting", "processing"})
"""The words of a prediction that has not ended; any other word keeps it polled, logged."""
DETAIL_CODE = "detail"
"""The code of an error body that is only `{"detail": ...}` (it names no code of its own)."""
MAX_CODE_TEXT = 200
WEB_SOURCE = "web"
"""`source` of a prediction made on Replicate's website: never one of vidpoll's creates."""
HIDDEN_VERSION = "hidden"
"""The `version` Replicate shows for an official model whose versions it does not publish:
it says nothing about the version the create named."""


_PART = r"[a-z0-9][a-z0-9._-]{0,99}"
_MODEL = re.compile(rf"(?P<model>{_PART}/{_PART})(?::(?P<version>[A-Za-z0-9]{{1,128}}))?")
"""`owner/name` or `owner/name:VERSION`; each part starts with a letter or a digit (never
`.` or `..`, which a server could read as a directory in /v1/models/{owner}/{name})."""


def split_model(model: str) -> tuple[str, str | None] | None:
    """(`owner/name`, VERSION or None) of a `--model`; None when it is neither form."""
    found = _MODEL.fullmatch(model)
    return None if found is None else (found["model"], found["version"])


def model_problem(model: str) -> str | None:
    """Why `model` cannot be a Replicate create's model, in one line; None when it can."""
    if split_model(model) is not None:
        return None
    return (f"--model {model[:100]!r} is not owner/name or owner/name:VERSION (owner and name: "
            f"lower-case letters, digits, '-', '_' and '.', each starting with a letter or a "
            f"digit; VERSION: letters and digits, such as a 64-character hex id)")


def problem(body: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(code, message) of Replicate's error body: `{"detail": ...}` gives (`detail`, its
    text); problem details give (`title`, `detail`). (None, None) for any other body."""
    if not isinstance(body, dict):
        return None, None
    title, detail = _text(body.get("title")), _text(body.get("detail"))
    if title is not None and detail is None and not (
            isinstance(body.get("status"), int) or isinstance(body.get("type"), str)):
        title = None  # a bare `title` is any JSON's, not a problem's
    if title is None and detail is None:
        return None, None
    return ((title or DETAIL_CODE)[:MAX_CODE_TEXT],
            detail[:MAX_ERROR_TEXT] if detail is not None else None)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


_strings = json_strings
_holds_data_uri = holds_data_uri


def match_created(entry: Any, payload: dict[str, Any], model: str | None) -> Match:
    """Whether `entry` (one prediction of the list endpoint) is a create of `payload` for
    `model` (`owner/name` or `owner/name:VERSION`).

    `other`: made on the website, or of another model or version, or an input field of
    `payload` echoed with another value (compared as JSON); also every entry for a model this
    client never sends (none, or not a Replicate model: `create_video` refuses it unsent).
    `unsure`: the model matches (or the entry does not say it) but the input cannot prove it:
    removed (`data_removed`), not echoed, a field of `payload` missing from it, or a field
    holding a `data:` URI (Replicate may have stored the upload as a URL of its own).
    `same`: the model and version match and every field of `payload` is echoed with an equal
    value (fields Replicate added, a model's defaults, do not count)."""
    if not isinstance(entry, dict) or entry.get("source") == WEB_SOURCE:
        return "other"
    intent = split_model(model) if model is not None else None
    if intent is None:
        return "other"
    owner_name, version = intent
    model_shown = True
    seen_model = entry.get("model")
    if isinstance(seen_model, str):
        if seen_model != owner_name:
            return "other"
    elif version is None:
        model_shown = False  # `owner/name`: the entry's model is the only proof
    if version is not None:
        seen_version = entry.get("version")
        if isinstance(seen_version, str) and seen_version != HIDDEN_VERSION:
            if seen_version != version:
                return "other"
        else:
            model_shown = False
    if entry.get("data_removed") is True:
        return "unsure"
    echoed = entry.get("input")
    if not isinstance(echoed, dict):
        return "unsure"
    verdict: Match = "same" if model_shown else "unsure"
    for field, value in payload.items():
        if field not in echoed or _holds_data_uri(value):
            verdict = "unsure"
        elif not json_equal(value, echoed[field]):
            return "other"
    return verdict


class ReplicateRules:
    """Replicate's answers (`vidpoll.providers.base.Rules`)."""

    result_source = ResultSource.INLINE
    """A succeeded prediction's status answer holds its `output`: no result call."""
    idempotency_header = None
    """Replicate documents none: an unanswered create is looked up in its list
    (`ReplicateClient.list_created`), never sent again blindly."""
    takes_model = True
    """`submit --model owner/name` (an official model) or `owner/name:VERSION`."""
    min_poll_s = 0.0
    """Replicate documents no floor: the worker's own (VIDPOLL_MIN_POLL_S) applies."""
    rate_limit_headers = ("", "")
    """Replicate documents no rate-limit headers (its rate-limits page gives a 429 and a
    `detail` that says when the limit resets, which the client reads as the Retry-After)."""
    words = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        """A prediction's `status`: a terminal word ends it; Replicate sends no poll hint."""
        word = _text(body.get("status"))
        if word is None:
            return Unreadable("no 'status' word")
        word = word.strip().lower()
        if word in WORDS:
            return Terminal(word, WORDS[word])
        return Pending(word, None, known=word in IN_PROGRESS_STATUSES)

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        return problem(body)

    def cost(self, body: dict[str, Any], outcome: NeutralOutcome) -> Cost | None:
        """An `aborted` prediction costs nothing (it never ran); any other ended one the
        seconds of its `metrics.predict_time`; None without one (a prediction canceled
        before it started says nothing)."""
        word = _text(body.get("status"))
        if word is not None and word.strip().lower() == ABORTED:
            return Cost(Decimal(0), CURRENCY)
        metrics = body.get("metrics")
        seconds = metrics.get("predict_time") if isinstance(metrics, dict) else None
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or not math.isfinite(seconds) or seconds < 0):
            return None
        return Cost(Decimal(str(seconds)).copy_abs(), PREDICT_SECOND)

    def duration_key(self, payload: dict[str, Any], model: str | None) -> str | None:
        """The clip length of the input (the body is the prediction's `input`): its
        `duration` (`5s`), else its `num_frames` (`121f`), each only when the input holds it
        as a JSON number. A Replicate model takes whatever input its own schema says, so no
        other field is read, and a value in any other form (text, an object) gives no key:
        a field of that name may mean something else to that model."""
        return rt.key(rt.seconds(rt.dig(payload, "duration"), text=False)
                      or rt.frames(rt.dig(payload, "num_frames")))

    def render_seconds(self, body: dict[str, Any]) -> float | None:
        """From `created_at` to `completed_at` of an ended prediction (ISO 8601, UTC, with
        fractions: replicate.com/docs/topics/predictions, the prediction object), the span
        vidpoll's schedule counts too (from the create; `started_at`, when it began to run,
        would leave out its wait in the queue); None without both, or when unreadable,
        negative or above 7 days."""
        return rt.elapsed(rt.iso_instant(rt.dig(body, "created_at")),
                          rt.iso_instant(rt.dig(body, "completed_at")))

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """The prediction's `id` in a create answer (or a webhook's prediction)."""
        value = body.get("id") if isinstance(body, dict) else None
        if not isinstance(value, str):
            return None
        try:
            return validate_job_id(value)
        except InvalidJobId:
            return None

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        return False  # inline results: there is no result call to be early for

    def media_urls(self, result: Any) -> list[str]:
        """Every http(s) URL string in a prediction's `output` (a URL, a list of them, or
        the model's own JSON holding them), in order, without repeats; none once Replicate
        removed the output (`output: null`)."""
        if not isinstance(result, dict):
            return []
        found: dict[str, None] = {}  # ordered, and no repeat costs a scan
        for text in _strings(result.get("output")):
            if text[:8].lower().startswith(("http://", "https://")):
                found.setdefault(text)
        return list(found)

    def result_problem(self, result: Any) -> str | None:
        """Why a succeeded prediction's files can never be downloaded: Replicate removed its
        data (inputs, outputs and logs go an hour after a prediction ends: `data_removed`,
        `output: null`); None otherwise."""
        if not isinstance(result, dict):
            return None
        if result.get("data_removed") is True or ("output" in result
                                                  and result["output"] is None):
            return ("Replicate removed this prediction's data (data_removed: its output is "
                    "deleted an hour after it ends, sooner on short-retention accounts): "
                    "nothing left to download")
        return None

    def model_problem(self, model: str) -> str | None:
        """Why `--model` cannot name a Replicate model (one line); None when it can."""
        return model_problem(model)

    def match_created(self, entry: Any, payload: dict[str, Any], model: str | None) -> Match:
        """See `match_created`."""
        return match_created(entry, payload, model)


RULES = ReplicateRules()
