"""What Kling's answers mean: its envelope and the HTTP status each of its codes pairs with,
its task words, the create answer's task id, where a finished task lists its videos, which
`--model` (the create's path word) it takes, the `external_task_id` vidpoll sends for an
intent's key, and the JWT every request carries. Pure; no I/O.

Facts (Kling's API reference, kling.ai/document-api: "General Information" (domain, API
authentication, error codes), "Text to Video" / "Image to Video" (create and query),
"Callback Protocol"; PROVIDERS.md section 7 and its 2026-12-06 "Updates"):

- every answer is the envelope `{"code", "message", "request_id", "data"}`; `code` 0 is
  success, any other code an error, and the docs pair each code with an HTTP status (1000-1004
  → 401, 1100-1102 → 429, 1103 → 403, 1200/1201 → 400, 1202/1203 → 404, 1300/1301 → 400,
  1302-1304 → 429, 5000 → 500, 5001 → 503, 5002 → 504; `CODE_STATUS`);
- a create (`POST /v1/videos/{text2video|image2video|...}`) answers `data.task_id`,
  `data.task_status` and `data.task_info.external_task_id`; a query (`GET
  /v1/videos/{endpoint}/{id}`) answers the task: `task_status` `submitted`, `processing`,
  `succeed` or `failed` (`task_status_msg` says why), `task_result.videos[].url` ("cleared
  after 30 days");
- `external_task_id`: "Customized Task ID. Users can provide a customized task ID, which will
  not overwrite the system-generated task ID but can be used for task queries. Please note that
  the customized task ID must be unique within a single user account." No length or character
  set is documented (`external_task_id` below keeps to a conservative one);
- auth: a JWT (RFC 7519, HS256, headers `{"alg": "HS256", "typ": "JWT"}`) with `iss` = the
  access key, `exp` = now + 1800 and `nbf` = now - 5 in the docs' sample, signed with the
  secret key, sent as `Authorization: Bearer <token>`;
- no poll hint, no idempotency key (the external id is the dedup aid: an unknown create is
  looked up by it, `Client.find_created`), no documented request-rate limit;
- a queried task carries `final_unit_deduction` (a string: the resource-package units the task
  finally deducted) and, in the Callback Protocol's task object, `final_balance_deduction:
  {quota, list_price}` (what it took from the account's balance, in money whose currency the
  object does not name); no refund of a failed task is documented.
"""

from __future__ import annotations

import hashlib
import re
import warnings
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

SUCCEED = "succeed"
FAILED = "failed"
WORDS: Mapping[str, NeutralOutcome] = {SUCCEED: "succeeded", FAILED: "failed"}
"""Kling's two terminal words (its own spelling: `succeed`)."""
PENDING_WORDS = frozenset({"submitted", "processing"})
"""The words of a task that has not ended; any other word keeps it polled, logged once."""
DEFAULT_ENDPOINT = "text2video"
"""The path word a job without a handle is read under (a job tracked by hand, the core's
probe of a paused account)."""
UNIT = "unit"
"""Kling's resource-package units, a task's `final_unit_deduction` (`Provider.cost_units`)."""
_DEDUCTION = re.compile(r"\d{1,12}(?:\.\d{1,12})?")
POLL_S = 5.0
"""Kling documents no poll interval (renders take minutes): vidpoll's floor (an assumption)."""
JWT_LIFE_S = 1800
"""The token's life, as the docs' sample mints it (now + 1800 s)."""
JWT_NBF_SKEW_S = 5
"""`nbf` is this far in the past, as the docs' sample sets it (a server clock a little behind
ours still accepts the token)."""
JWT_HEADERS: Mapping[str, str] = {"alg": "HS256", "typ": "JWT"}

WRONG_ROUTE_CODE = 1202
"""Kling's "invalid method": a path no route of its API takes (a wrong URL, taken as one:
the account pauses and is probed, never a job ended `not_found`)."""

