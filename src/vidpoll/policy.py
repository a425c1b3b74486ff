"""Pure decisions: turn one status read into the row's next state and due time.

Nothing here does I/O or reads the clock; `now` and the random source are passed in,
so every rule is tested without a database, a socket or a sleep.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from email.utils import parsedate_to_datetime
from typing import Any

from vidpoll.errors import InvalidIntent, InvalidJobId
from vidpoll.models import (
    GAVE_UP,
    NOT_FOUND,
    PENDING,
    QUEUED,
    RECONCILING,
    REJECTED,
    SUBMITTED,
    SUCCEEDED,
    UNKNOWN,
    UNKNOWN_RESEND_MAX_S,
    ClaimedIntent,
    ClaimedJob,
    ClaimedResult,
    ErrorClass,
    HttpAnswer,
    Outcome,
    ResultOutcome,
    SubmitOutcome,
)
from vidpoll.providers.base import ResultSource, Rules, Terminal, Unreadable
from vidpoll.schedule import Plan

DEFAULT_POLL_INTERVAL_S = 15.0
MAX_JOB_ID_LEN = 1024
"""Bytes of a job id in UTF-8 (its percent-encoded URL then fits any server's request line)."""
MAX_KEY_LEN = 255
MAX_ERROR_TEXT = 500


@dataclass(frozen=True, slots=True)
class PollPolicy:
    """Every knob of the polling rules, with the documented defaults."""

    default_poll_s: float = DEFAULT_POLL_INTERVAL_S
    min_poll_s: float = 1.0
    max_poll_s: float = 3600.0
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    not_found_max_tries: int = 8
    not_found_max_age_s: float = 3600.0
    not_found_min_tries_when_old: int = 3
    max_age_s: float = 48 * 3600.0
    auth_backoff_max_s: float = 300.0
    unknown_resend_s: float = 60.0
    """How often an `unknown` intent is sent again (never less often than every 2 minutes)."""
    reconcile_settle_s: float = 10.0
    """After a create without an idempotency key whose outcome is unknown, how long before the
    provider's records are looked up: a server still working on a request its client gave up on
    (and a list that lags its creates) must have caught up before "not found" may prove that
    nothing was created (VIDPOLL_RECONCILE_SETTLE_S)."""
    reconcile_deadline_s: float = 600.0
    """How long look-ups that cannot complete (the list failing, throttled) are retried, from
    the create's window, before the intent is parked as `unknown` for an operator
    (VIDPOLL_RECONCILE_DEADLINE_S)."""
    reconcile_skew_s: float = 120.0
    """The look-up window reaches this far before the create was sent and after now: the
    provider's clock is not the database's."""


@dataclass(frozen=True, slots=True)
class AuthPause:
    """A 401/403: stop all polling for `delay_s`, leave the row untouched."""

    delay_s: float
    http_status: int
    detail: str


@dataclass(frozen=True, slots=True)
class Misrouted(AuthPause):
    """A status read answered by something other than the provider: a 4xx without its error
    envelope (a wrong base URL's path, a proxy's or a framework's error page). A setting is
    wrong, not the job: the account pauses as for a refused key (the row untouched, never
    counted toward not_found) until a probe reaches the provider again.

    `row_outcome` is what the row gets instead when the provider is known to answer the
    account's other reads (a proxy that refuses this one row's URL): an error with backoff,
    never `not_found`.
    """

    row_outcome: Outcome


@dataclass(frozen=True, slots=True)
class MisroutedCreate(AuthPause):
    """A create POST answered by something other than the provider: a 4xx without its error envelope
    (a wrong base URL's path, a proxy's or a framework's error page), other than the "not
    now" ones (RETRYABLE_CREATE_4XX). The submitter pauses the account's submissions as for
    a refused key (the intent given back untouched, its attempt not counted, no unknown
    outcome recorded) and probes with a status read, never a POST, until the provider answers.

    Why the attempt counts as not sent (not as an unknown outcome): the provider answers every
    request it handles in its envelope, and a proxy that forwards a request passes the provider's
    answer on, so an answer without it was made before the request reached the provider's create;
    the same rule already holds for a refused key. The intent is still sent again under the
    same Idempotency-Key only, so if a proxy did forward it against all odds, the
    provider's answer to
    the re-send is the job it started (docs/SUBMITTING.md).
    """


def validate_job_id(job_id: str) -> str:
    """Return `job_id` unchanged if PostgreSQL can store it and a URL carry it; else raise
    InvalidJobId (empty, NUL, lone surrogate, over 1024 bytes in UTF-8).

    Any other character is fine: ids are stored as given and percent-encoded on the wire.
    """
    if not isinstance(job_id, str) or not job_id:
        raise InvalidJobId("job id must be a non-empty string")
    if "\x00" in job_id:
        raise InvalidJobId("job id contains a NUL byte, which PostgreSQL text cannot hold")
    try:
        size = len(job_id.encode("utf-8"))
    except UnicodeEncodeError:
        # a lone surrogate (U+D800-U+DFFF): psycopg could not send it, nor a URL carry it
        raise InvalidJobId("job id contains a lone surrogate (U+D800-U+DFFF), which UTF-8 "
                           "cannot encode") from None
    if size > MAX_JOB_ID_LEN:
        # bytes, not characters: percent-encoded, 1024 characters of CJK text are a 9 KB path,
        # past the 8 KB request line aiohttp, nginx and most servers accept (the read would
        # fail with 400/414 until the row gave up); 1024 bytes encode to at most 3 KB
        raise InvalidJobId(f"job id is {size} bytes in UTF-8; the limit is {MAX_JOB_ID_LEN}")
    return job_id


ACCOUNT_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,62}$")


