"""Sume's webhook deliveries: signature, replay window, event id and job id. Pure; no I/O.

A delivery carries `X-Sume-Timestamp` (Unix seconds), `X-Sume-Event-Id` and
`X-Sume-Signature: v1=<hex>`, the HMAC-SHA256 with the webhook secret of
`"{timestamp}.{raw body}"`. Several `v1=` values (comma-separated) are accepted, so a secret
can be rotated. A webhook is only a hint: vidpoll never takes a job's state from it.

A repeat is recognised by the value that verified (`WebhookHint.dedupe`), never by the raw
header: any list that holds it verifies, so a captured delivery with `,v1=0` appended must
still be the same delivery. The event id is not signed either: a captured delivery re-sent
under a new one is still the same signed value, so still a repeat.

`WEBHOOKS` is what `vidpoll.providers.sume.PROVIDER.webhooks` returns; `vidpoll serve` calls
it for `POST /webhooks/sume` (vidpoll.web.webhooks).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from typing import Any

from vidpoll.errors import InvalidJobId
from vidpoll.policy import validate_job_id
from vidpoll.providers.base import WebhookHint
from vidpoll.webhook import DEFAULT_TOLERANCE_S, WebhookRejected

TIMESTAMP_HEADER = "X-Sume-Timestamp"
SIGNATURE_HEADER = "X-Sume-Signature"
EVENT_ID_HEADER = "X-Sume-Event-Id"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Sume-Signature` value Sume sends for this body (used by the fake and tests)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_signature(secret: str, timestamp: str | None, signature: str | None, body: bytes,
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


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """`name`'s value, its case ignored as HTTP does (aiohttp's headers already do; a plain
    dict, as a test or another server passes, may not)."""
    value = headers.get(name)
    if value is not None:
        return value
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


class SumeWebhooks:
    """Sume's webhooks behind the provider interface (`vidpoll.providers.base.Webhooks`)."""

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str, now_s: float,
               tolerance_s: float) -> WebhookHint:
        """The delivery's job, event id and signed value; WebhookRejected (unsigned,
        timestamp, signature; then malformed: signed, but without an event id or a job id)
        unless it is Sume's and recent."""
        signed = verify_signature(secret, _header(headers, TIMESTAMP_HEADER),
                                  _header(headers, SIGNATURE_HEADER), body, now_s, tolerance_s)
        event_id = (_header(headers, EVENT_ID_HEADER) or "").strip()
        job_id = job_id_of(body)
        if not event_id or job_id is None:
            raise WebhookRejected("malformed", "need X-Sume-Event-Id and a job id in the body")
        return WebhookHint(job_id=job_id, event_id=event_id, dedupe=signed)

    def __repr__(self) -> str:
        return "<webhooks sume>"


WEBHOOKS = SumeWebhooks()
