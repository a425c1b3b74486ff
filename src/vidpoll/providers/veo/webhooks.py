"""Veo's webhook deliveries on the Gemini API (static webhooks): signature, replay window,
event id and job id. Pure; no I/O.

The Gemini API has two kinds of webhooks (ai.google.dev/gemini-api/docs/webhooks, "Static
webhooks" and "Dynamic webhooks"; google-genai 2.34's `client.webhooks`, `WebhookConfig`):
- **static**: registered for a project (`POST /v1/webhooks {name, uri, subscribed_events}`,
  `video.generated` among the events), with a signing secret returned once, on create or on
  `rotate_secret` (`whsec_` and base64: the SDK lists it truncated as `whsec_...3frh`).
  Deliveries follow Standard Webhooks: `webhook-id` (the same on every retry; the docs:
  de-duplicate on it), `webhook-timestamp`, `webhook-signature` (`v1,<base64 HMAC-SHA256 of
  "{id}.{timestamp}.{body}">`, several during a rotation), the docs' own example verifying
  with the `standardwebhooks` library; retried with backoff for 24 hours.
- **dynamic**: a create's `webhookConfig.uris`; those deliveries carry an RS256 JWT in
  `webhook-signature`, checked against Google's JWKS with an audience the docs leave open
  ("your-configured-audience"), and they do not say what the token binds (the body, the
  event). Not verified here: such a delivery is refused as `signature`, so a Veo account
  must be served by a static webhook, not by `webhookConfig` on its creates.

The body (the docs' "webhook envelope", a thin payload): `{"type": "video.generated",
"version": "v1", "timestamp": ..., "data": {"id", "output_file_uri", "file_name"}}`. The job
is `data.id`, taken as it is: vidpoll's Veo job id is the operation's `name`
(`models/<model>/operations/<id>`); whether `data.id` is that whole name or only its last
segment the docs do not show (their one example is a batch's, `batch_123456`). A delivery
whose `data.id` vidpoll does not track is logged by the route as such (never an error), so a
mismatch shows at once and polling still finds every job. Events of other types (`batch.*`,
`interaction.*`) name no Veo job and end the same way.

The Standard Webhooks check is Replicate's (`vidpoll.providers.replicate.webhooks.
verify_signature`: the `standardwebhooks` library's signer, vidpoll's own clock and window,
header bounds, the `whsec_` secret refused unless it decodes), shared, not copied.

`WEBHOOKS` is what the Veo provider's `webhooks` returns; `vidpoll serve` calls it for
`POST /webhooks/veo` (vidpoll.web.webhooks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vidpoll.errors import InvalidJobId
from vidpoll.policy import validate_job_id
from vidpoll.providers.base import WebhookHint
from vidpoll.providers.replicate.webhooks import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signing_key,
    verify_signature,
)
from vidpoll.webhook import WebhookRejected

VIDEO_EVENT = "video.generated"


def job_id_of(body: bytes) -> str | None:
    """The operation a delivery is about: `data.id` of the envelope; None when the body is not
    a JSON object with a `data` object whose `id` is a string vidpoll can store."""
    try:
        value: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    data = value.get("data") if isinstance(value, dict) else None
    found = data.get("id") if isinstance(data, dict) else None
    if not isinstance(found, str):
        return None
    try:
        return validate_job_id(found)
    except InvalidJobId:
        return None


def _header(headers: Mapping[str, str], name: str) -> str:
    """`name`'s value, stripped, its case ignored as HTTP does; "" when absent."""
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    return (value or "").strip()


class VeoWebhooks:
    """Veo's (Gemini API static) webhooks behind the provider interface
    (`vidpoll.providers.base.Webhooks`)."""

    def secret_problem(self, secret: str) -> str | None:
        """Why `secret` cannot be a Gemini API webhook signing secret (checked when `serve`
        starts; the secret itself never shown); None when it can."""
        if signing_key(secret) is None:
            return ("is not a Gemini API webhook signing secret (whsec_ then base64, as "
                    "webhooks.create returns it in new_signing_secret)")
        return None

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str, now_s: float,
               tolerance_s: float) -> WebhookHint:
        """The delivery's operation (`data.id`), `webhook-id` and signed value;
        WebhookRejected (unsigned, timestamp, signature; then malformed: signed, but without
        a `data.id` vidpoll can store) unless it is the Gemini API's and recent."""
        msg_id = _header(headers, ID_HEADER)
        signed = verify_signature(secret, msg_id, _header(headers, TIMESTAMP_HEADER),
                                  _header(headers, SIGNATURE_HEADER), body, now_s, tolerance_s)
        job_id = job_id_of(body)
        if job_id is None:
            raise WebhookRejected("malformed", "need a JSON object whose `data` holds the "
                                               "operation's id (a string) as its `id`")
        return WebhookHint(job_id=job_id, event_id=msg_id, dedupe=signed)

    def __repr__(self) -> str:
        return "<webhooks veo>"


WEBHOOKS = VeoWebhooks()
