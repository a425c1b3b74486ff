"""What Luma's Dream Machine answers mean: its generation states, its error body, the create
answer's id, where a completed generation lists its video, which `--model` and request bodies
it takes, and whether a generation in its list is the one an unanswered create started. Pure;
no I/O.

Facts (Luma's API reference, docs.lumalabs.ai, and its OpenAPI description as the generated
SDKs carry it; lumaai 1.21's `types/generation.py`, `types/generation_create_params.py` and
`types/generation_list_response.py`; PROVIDERS.md (project notes) section 6 and its
2026-12-06 "Updates"):

- a generation's `state` is `queued`, `dreaming`, `completed` or `failed` (with
  `failure_reason`); Luma sends no progress and no poll hint;
- errors are `{"detail": "..."}` (the OpenAPI `Error` object: "Invalid API key is provided");
  its framework's validation errors (HTTP 422) are `{"detail": [{"loc", "msg", "type"}]}`;
- a create answers the Generation object (HTTP 201), `id` a UUID;
- `assets` holds `video` (also `image` and `progress_video`, a preview: never downloaded);
- every generation echoes its create's body as `request` (the model, the prompt, ...,
  `callback_url`), and carries `model` and `created_at`: what an unanswered create is matched
  by in `GET /generations` (newest first);
- a generation carries no cost figure; a failed one is not charged: "you won't be charged for
  failed generations ... If the generation fails, we fully refund the amount to your credit
  balance" (docs.lumalabs.ai/docs/faq, "What if my generation fails").
"""

from __future__ import annotations

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
from vidpoll.providers.echo import Match, fields_verdict

COMPLETED = "completed"
FAILED = "failed"
WORDS: Mapping[str, NeutralOutcome] = {COMPLETED: "succeeded", FAILED: "failed"}
"""Every terminal state and its neutral outcome (Luma has no cancel: DELETE removes)."""
IN_PROGRESS_STATES = frozenset({"queued", "dreaming"})
"""The states of a generation that has not ended; any other word keeps it polled, logged."""
DETAIL_CODE = "detail"
"""The code of Luma's error body, which names none of its own (`{"detail": "..."}`)."""
VALIDATION_CODE = "validation_error"
MAX_CODE_TEXT = 200
MODEL_FIELD = "model"
CALLBACK_FIELD = "callback_url"
"""Set by the client from the account's `webhook_url` when it names one: never evidence."""
NOT_COMPARED = frozenset({MODEL_FIELD, CALLBACK_FIELD})
"""Fields of a request body that `match_created` does not compare with the echo: the model is
compared as the create's model, and the callback URL may be the account's, not the body's."""


_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A model id as Luma writes them (`ray-2`, `ray-flash-2`): one word of letters, digits, `.`,
`_` and `-`, starting with a letter or a digit. Not a list of known ids: Luma adds and retires
models (lumaai 1.21 dropped `ray-1-6`)."""


def model_problem(model: str) -> str | None:
    """Why `model` cannot be a Luma model id, in one line; None when it can."""
    if _MODEL.fullmatch(model):
        return None
    return (f"--model {model[:100]!r} is not a Luma model id (one word of letters, digits, "
            f"'.', '_' and '-', starting with a letter or a digit, like ray-2 or ray-flash-2)")


def payload_problem(payload: Any, model: str | None) -> str | None:
    """Why `payload` cannot be sent as a Luma create's body for `model`, in one line (never its
    values); None when it can. The body must be a JSON object; its own `model`, if it has
    one, must be `model` (the create sends `--model` as the body's `model`: a body naming
    another would be rewritten silently)."""
    if not isinstance(payload, dict):
        return "is not a JSON object (Luma's create takes an object such as {\"prompt\": ...})"
    if MODEL_FIELD not in payload:
        return None
    named = payload[MODEL_FIELD]
    if not isinstance(named, str):
        return "its 'model' is not a string; leave it out (--model names the model)"
    if model is not None and named != model:
        return ("its 'model' names another model than --model; leave it out or make them "
                "the same (--model is what the create sends)")
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _validation_item(item: Any) -> bool:
    return isinstance(item, dict) and (isinstance(item.get("msg"), str)
                                       or isinstance(item.get("type"), str))


def problem(body: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(code, message) of Luma's error body; (None, None) for any other body.

    `{"detail": "text"}` gives (`detail`, the text); `{"detail": [{"loc", "msg", "type"},
    ...]}` (a validation error) gives (the first item's `type`, its `msg`)."""
    if not isinstance(body, dict):
        return None, None
    detail = body.get("detail")
    code: str | None = None
    message: str | None = None
    if _text(detail) is not None:
        code, message = DETAIL_CODE, str(detail)
    elif isinstance(detail, list) and detail and all(_validation_item(i) for i in detail):
        first = detail[0]
        code = _text(first.get("type")) or VALIDATION_CODE
        message = _text(first.get("msg"))
        if message is not None and len(detail) > 1:
            message = f"{message} (and {len(detail) - 1} more)"
    if code is None:
        return None, None
    return code[:MAX_CODE_TEXT], message[:MAX_ERROR_TEXT] if message is not None else None