CODE_STATUS: Mapping[int, int] = {
    1000: 401, 1001: 401, 1002: 401, 1003: 401, 1004: 401,
    1100: 429, 1101: 429, 1102: 429, 1103: 403,
    1200: 400, 1201: 400, 1202: 404, 1203: 404,
    1300: 400, 1301: 400, 1302: 429, 1303: 429, 1304: 429,
    5000: 500, 5001: 503, 5002: 504,
}
"""The HTTP status Kling's "Error Code" table pairs each code with."""
UNKNOWN_CODE_STATUS = 502
"""A code the table does not list: an answer no rule can trust (a create so answered is an
unknown outcome, looked up)."""
TOKEN_CODES = frozenset({1003, 1004})
"""A token not yet valid or expired: minted again and the call sent once more."""

EXTERNAL_ID_PREFIX = "vp-"
"""The prefix of an `external_task_id` derived from a key that cannot be sent as it is."""
EXTERNAL_ID_HASH_CHARS = 40
"""Hex digits of the key's sha256 after the prefix (160 bits: no two keys meet)."""
MAX_EXTERNAL_ID = 64
_PLAIN_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
"""A key sent as its own external id: lower-case letters, digits, `-`, `_`, at most 64
characters (a UUID fits). Kling documents no limit: this one is narrow on purpose (no case to
fold, no character a path or a gateway could change)."""
_DIGITS = re.compile(r"[0-9]+")
_ENDPOINT = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
MAX_ENDPOINT = 64
MAX_CODE_TEXT = 200


def status_for_code(code: int) -> int:
    """The HTTP status Kling's docs pair `code` with (UNKNOWN_CODE_STATUS for one they do not
    list)."""
    return CODE_STATUS.get(code, UNKNOWN_CODE_STATUS)


def envelope_code(body: Any) -> int | None:
    """The `code` of Kling's envelope `{"code", "message", "request_id", "data"}` (0 is
    success); None when `body` is not one (no integer `code` beside a `message` or a
    `request_id`)."""
    if not isinstance(body, dict):
        return None
    code = body.get("code")
    if isinstance(code, str) and code.isascii() and code.isdigit() and len(code) <= 9:
        code = int(code)
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    if not ("message" in body or "request_id" in body):
        return None
    return code


def external_task_id(key: str) -> str:
    """The `external_task_id` vidpoll sends (and looks a create up by) for the intent's
    idempotency key: the key itself when it is a plain id (`_PLAIN_ID`, not all digits: Kling's
    own task ids are, and a query takes either in the same place; not starting `vp-`), else
    `vp-` and the first 40 hex digits of its sha256. Deterministic; distinct keys give distinct
    ids (a plain key never has the prefix)."""
    if (_PLAIN_ID.fullmatch(key) and not _DIGITS.fullmatch(key)
            and not key.startswith(EXTERNAL_ID_PREFIX)):
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return EXTERNAL_ID_PREFIX + digest[:EXTERNAL_ID_HASH_CHARS]


def model_problem(model: str) -> str | None:
    """Why `--model` cannot name a Kling create: the path word after `/v1/videos/`
    (`text2video`, `image2video`, `omni-video`, ...); None when it can."""
    if len(model) <= MAX_ENDPOINT and _ENDPOINT.fullmatch(model):
        return None
    return (f"--model {model[:100]!r} is not a Kling video endpoint (the path word after "
            f"/v1/videos/, like text2video or image2video: lower-case letters and digits, "
            f"words joined by '-')")


def payload_problem(payload: Any, model: str | None = None) -> str | None:
    """Why a request body cannot be sent: one that already names an `external_task_id`
    (vidpoll sets it, from the intent's key, and looks the create up by it); None."""
    if not isinstance(payload, dict):
        return "the request body is not a JSON object"
    if "external_task_id" in payload:
        return ("it sets external_task_id, which vidpoll sets itself from the intent's key "
                "(leave it out; use the key to name the intent)")
    return None