def validate_account(name: str) -> str:
    """Return an account name if it is lower-case letters, digits and '_' (1-63); else raise.

    The name becomes part of an environment variable (SUME_API_KEY_<NAME>), hence the rule.
    """
    if not isinstance(name, str) or not ACCOUNT_NAME.match(name):
        raise InvalidIntent(f"account name {name!r} must be 1-63 lower-case letters, digits "
                            "or '_', starting with a letter or digit")
    return name


def validate_key(key: str) -> str:
    """Return an idempotency key unchanged if it can travel as an HTTP header; else raise.

    Visible ASCII only (no spaces, no control characters: a CR/LF would split the header),
    1 to 255 characters, the limit most providers document for this header.
    """
    if not isinstance(key, str) or not key:
        raise InvalidIntent("idempotency key must be a non-empty string")
    if len(key) > MAX_KEY_LEN:
        raise InvalidIntent(f"idempotency key is {len(key)} characters; the limit is "
                            f"{MAX_KEY_LEN}")
    bad = next((c for c in key if not "\x21" <= c <= "\x7e"), None)
    if bad is not None:
        raise InvalidIntent(f"idempotency key contains {bad!r}; use visible ASCII characters "
                            "only (letters, digits, punctuation, no spaces)")
    return key


_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""json's escape of a NUL: \\u0000 after an even number of backslashes (each pair is one
escaped backslash, so an odd one would make it the literal text `\\u0000`)."""


def _has_nul(text: str) -> bool:
    """Whether JSON text written by json.dumps holds a NUL character (never unescaped)."""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None


def validate_payload(payload: Any) -> dict[str, Any]:
    """`payload` as jsonb will give it back (tuples become lists, keys strings); else raise.

    Comparing and storing this form means a re-run with the same request always matches.
    """
    if not isinstance(payload, dict):
        raise InvalidIntent(f"payload must be a JSON object, not {type(payload).__name__}")
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (TypeError, ValueError, UnicodeError, RecursionError) as exc:
        raise InvalidIntent(f"payload is not storable JSON: {exc}") from None
    if _has_nul(text):
        raise InvalidIntent("payload contains a NUL character, which jsonb cannot hold")
    normal: dict[str, Any] = json.loads(text, parse_float=_jsonb_number)
    return normal


def _jsonb_number(text: str) -> float | int:
    """A float as jsonb gives it back: numeric prints 1e+300 (how json.dumps writes a float
    from 1e16 up) as all its digits, which json reads as an int; 1e300 != 10**300 in Python,
    so without this a re-run of the same request would not match its stored payload."""
    if "e+" in text:
        return int(Decimal(text))
    return float(text)


def backoff_delay(attempt: int, policy: PollPolicy, rng: random.Random,
                  cap_s: float | None = None) -> float:
    """Exponential backoff with equal jitter; attempt 1 is the first failure.

    Equal jitter (half fixed, half random) keeps a floor under every retry, so a fleet of
    workers that failed together spreads out without any of them retrying at once.
    """
    cap = policy.backoff_max_s if cap_s is None else cap_s
    exp = min(cap, policy.backoff_base_s * 2 ** min(max(attempt, 1) - 1, 30))
    return float(max(policy.min_poll_s, exp / 2 + rng.uniform(0, exp / 2)))


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date); None if unusable."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def next_poll_delay(raw: Any, policy: PollPolicy) -> float:
    """Seconds until the next read from the provider's hint, defaulted and clamped."""
    value = hint_seconds(raw, policy)
    if value is None:
        value = policy.default_poll_s
    return min(policy.max_poll_s, max(policy.min_poll_s, value))