def entry_model(entry: Mapping[str, Any]) -> str | None:
    """The model a listed generation says it ran: its `model`, else its echoed request's."""
    found = entry.get(MODEL_FIELD)
    if isinstance(found, str):
        return found
    request = entry.get("request")
    found = request.get(MODEL_FIELD) if isinstance(request, dict) else None
    return found if isinstance(found, str) else None


def match_created(entry: Any, payload: dict[str, Any], model: str | None) -> Match:
    """Whether `entry` (one generation of `GET /generations`) is a create of `payload` for
    `model`.

    `other`: another model, or a field of `payload` echoed in its `request` with another
    value (compared as JSON: 1 == 1.0, true is not 1); also every entry for a model this
    client never sends (none, or not a model id: `create_video` refuses it unsent).
    `unsure`: the model matches (or the entry does not say it) but the request cannot prove
    it: not echoed (missing, not an object), a field of `payload` missing from it, or a field
    holding a `data:` URI echoed differently (Luma may keep an upload as a URL of its own).
    `same`: the model matches and every field of `payload` is echoed with an equal value;
    fields Luma added (its defaults, `generation_type`) do not count, nor `callback_url`
    (the account's webhook URL replaces the body's) nor the body's own `model` (the create
    sends `--model` there)."""
    if not isinstance(entry, dict) or model is None or model_problem(model) is not None:
        return "other"
    seen_model = entry_model(entry)
    if seen_model is not None and seen_model != model:
        return "other"
    echoed = entry.get("request")
    if not isinstance(echoed, dict):
        return "unsure"
    return fields_verdict(payload, echoed, seen_model is not None, NOT_COMPARED)


class LumaRules:
    """Luma's answers (`vidpoll.providers.base.Rules`)."""

    result_source = ResultSource.INLINE
    """A completed generation's status answer holds its `assets`: no result call."""
    idempotency_header = None
    """Luma documents none: an unanswered create is looked up in the account's generations
    (`LumaClient.list_created`), never sent again blindly."""
    takes_model = True
    """`submit --model ray-2`: sent as the body's `model`."""
    min_poll_s = 0.0
    """Luma documents no floor: the worker's own (VIDPOLL_MIN_POLL_S) applies."""
    rate_limit_headers = ("", "")
    """Luma documents no rate-limit headers."""
    words = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        """A generation's `state`: `queued`/`dreaming` pending (Luma sends no hint),
        `completed` succeeded, `failed` failed with its `failure_reason`."""
        word = _text(body.get("state"))
        if word is None:
            return Unreadable("no 'state' word")
        word = word.strip().lower()
        if word == COMPLETED:
            return Terminal(COMPLETED, "succeeded")
        if word == FAILED:
            reason = _text(body.get("failure_reason"))
            return Terminal(FAILED, "failed", reason[:MAX_ERROR_TEXT] if reason else None)
        return Pending(word, None, known=word in IN_PROGRESS_STATES)

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        return problem(body)

    def cost(self, body: dict[str, Any], outcome: NeutralOutcome) -> Cost | None:
        """Nothing for a `failed` generation (Luma refunds it in full); None otherwise:
        a generation carries no cost figure."""
        word = _text(body.get("state"))
        if word is not None and word.strip().lower() == FAILED:
            return Cost(Decimal(0), CURRENCY)
        return None

    def duration_key(self, payload: dict[str, Any], model: str | None) -> str | None:
        """The body's `duration` (`"5s"`, `"9s"`: `5s`) and `resolution` (`540p`, `720p`,
        `1080p`, `4k`), as lumaai's `types/generations/video_create_params.py` and the
        echoed `request` of `types/generation.py` write them; None when the body names
        neither (Luma's defaults apply)."""
        return rt.key(rt.seconds(rt.dig(payload, "duration")),
                      rt.word(rt.dig(payload, "resolution")))

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """The generation's `id` in a create answer (or a listed generation)."""
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
        """The generation's video, `assets.video` (an http(s) URL), or nothing; never its
        `progress_video` (a preview) nor an `image`."""
        assets = result.get("assets") if isinstance(result, dict) else None
        video = assets.get("video") if isinstance(assets, dict) else None
        if isinstance(video, str) and video[:8].lower().startswith(("http://", "https://")):
            return [video]
        return []

    def model_problem(self, model: str) -> str | None:
        """Why `--model` cannot name a Luma model (one line); None when it can."""
        return model_problem(model)

    def payload_problem(self, payload: Any, model: str | None) -> str | None:
        """Why this body cannot be sent for `model` (one line); None when it can."""
        return payload_problem(payload, model)

    def match_created(self, entry: Any, payload: dict[str, Any], model: str | None) -> Match:
        """See `match_created`."""
        return match_created(entry, payload, model)


RULES = LumaRules()
