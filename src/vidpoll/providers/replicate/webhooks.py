"""Replicate's webhook deliveries: signature, replay window, event id and job id. Pure; no I/O.

Replicate signs the Standard Webhooks way (replicate.com/docs/topics/webhooks/verify-webhook;
the scheme: github.com/standard-webhooks/standard-webhooks, spec/standard-webhooks.md). A
delivery carries `webhook-id` (the same on every retry of one message), `webhook-timestamp`
(Unix seconds of this attempt) and `webhook-signature`, a space-separated list of
`v1,<base64 HMAC-SHA256>` of `"{id}.{timestamp}.{raw body}"`, keyed with the base64-decoded
secret after its `whsec_` prefix (`GET /v1/webhooks/default/secret`). Several `v1,` values are
accepted, so a secret can be rotated; values of any other version are ignored. The body is the
prediction object: its `id` is the job's. A webhook is only a hint: vidpoll never takes a job's
state from it.

The signature is computed by the `standardwebhooks` library (`Webhook.sign`, the maintained
implementation of the scheme), not by hand. Its `Webhook.verify` is not used: it reads the
wall clock and a fixed 5-minute tolerance, while vidpoll passes `now_s` and `tolerance_s`
(a test's clock, an operator's window) and applies them itself, both ways. Its secret
decoding is not used either: it skips characters that are not base64, so a mangled secret
would quietly verify nothing; here it is refused.

Header values are bounded and checked before any HMAC: the id 1-200 visible ASCII characters
without a `.` (the spec bars one: it would let the signed content be split another way), the
timestamp plain digits.

A repeat is recognised by the value that verified (`WebhookHint.dedupe`): `v1,` and the
standard base64 of the digest, the one form the library computes, never the raw header (the
same signed delivery verifies with its list re-ordered or padded with other values). The
`webhook-id`, the event id, is signed, and a retry keeps it, so a retry (new timestamp, new
signature) is a repeat by its event id (`PgStore.receive_webhook` refuses either again).

A secret that is not `whsec_<base64>` is a configuration error, not the sender's: the delivery
is refused as `signature` (no signature can match), so `vidpoll.web.webhooks.verify_any` still
tries the provider's other secrets; the refusal's fixed text says it is the secret.

`WEBHOOKS` is what the Replicate provider's `webhooks` returns; `vidpoll serve` calls it for
`POST /webhooks/replicate` (vidpoll.web.webhooks).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook

from vidpoll.errors import InvalidJobId
from vidpoll.policy import validate_job_id
from vidpoll.providers.base import WebhookHint
from vidpoll.webhook import WebhookRejected

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"

MAX_EVENT_ID_CHARS = 200
"""The longest `webhook-id` taken (the spec's example is `msg_` and 27 characters); the route
stores at most this many."""
MAX_TIMESTAMP_DIGITS = 12
"""Unix seconds in digits: 10 until the year 2286, so 12 is ample."""
MAX_SIGNATURE_HEADER_CHARS = 2048
"""About 40 `v1,` values: a rotation needs two or three."""

_EVENT_ID = re.compile(rf"[\x21-\x2d\x2f-\x7e]{{1,{MAX_EVENT_ID_CHARS}}}")
"""Visible ASCII but `.`: the spec (section "Signature scheme") bars a `.` from the id, which
would let one signed `id.timestamp.body` be split another way; no space, nothing a log could
mangle."""
_TIMESTAMP = re.compile(rf"[1-9][0-9]{{0,{MAX_TIMESTAMP_DIGITS - 1}}}")
"""ASCII digits without a leading zero: the one form the signed content holds (`Webhook.sign`
writes the integer), so the time checked is the time signed."""
_BASE64 = re.compile(r"[A-Za-z0-9+/]+")
"""Standard base64 (its padding stripped before the match)."""


def signing_key(secret: str) -> bytes | None:
    """The HMAC key behind a `whsec_<base64>` secret (padding optional); None when the secret
    is not one (no prefix, not standard base64, or empty)."""
    encoded = secret.strip()
    if not encoded.startswith(SECRET_PREFIX):
        return None
    encoded = encoded[len(SECRET_PREFIX):].rstrip("=")
    if not encoded or not _BASE64.fullmatch(encoded):
        return None
    try:
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True) or None
    except binascii.Error:  # a length no base64 has (4n + 1 characters)
        return None


def job_id_of(body: bytes) -> str | None:
    """The prediction id a delivery is about: the body's top-level `id`; None when the body is
    not a JSON object with a string `id` vidpoll can store."""
    try:
        value: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    found = value.get("id") if isinstance(value, dict) else None
    if not isinstance(found, str):
        return None
    try:
        return validate_job_id(found)
    except InvalidJobId:
        return None


def _header(headers: Mapping[str, str], name: str) -> str:
    """`name`'s value, stripped, its case ignored as HTTP does (aiohttp's headers already do; a
    plain dict, as a test or another server passes, may not); "" when absent."""
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    return (value or "").strip()


def verify_signature(secret: str, msg_id: str, timestamp: str, signature: str, body: bytes,
                     now_s: float, tolerance_s: float) -> str:
    """Raise WebhookRejected unless the headers are sane, the timestamp is within
    `tolerance_s` of `now_s` (either way) and a `v1,` value of `signature` is the HMAC of this
    id, timestamp and body under `secret`.

    Returns the `v1,<base64>` value that matched, in the one form `Webhook.sign` computes it:
    what a repeat is recognised by. Messages are fixed text: never the secret, a signature or
    anything the caller sent.
    """
    if not (msg_id and timestamp and signature):
        raise WebhookRejected("unsigned", "missing webhook-id, webhook-timestamp or "
                                          "webhook-signature")
    if not _EVENT_ID.fullmatch(msg_id):
        # the id is part of the signed content: without a sane one there is nothing to check
        raise WebhookRejected("unsigned", f"webhook-id is not 1-{MAX_EVENT_ID_CHARS} visible "
                                          "ASCII characters without a '.'")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise WebhookRejected("timestamp", "webhook-timestamp is not Unix seconds")
    sent_s = int(timestamp)
    # `not <=`: a NaN now or tolerance refuses instead of letting everything through
    if not abs(now_s - sent_s) <= tolerance_s:
        raise WebhookRejected("timestamp",
                              f"timestamp outside the {tolerance_s:g}s replay window")
    try:
        sent_at = datetime.fromtimestamp(sent_s, tz=UTC)
    except (OverflowError, ValueError, OSError):  # past year 9999: only with a huge window
        raise WebhookRejected("timestamp", "webhook-timestamp is not a time") from None
    if len(signature) > MAX_SIGNATURE_HEADER_CHARS:
        raise WebhookRejected("signature", "webhook-signature is longer than "
                                           f"{MAX_SIGNATURE_HEADER_CHARS} characters")
    key = signing_key(secret)
    if key is None:
        raise WebhookRejected("signature", "the webhook secret is not whsec_<base64>: "
                                           "a configuration error")
    expected = Webhook(key).sign(msg_id, sent_at, body).encode()
    # bytes, not str: compare_digest refuses non-ASCII text (a 500 for any garbage header)
    offered = (part.encode("utf-8", "replace") for part in signature.split())
    if not any(hmac.compare_digest(expected, part) for part in offered
               if part.startswith(b"v1,")):
        raise WebhookRejected("signature", "signature does not match")
    return expected.decode()


class ReplicateWebhooks:
    """Replicate's webhooks behind the provider interface (`vidpoll.providers.base.Webhooks`)."""

    def secret_problem(self, secret: str) -> str | None:
        """Why `secret` cannot be a Replicate webhook secret (checked when `serve` starts; the
        secret itself never shown); None when it can."""
        if signing_key(secret) is None:
            return ("is not a Replicate webhook secret (whsec_ then base64, as "
                    "GET /v1/webhooks/default/secret returns it)")
        return None

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str, now_s: float,
               tolerance_s: float) -> WebhookHint:
        """The delivery's prediction, `webhook-id` and signed value; WebhookRejected
        (unsigned, timestamp, signature; then malformed: signed, but without a prediction id
        vidpoll can store) unless it is Replicate's and recent."""
        msg_id = _header(headers, ID_HEADER)
        signed = verify_signature(secret, msg_id, _header(headers, TIMESTAMP_HEADER),
                                  _header(headers, SIGNATURE_HEADER), body, now_s, tolerance_s)
        job_id = job_id_of(body)
        if job_id is None:
            raise WebhookRejected("malformed", "need a JSON object with the prediction's id "
                                               "(a string) as its `id`")
        return WebhookHint(job_id=job_id, event_id=msg_id, dedupe=signed)

    def __repr__(self) -> str:
        return "<webhooks replicate>"


WEBHOOKS = ReplicateWebhooks()