def hint_seconds(raw: Any, policy: PollPolicy) -> float | None:
    """The provider's hint in seconds (unclamped), or None when it gives none that can be
    read (absent, a bool, negative, not a number)."""
    value: float | None = None
    if isinstance(raw, bool):
        value = None
    elif isinstance(raw, int | float):
        try:
            value = float(raw)
        except OverflowError:  # a JSON integer too big for a float: "a very long time"
            value = policy.max_poll_s if raw > 0 else None
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return value


def _age_s(job: ClaimedJob, now: datetime) -> float:
    return (now - job.polling_since).total_seconds()


def _error_text(body: dict[str, Any] | None, answer: HttpAnswer, what: str,
                rules: Rules) -> str:
    parts = [what]
    code, message = rules.error_code(body)
    if code is not None or message is not None:
        parts.extend(p for p in (code, message) if p)
    elif answer.detail:
        parts.append(answer.detail)
    return ": ".join(parts)[:MAX_ERROR_TEXT]


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: past a double's range; no JSON writer (nor jsonb) takes it
        raise ValueError("a number past a double's range")
    return value


_BODY_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
"""One decoder for every answer (json.loads with a keyword builds a new one per call)."""


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object that PostgreSQL can store, else None.

    Python's json accepts NaN/Infinity, numbers it turns into inf (1e400), "\\u0000" and lone
    surrogates; jsonb and text refuse them, so such a body counts as malformed instead of
    failing the batch write. NaN, Infinity and inf are refused while parsing; a NUL or a lone
    surrogate can only arrive as a \\u escape (or, for a surrogate, as bytes that are no UTF-8,
    which the encode below refuses), so only a body with an escape is written out again to
    look for them (the hot path of every read: most answers have none).
    """
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")
        value = _BODY_DECODER.decode(text)
        if not isinstance(value, dict):
            return None
        text.encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate
        if "\\u" in text:
            again = json.dumps(value, ensure_ascii=False, allow_nan=False)
            again.encode("utf-8")
            if _has_nul(again):
                return None
    except (ValueError, UnicodeError, RecursionError):
        return None
    return value


def _request_id(body: dict[str, Any] | None, answer: HttpAnswer) -> str | None:
    """The provider's request id, from the body's envelope or the response header."""
    if body is not None and isinstance(body.get("request_id"), str):
        return str(body["request_id"])[:200]
    return answer.request_id


def decide(job: ClaimedJob, answer: HttpAnswer, now: datetime, policy: PollPolicy,
           rng: random.Random, rules: Rules,
           schedule: Plan | str | Callable[[], Plan | str] | None = None,
           overdue_factor: float | None = None) -> Outcome | AuthPause:
    """Classify one status read and say what the row becomes.

    `schedule`: the learned plan of the job's group (`vidpoll.schedule`), used only when the
    answer gives no hint; a text: why there is none yet (shown in the row's `poll_reason`);
    a function giving either, called only for an answer without a hint.
    `overdue_factor`: with a plan, the job is overdue past its group's p99 times this."""
    status = answer.status
    # parsed once: the hot path of every read
    body = _json_object(answer.body)
    request_id = _request_id(body, answer)

    def error(cls: ErrorClass, what: str, delay_s: float | None = None,
              state: str = PENDING) -> Outcome:
        if delay_s is None:
            delay_s = backoff_delay(job.consecutive_errors + 1, policy, rng)
        if state == PENDING and _age_s(job, now) >= policy.max_age_s:
            state = GAVE_UP
        return Outcome(job.job_id, job.claim_token, state, delay_s, read_ok=False,
                       outcome=None if state == PENDING else state,
                       http_status=status, error_class=cls,
                       error=_error_text(body, answer, what, rules), body=body,
                       request_id=request_id,
                       account=job.account)

    if answer.transport_error is not None:
        return error(answer.transport_error, answer.transport_error.value)
    assert status is not None
    if status in (401, 403):
        # only the error code: a provider's message may echo part of the rejected key
        err = (body or {}).get("error")
        code = err.get("code") if isinstance(err, dict) else None
        return AuthPause(0.0, status, f"HTTP {status}" + (f": {code}" if code else ""))
    if is_misrouted(status, body, rules):
        # not the provider's "no such job" (nor any of its answers): never counted as one
        return Misrouted(0.0, status, f"HTTP {status} ({body_kind(answer.body, body)})",
                         row_outcome=error(ErrorClass.CLIENT_ERROR, f"HTTP {status} (not the "
                                           "provider's error answer)"))
    if status == 404:
        tries = job.not_found_count + 1
        gone = tries >= policy.not_found_max_tries or (
            _age_s(job, now) >= policy.not_found_max_age_s
            and tries >= policy.not_found_min_tries_when_old)
        return error(ErrorClass.NOT_FOUND, "HTTP 404", state=NOT_FOUND if gone else PENDING)
    if status in (429, 503):
        hinted = parse_retry_after(answer.retry_after, now)
        cls = ErrorClass.RATE_LIMITED if status == 429 else ErrorClass.UNAVAILABLE
        delay = None
        if hinted is not None:
            delay = min(policy.max_poll_s, max(policy.min_poll_s, hinted))
        return error(cls, f"HTTP {status}", delay)
    if status >= 500:
        return error(ErrorClass.SERVER_ERROR, f"HTTP {status}")
    if not 200 <= status < 300:
        return error(ErrorClass.CLIENT_ERROR, f"HTTP {status}")

    if body is None:
        return error(ErrorClass.MALFORMED, f"HTTP {status} body is not a JSON object")
    view = rules.read_status(body)
    if isinstance(view, Unreadable):
        return error(ErrorClass.MALFORMED, view.why)
    if isinstance(view, Terminal):
        return Outcome(job.job_id, job.claim_token, view.word[:64], 0.0, read_ok=True,
                       render_s=_render_seconds(rules, body),
                       http_status=status, provider_status=view.word, body=body,
                       error=view.detail[:MAX_ERROR_TEXT] if view.detail else None,
                       request_id=request_id, account=job.account, outcome=view.outcome,
                       inline_result=(view.outcome == SUCCEEDED
                                      and rules.result_source is ResultSource.INLINE))
    state = GAVE_UP if _age_s(job, now) >= policy.max_age_s else PENDING
    delay, reason, schedule = _next_read(job, view.hint, now, policy, schedule)
    return Outcome(job.job_id, job.claim_token, state, delay, read_ok=True,
                   http_status=status,
                   provider_status=(f"{view.word} ({view.detail[:60]})"
                                    if view.detail and view.word else view.word),
                   body=body, request_id=request_id, account=job.account,
                   outcome=GAVE_UP if state == GAVE_UP else None,
                   unknown_word=not view.known, poll_reason=reason,
                   overdue_after_s=(schedule.overdue_after_s(overdue_factor)
                                    if isinstance(schedule, Plan) and overdue_factor
                                    else None))


def _render_seconds(rules: Rules, body: dict[str, Any]) -> float | None:
    """The provider's own render time in a final answer (optional `Rules.render_seconds`):
    a finite number of seconds under a week, else None (the trigger then records vidpoll's
    own observation)."""
    seconds = getattr(rules, "render_seconds", None)
    if seconds is None:
        return None
    try:
        value = seconds(body)
    except Exception:  # an optional figure: the job's end must be recorded all the same
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= 7 * 86400 else None


def _next_read(job: ClaimedJob, hint: Any, now: datetime, policy: PollPolicy,
               schedule: Plan | str | Callable[[], Plan | str] | None
               ) -> tuple[float, str, Plan | str | None]:
    """(seconds, why, the plan used) until the next read of a job still running: the
    provider's hint when it gives one (it always wins: no plan is asked for), else the
    learned plan's next read for the job's age, else the fixed interval."""
    if hint_seconds(hint, policy) is not None:
        delay = next_poll_delay(hint, policy)
        return delay, f"the provider's hint: {delay:g}s", None
    if callable(schedule):
        schedule = schedule()
    if isinstance(schedule, Plan):
        born = job.created_at or job.polling_since
        step = schedule.next_read(max(0.0, (now - born).total_seconds()))
        return (min(policy.max_poll_s, max(policy.min_poll_s, step.delay_s)), step.reason,
                schedule)
    delay = next_poll_delay(None, policy)
    return delay, f"fixed {delay:g}s" + (f": {schedule}" if schedule else ""), schedule


RETRYABLE_READ_4XX = frozenset({408, 425, 429})
"""4xx status-read answers that say "not now" whoever sends them (a proxy's timeout, too early,
too many requests): retried with backoff like before, never taken for a wrong URL."""


def is_misrouted(status: int, body: dict[str, Any] | None, rules: Rules) -> bool:
    """Whether a status-read answer is a 4xx the provider did not send: no error envelope
    (`{"error": {"code": ...}}`), and not a key refusal (401/403) nor a "not now"
    (RETRYABLE_READ_4XX). `body` is the parsed JSON object, None if it is not one."""
    return (400 <= status < 500 and status not in (401, 403)
            and status not in RETRYABLE_READ_4XX and rules.error_code(body)[0] is None)


def body_kind(raw: bytes, body: dict[str, Any] | None) -> str:
    """What an error answer's body is, in a few words (its text is never shown: a proxy's page
    can be long, and may quote the request)."""
    text = raw.lstrip()[:64].lower()
    if not text:
        return "an empty body"
    if body is not None or text[:1] in (b"{", b"["):
        return "JSON without an error envelope"
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<title", b"<h1")):
        return "an HTML page"
    if text.startswith(b"<"):
        return "XML or HTML"
    return "plain text"


PROVIDER, KEY_REFUSED, MISROUTED, NOT_API, NO_ANSWER, UNSURE = (
    "provider", "key_refused", "misrouted", "not_api", "no_answer", "unsure")
"""What a probe (a status read of a job id that cannot exist) says about the URL and the key:
The provider answered in its own words (both right; a 2xx JSON object, or any status with its
error envelope: its "not found" is the expected answer); it refused the key (401/403); a 4xx
without the envelope (the base URL is wrong: what `decide` pauses an account for); an
answer that is probably not the API's (a 1xx/3xx, a 2xx that is no JSON object: a redirect,
a web page; `decide` takes it for one row's error, since the provider itself may send a
broken body now and then, and the worker names the URL after NOT_API_STREAK of them in a
row); no answer at all (connection refused, timeout); or an answer that cannot tell (a 5xx
or a "not now" 4xx without envelope, from a gateway perhaps)."""
NOT_API_STREAK = 5
"""Status reads of one account in a row, none answered by the provider, that were a redirect
or a 2xx that is no JSON object (`is_not_api`): then the worker logs one ERROR naming the
URL. Not a pause: a provider's own transient broken body must not stop an account, and these
rows back off on their own anyway."""


def is_not_api(answer: HttpAnswer) -> bool:
    """Whether an answer is probably not the API's: a 1xx or 3xx (redirects are never
    followed), or a 2xx whose body is no JSON object (an HTML page, say)."""
    status = answer.status
    if answer.transport_error is not None or status is None:
        return False
    if 200 <= status < 300:
        return _json_object(answer.body) is None
    return status < 200 or 300 <= status < 400


def parsed_json_object(raw: bytes) -> dict[str, Any] | None:
    """`raw` as a storable JSON object, else None (the parse every rule here uses)."""
    return _json_object(raw)


def provider_error_code(raw: bytes, rules: Rules) -> str | None:
    """The error code of the provider's envelope in `raw`, None if it is not one."""
    return rules.error_code(_json_object(raw))[0]


def probe_verdict(answer: HttpAnswer, rules: Rules) -> str:
    """Classify one probe answer: PROVIDER, KEY_REFUSED, MISROUTED, NO_ANSWER or UNSURE."""
    if answer.transport_error is not None or answer.status is None:
        return NO_ANSWER
    status = answer.status
    if status in (401, 403):
        return KEY_REFUSED
    body = _json_object(answer.body)
    if rules.error_code(body)[0] is not None:
        return PROVIDER
    if 200 <= status < 300:
        return PROVIDER if body is not None else NOT_API
    if status < 200 or 300 <= status < 400:
        return NOT_API
    if status >= 500 or status in RETRYABLE_READ_4XX:
        return UNSURE
    return MISROUTED


def auth_pause_delay(failures: int, policy: PollPolicy, rng: random.Random) -> float:
    """How long every read stays paused after `failures` 401/403 answers in a row."""
    return backoff_delay(failures, policy, rng, cap_s=policy.auth_backoff_max_s)


RETRYABLE_4XX = {408: ErrorClass.TIMEOUT, 409: ErrorClass.CONFLICT, 429: ErrorClass.RATE_LIMITED}
"""4xx answers that say "not now" rather than "never": the same key is sent again later."""
RETRYABLE_CREATE_4XX = frozenset({*RETRYABLE_4XX, 425})
"""4xx create answers never taken for a wrong URL, even without the provider's envelope: the "not
now" ones (a 425 without the envelope stays an unknown outcome, as before)."""


def is_misrouted_create(status: int, body: dict[str, Any] | None, rules: Rules) -> bool:
    """Whether a create answer is a 4xx the provider did not send (no error envelope), other than a
    refused key (401/403) or a "not now" (RETRYABLE_CREATE_4XX)."""
    return (400 <= status < 500 and status not in (401, 403)
            and status not in RETRYABLE_CREATE_4XX and rules.error_code(body)[0] is None)


def unknown_resend_delay(policy: PollPolicy, rng: random.Random,
                         hinted_s: float | None = None) -> float:
    """Seconds until an `unknown` intent is sent again: the server's Retry-After if it gave
    one, else about `unknown_resend_s` (jittered down to 3/4 of it, so a fleet's unknown
    intents spread out); never past UNKNOWN_RESEND_MAX_S, never under `min_poll_s`."""
    ceiling = min(UNKNOWN_RESEND_MAX_S, max(policy.min_poll_s, policy.unknown_resend_s))
    delay = hinted_s if hinted_s is not None else ceiling * rng.uniform(0.75, 1.0)
    return min(UNKNOWN_RESEND_MAX_S, max(policy.min_poll_s, delay))


def decide_submit(intent: ClaimedIntent, answer: HttpAnswer, now: datetime, policy: PollPolicy,
                  rng: random.Random, rules: Rules) -> SubmitOutcome | AuthPause:
    """Classify one create POST: submitted, rejected for good, retry with the same key, or
    unknown (retry slowly, visibly).

    The rule that keeps a clip from being billed twice lives here: anything short of a clear
    answer (a timeout, a dropped connection, a 5xx, a 2xx without a job id, a 408/409/429, a
    1xx/3xx) is an *unknown* outcome, and the only safe move is to send the same
    Idempotency-Key again later. A 401/403, or a 4xx that is not the provider's own error envelope
    (a
    wrong URL, a proxy: MisroutedCreate), is a pause of the account: the request never reached
    The provider's create, so nothing is recorded about the intent. And once an attempt's outcome
    was unknown, a refusal in the provider's envelope is no proof that nothing was billed (a
    provider may check credits or limits before its key lookup, and answer 402 to the
    re-send of a render it started): the intent becomes UNKNOWN, never REJECTED, and keeps
    being sent with the same key, at most UNKNOWN_RESEND_MAX_S apart, until the provider
    answers with
    a job or an operator settles it.
    """
    status = answer.status
    body = _json_object(answer.body)
    request_id = _request_id(body, answer)
    code, message = rules.error_code(body)
    hinted = parse_retry_after(answer.retry_after, now)

    def retry(cls: ErrorClass, what: str) -> SubmitOutcome:
        if rules.idempotency_header is None and status != 429:
            # no key makes a second create safe: whatever this was, a render may be billed;
            # the provider's own records say which, once its list has caught up
            return SubmitOutcome(intent.key, intent.claim_token, RECONCILING,
                                 policy.reconcile_settle_s, http_status=status,
                                 error_class=cls,
                                 error=_error_text(body, answer, what, rules)
                                 + " (not sent again: looked up in the provider's own records)",
                                 request_id=request_id)
        if intent.state == UNKNOWN:
            # still no answer for a key that may be billed: the slow schedule, kept visible
            return SubmitOutcome(intent.key, intent.claim_token, UNKNOWN,
                                 unknown_resend_delay(policy, rng, hinted), http_status=status,
                                 error_class=cls, error=_error_text(body, answer, what, rules),
                                 request_id=request_id)
        if hinted is not None:
            delay = min(policy.max_poll_s, max(policy.min_poll_s, hinted))
        else:
            delay = backoff_delay(intent.consecutive_errors + 1, policy, rng)
        return SubmitOutcome(intent.key, intent.claim_token, QUEUED, delay, http_status=status,
                             error_class=cls, error=_error_text(body, answer, what, rules),
                             request_id=request_id)

    if answer.transport_error is not None:
        return retry(answer.transport_error, answer.transport_error.value)
    assert status is not None
    if 200 <= status < 300:
        job_id = rules.created_job_id(body)
        if job_id is None:
            return retry(ErrorClass.MALFORMED, f"HTTP {status} without a usable job id")
        created_handle = getattr(rules, "created_handle", None)  # optional (providers/base.py)
        handle = (created_handle(body, intent.model) if callable(created_handle)
                  and body is not None else None)
        return SubmitOutcome(intent.key, intent.claim_token, SUBMITTED, job_id=job_id,
                             http_status=status, request_id=request_id,
                             handle=handle if isinstance(handle, dict) and handle else None)
    if status in (401, 403):
        return AuthPause(0.0, status, f"HTTP {status}" + (f": {code}" if code else ""))
    if is_misrouted_create(status, body, rules):
        # not the provider's answer: the request never reached its create (see MisroutedCreate)
        return MisroutedCreate(0.0, status, f"HTTP {status} ({body_kind(answer.body, body)})")
    if status in RETRYABLE_4XX:
        return retry(RETRYABLE_4XX[status], f"HTTP {status}")
    if status == 503:
        return retry(ErrorClass.UNAVAILABLE, f"HTTP {status}")
    if status >= 500:
        return retry(ErrorClass.SERVER_ERROR, f"HTTP {status}")
    if 400 <= status < 500 and code is not None:
        if rules.idempotency_header is None:
            # a create without a key is sent only once every earlier one is settled (adopted,
            # or proven absent from the provider's records): a refusal now is final
            return SubmitOutcome(intent.key, intent.claim_token, REJECTED, http_status=status,
                                 error_class=ErrorClass.CLIENT_ERROR,
                                 error=_error_text(body, answer, f"HTTP {status}", rules),
                                 error_code=code, error_message=message,
                                 request_id=request_id)
        if intent.outcome_unknown or intent.state == UNKNOWN:
            # refused now, but an earlier attempt may have started (and billed) a render
            return SubmitOutcome(intent.key, intent.claim_token, UNKNOWN,
                                 unknown_resend_delay(policy, rng, hinted), http_status=status,
                                 error_class=ErrorClass.CLIENT_ERROR,
                                 error=_error_text(body, answer, f"HTTP {status}", rules),
                                 error_code=code, error_message=message, request_id=request_id)
        return SubmitOutcome(intent.key, intent.claim_token, REJECTED, http_status=status,
                             error_class=ErrorClass.CLIENT_ERROR,
                             error=_error_text(body, answer, f"HTTP {status}", rules),
                             error_code=code,
                             error_message=message, request_id=request_id)
    # a 425 without the provider's envelope, a 1xx/3xx (a redirect is never followed): not the
    # provider
    # refusing this request, so never a final rejection; sent again with the same key
    return retry(ErrorClass.CLIENT_ERROR, f"HTTP {status} (not a the provider error answer)")


@dataclass(frozen=True, slots=True)
class Budget:
    """A configured rate for one account and kind of call: tokens per second, and a burst."""

    rate_per_s: float
    burst: float

    @classmethod
    def per_minute(cls, per_min: float, burst: float | None = None) -> Budget:
        """`per_min` calls a minute; the burst defaults to two seconds' worth (at least 1)."""
        rate = per_min / 60.0
        return cls(rate, burst if burst is not None else max(1.0, 2.0 * rate))


@dataclass(frozen=True, slots=True)
class Grant:
    """What a bucket gave: `granted` tokens, the tokens left, when to ask again, and the share
    of the configured rate in use now."""

    granted: int
    tokens_left: float
    wait_s: float
    rate_factor: float = 1.0


RATE_CUT = 0.7
"""A 429 multiplies the fleet's rate by this (once a second at most)."""
RATE_RECOVERY_PER_S = 0.05
"""Then the rate grows back by this share of the configured rate each second."""
MIN_RATE_FACTOR = 0.02


def take_tokens(tokens: float, elapsed_s: float, paused_s: float, want: int,
                budget: Budget, rate_factor: float = 1.0) -> Grant:
    """Refill a bucket for `elapsed_s`, then take up to `want` whole tokens.

    The refill rate is the configured rate times `rate_factor` (below 1 after the server
    refused with a 429), which itself recovers toward 1 over the same `elapsed_s`. `wait_s` is
    how long until the next whole token (or the end of a server pause): the time a worker that
    got fewer than it wanted may sleep before asking again.
    """
    elapsed = max(0.0, elapsed_s)
    factor = min(1.0, max(MIN_RATE_FACTOR, rate_factor) + RATE_RECOVERY_PER_S * elapsed)
    rate = budget.rate_per_s * factor
    avail = min(budget.burst, max(0.0, tokens) + rate * elapsed)
    if paused_s > 0:
        return Grant(0, avail, paused_s, rate_factor)
    granted = max(0, min(want, math.floor(avail + 1e-9)))
    left = avail - granted
    wait = 0.0 if granted >= want else max(0.0, (1.0 - left) / rate)
    return Grant(granted, left, wait, factor)


RESET_EPOCH_THRESHOLD = 1_000_000_000
"""A RateLimit-Reset larger than this is a Unix time (as some APIs send), not seconds."""


def server_pause_s(answer: HttpAnswer, now: datetime, policy: PollPolicy, *,
                   named_only: bool = False) -> float | None:
    """How long the server asked every caller with this key to stop, if it did.

    A 429 pauses for its Retry-After (else its `RateLimit-Reset`, else the backoff base;
    `named_only`: else None); any answer whose `RateLimit-Remaining` is 0 pauses until its
    `RateLimit-Reset`. None: no pause asked.
    """
    if answer.status == 429:
        hinted = parse_retry_after(answer.retry_after, now)
        if hinted is None:
            hinted = _reset_seconds(answer.ratelimit_reset, now)
        if hinted is None and named_only:
            return None
        return min(policy.max_poll_s, hinted if hinted is not None else policy.backoff_base_s)
    remaining = answer.ratelimit_remaining
    if remaining is None:
        return None
    try:
        left = float(remaining.strip())
    except ValueError:
        return None
    if not math.isfinite(left) or left > 0:
        return None
    reset = _reset_seconds(answer.ratelimit_reset, now)
    return min(policy.max_poll_s, reset if reset is not None else policy.backoff_base_s)


def _reset_seconds(value: str | None, now: datetime) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(seconds):
        return None
    if seconds > RESET_EPOCH_THRESHOLD:
        seconds -= now.timestamp()
    return max(0.0, seconds)


MAX_RESULT_ATTEMPTS = 30
"""A result that still cannot be fetched after this many tries is marked failed (kept)."""


def decide_result(claim: ClaimedResult, answer: HttpAnswer, now: datetime, policy: PollPolicy,
                  rng: random.Random, rules: Rules) -> ResultOutcome:
    """Classify one result fetch: fetched, not yet (409 and every transient failure: later,
    with backoff or Retry-After), or failed for good (the provider refused, or too many tries)."""
    status = answer.status
    body = _json_object(answer.body)
    code, message = rules.error_code(body)

    def later(what: str) -> ResultOutcome:
        # a 429 is the server's pacing, not this result failing: it never uses up the tries
        if claim.attempts >= MAX_RESULT_ATTEMPTS and status != 429:
            return ResultOutcome(claim.job_id, claim.token, "failed",
                                 error=f"gave up after {claim.attempts} tries: {what}")
        hinted = parse_retry_after(answer.retry_after, now)
        delay = (min(policy.max_poll_s, max(policy.min_poll_s, hinted)) if hinted is not None
                 else backoff_delay(claim.attempts, policy, rng))
        return ResultOutcome(claim.job_id, claim.token, "pending", delay,
                             error=_error_text(body, answer, what, rules))

    if answer.transport_error is not None:
        return later(answer.transport_error.value)
    assert status is not None
    if 200 <= status < 300:
        if body is None:
            return later(f"HTTP {status} body is not a JSON object")
        return ResultOutcome(claim.job_id, claim.token, "fetched", result=body)
    if (status in (401, 403, 404, 408, 425, 429) or status >= 500 or code is None
            or rules.result_not_ready(answer, code)):
        # The provider's "not yet"; a new job may 404 for a moment; a refused key is the
        # status reads' business (they pause the account): here it is one more try
        return later(f"HTTP {status}" + (f" {code}" if code else ""))
    return ResultOutcome(claim.job_id, claim.token, "failed",
                         error=f"HTTP {status} {code}: {message or ''}"[:MAX_ERROR_TEXT])