def token_claims(access_key: str, now_s: float, *, later: bool = False) -> dict[str, Any]:
    """The claims of the JWT minted at `now_s` (epoch seconds): `iss` the access key, `exp`
    JWT_LIFE_S ahead, `nbf` JWT_NBF_SKEW_S back, as the docs' sample. `later`: `nbf` one
    second later (still in the past): a token that differs from one minted in the same second
    (HS256 is deterministic: the same claims make the same token), for the one sent again
    after Kling refused its predecessor."""
    now = int(now_s)
    return {"iss": access_key, "exp": now + JWT_LIFE_S,
            "nbf": now - JWT_NBF_SKEW_S + (1 if later else 0)}


def mint_token(access_key: str, secret_key: str, now_s: float, *, later: bool = False) -> str:
    """The JWT for `Authorization: Bearer`, signed HS256 with the secret key (PyJWT).

    PyJWT warns of an HMAC key under 32 bytes: the key is the one Kling issued, not vidpoll's
    to choose, so the warning is not raised (it would fail a run with warnings as errors)."""
    import jwt  # PyJWT: loaded with the first request, not with the rules
    from jwt.warnings import InsecureKeyLengthWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyLengthWarning)
        return jwt.encode(token_claims(access_key, now_s, later=later), secret_key,
                          algorithm="HS256", headers=dict(JWT_HEADERS))


def _data(body: Any) -> dict[str, Any] | None:
    data = body.get("data") if isinstance(body, dict) else None
    return data if isinstance(data, dict) else None


def deduction(value: Any) -> Decimal | None:
    """A deduction as Kling writes it, decimal text ("1", "0.6"; a number is read as its
    text); None for anything else (a bool, a negative, an exponent, NaN, other text)."""
    text = str(value).strip() if isinstance(value, str | int | float) and not isinstance(
        value, bool) else ""
    return Decimal(text) if _DEDUCTION.fullmatch(text) else None


def task_failure(data: Mapping[str, Any]) -> str:
    """Why a failed task made no video: its `task_status_msg`, or a fixed line."""
    said = data.get("task_status_msg")
    if isinstance(said, str) and said.strip():
        return said.strip()[:MAX_ERROR_TEXT]
    return "the task failed (no task_status_msg)"


def videos(data: Mapping[str, Any] | None) -> list[str]:
    """`task_result.videos[].url` of a task, in order, without repeats (http(s) only)."""
    result = data.get("task_result") if isinstance(data, Mapping) else None
    listed = result.get("videos") if isinstance(result, dict) else None
    found = [v.get("url") for v in listed if isinstance(v, dict)] if isinstance(
        listed, list) else []
    return list(dict.fromkeys(u for u in found if isinstance(u, str)
                              and u[:8].lower().startswith(("http://", "https://"))))


