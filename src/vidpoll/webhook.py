"""Sume's webhook deliveries: signature, replay window and job id. Pure; no I/O.

A delivery carries `X-Sume-Timestamp` (Unix seconds), `X-Sume-Event-Id` and
`X-Sume-Signature: v1=<hex>`, the HMAC-SHA256 with the webhook secret of
`"{timestamp}.{raw body}"`. Several `v1=` values (comma-separated) are accepted, so a secret
can be rotated. A webhook is only a hint: vidpoll never takes a job's state from it.

A repeat is recognised by the value that verified (what `verify` returns), never by the raw
header: any list that holds it verifies, so a captured delivery with `,v1=0` appended must
still be the same delivery. Refused deliveries cost no row and, through `LogSampler`, at most
one log line per reason a minute: anyone who can reach the server can send them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections.abc import Callable
from typing import Any, Literal

from vidpoll.errors import InvalidJobId
from vidpoll.policy import validate_job_id

DEFAULT_TOLERANCE_S = 300.0
"""Deliveries whose timestamp is further than this from now (either way) are refused."""
MAX_BODY_BYTES = 256 * 1024
REJECT_LOG_EVERY_S = 60.0
"""At most one log line per rejection reason this often: anyone can send refused deliveries."""

RejectReason = Literal["unsigned", "timestamp", "signature", "too_large", "malformed"]
REJECT_REASONS: tuple[RejectReason, ...] = (
    "unsigned", "timestamp", "signature", "too_large", "malformed")
"""Why a delivery was refused, the label values of vidpoll_webhooks_rejected_total (a fixed
set: nothing a caller sends becomes a label). unsigned: no timestamp or signature header;
timestamp: not a number or outside the replay window; signature: no `v1=` value matches;
too_large: a body over MAX_BODY_BYTES; malformed: signed, but without an event id or job id."""


class WebhookRejected(Exception):
    """The delivery is not provably from Sume, or is too old: answer 401 and change nothing.

    `reason` is one of REJECT_REASONS; the message is fixed text (never the caller's)."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason: RejectReason = reason


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Sume-Signature` value Sume sends for this body (used by the fake and tests)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(secret: str, timestamp: str | None, signature: str | None, body: bytes,
           now_s: float, tolerance_s: float = DEFAULT_TOLERANCE_S) -> str:
    """Raise WebhookRejected unless the signature matches and the timestamp is recent.

    Returns the `v1=<hex>` value that matched, in the one form Sume computes it: what a
    repeat is recognised by. The raw header is not: the same signed delivery verifies with its
    values re-ordered, re-spaced or joined by others, so a replay could pass as new.
    """
    if not timestamp or not signature:
        raise WebhookRejected("unsigned", "missing X-Sume-Timestamp or X-Sume-Signature")
    try:
        sent_s = float(timestamp.strip())
    except ValueError:
        raise WebhookRejected("timestamp", "X-Sume-Timestamp is not a number") from None
    if not math.isfinite(sent_s) or abs(now_s - sent_s) > tolerance_s:
        raise WebhookRejected("timestamp",
                              f"timestamp outside the {tolerance_s:g}s replay window")
    expected = sign(secret, timestamp.strip(), body).encode()
    offered = [part.strip().encode("utf-8", "replace") for part in signature.split(",")]
    # bytes, not str: compare_digest refuses non-ASCII text (a 500 for any garbage header)
    if not any(hmac.compare_digest(expected, part) for part in offered
               if part.startswith(b"v1=")):
        raise WebhookRejected("signature", "signature does not match")
    return expected.decode()


class LogSampler:
    """At most one log line per key every `every_s` seconds, counting the ones held back.

    Keys must come from a small fixed set (REJECT_REASONS): the state is one entry per key."""

    def __init__(self, every_s: float = REJECT_LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def admit(self, key: str) -> int | None:
        """None: hold this line back (counted); else log it, saying how many lines of this
        key were held back since the last one logged (0 for none)."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


def job_id_of(body: bytes) -> str | None:
    """The job id a delivery is about: `job_id`, or `data.job_id` / `data.id`.

    Not a top-level `id`: in an event envelope that is the event's own id.
    """
    try:
        value: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    data = value.get("data")
    for found in (value.get("job_id"), *((data.get("job_id"), data.get("id"))
                                          if isinstance(data, dict) else ())):
        if isinstance(found, str):
            try:
                return validate_job_id(found)
            except InvalidJobId:
                return None
    return None