class KlingRules:
    """Kling's answers (`vidpoll.providers.base.Rules`)."""

    result_source = ResultSource.INLINE
    """The query that says `succeed` lists the videos: no result call."""
    idempotency_header = None
    """No header; the create's `external_task_id` is looked up instead (`find_created`)."""
    takes_model = True
    """`submit --model text2video`: the endpoint the create is POSTed to."""
    min_poll_s = POLL_S
    rate_limit_headers = ("", "")
    words = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        """A query's envelope: `data.task_status` submitted/processing → pending; succeed →
        succeeded; failed → failed with its `task_status_msg`; another word → pending,
        logged."""
        code = envelope_code(body)
        if code is not None and code != 0:
            return Unreadable(f"Kling code {code} in a 2xx answer")
        data = _data(body)
        if data is None:
            return Unreadable("not Kling's envelope (no 'data' object)")
        word = data.get("task_status")
        if not isinstance(word, str) or not word.strip():
            return Unreadable("no task_status")
        word = word.strip().lower()[:64]
        if word == SUCCEED:
            return Terminal(SUCCEED, "succeeded")
        if word == FAILED:
            return Terminal(FAILED, "failed", task_failure(data))
        return Pending(word, None, known=word in PENDING_WORDS)

    def cost(self, body: dict[str, Any], outcome: NeutralOutcome) -> Cost | None:
        """The units a task's `final_unit_deduction` says it took; None without one, when it
        also took money from the balance (`final_balance_deduction.quota` above 0, or not a
        number), or when it took no units and the answer does not show the balance part
        (paid from the balance, the units say 0)."""
        code, data = envelope_code(body), _data(body)
        if (code is not None and code != 0) or data is None:
            return None
        units = deduction(data.get("final_unit_deduction"))
        balance = data.get("final_balance_deduction")
        if units is None or (balance is None and units == 0):
            return None
        if balance is not None:
            quota = deduction(balance.get("quota")) if isinstance(balance, dict) else None
            if quota is None or quota > 0:
                return None
        return Cost(units, UNIT)

    def duration_key(self, payload: dict[str, Any], model: str | None) -> str | None:
        """The body's `duration` ("Video Length, unit: s", the text `"5"`, `"10"`: `5s`) and
        `mode` (`std` or `pro`: "pro ... generates videos use longer duration but higher
        quality", 1080p where std is 720p), from Kling's "Text to Video" / "Image to Video"
        create pages; None when the body names neither (Kling's defaults, 5 s std, apply)."""
        return rt.key(rt.seconds(rt.dig(payload, "duration")),
                      rt.word(rt.dig(payload, "mode")))

    def render_seconds(self, body: dict[str, Any]) -> float | None:
        """From the task's `created_at` to its `updated_at` ("Task creation time" / "Task
        update time", Unix ms: the query pages) in an answer whose `task_status` is final
        (`succeed`, `failed`): a task is updated when its status changes, and the change
        to a final status is its last, so there `updated_at` is when it ended. None for any
        other answer, or when either time is missing, unreadable, or the span negative or
        above 7 days."""
        code, data = envelope_code(body), _data(body)
        if (code is not None and code != 0) or data is None:
            return None
        word = data.get("task_status")
        if not isinstance(word, str) or word.strip().lower() not in WORDS:
            return None
        return rt.elapsed(rt.ms_instant(data.get("created_at")),
                          rt.ms_instant(data.get("updated_at")))

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        """(code, message) of Kling's envelope with a code other than 0; (None, None)
        otherwise (a 4xx without it came from something else)."""
        code = envelope_code(body)
        if code is None or code == 0 or body is None or code == WRONG_ROUTE_CODE:
            # 1202, "the requested method is invalid": no route of Kling's API answered, so
            # the URL is wrong (a base URL or endpoint off Kling's paths), not a job's end
            return None, None
        message = body.get("message")
        text = message.strip()[:MAX_ERROR_TEXT] if isinstance(message, str) and message.strip(
            ) else None
        return str(code)[:MAX_CODE_TEXT], text

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """`data.task_id` of a create's envelope with code 0 (a number is taken as its
        digits); None otherwise."""
        code = envelope_code(body)
        if code is not None and code != 0:
            return None
        value = (_data(body) or {}).get("task_id")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            return None
        try:
            return validate_job_id(value)
        except InvalidJobId:
            return None

    def created_handle(self, body: dict[str, Any] | None,
                       model: str | None = None) -> dict[str, Any] | None:
        """`{"endpoint": model}`: the path word later queries of the task go under (Kling's
        create answer does not name it)."""
        if model is None or model_problem(model) is not None:
            return None
        return {"endpoint": model}

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        return False  # inline results: no result call to be early for

    def media_urls(self, result: Any) -> list[str]:
        """`data.task_result.videos[].url`, in order, without repeats; a bare task object (a
        callback's shape) is read the same way. Nothing else: a task's `task_info` may echo an
        input image's URL, which is no result."""
        data = _data(result)
        if data is None and isinstance(result, dict) and "task_result" in result:
            data = result
        return videos(data)

    def model_problem(self, model: str) -> str | None:
        return model_problem(model)

    def payload_problem(self, payload: dict[str, Any], model: str | None = None) -> str | None:
        return payload_problem(payload, model)


RULES = KlingRules()
