"""Luma's callbacks: unsigned, so only ever the name of a generation to read now. Pure; no I/O.

Luma POSTs the Generation object (the JSON `GET /generations/{id}` answers) to a create's
`callback_url` on every update (`dreaming`, `completed`, `failed`), retrying 3 times 100 ms
apart, each with a 5 s timeout, until it gets a 200 (docs.lumalabs.ai/changelog/
callbacks-and-credits-balance; PROVIDERS.md section 6). No signature, no timestamp and no
event id is documented.

So `signed` is False: the route serves `/webhooks/luma` without a secret, rate-limits it
per source address, stores nothing for a delivery, and pokes only a pending Luma job of the
id `verify` reads (a UUID, as Luma's OpenAPI describes it; anything else is refused as
`malformed`), at most once a second. Nothing else in the body is trusted or kept: the job is
read from Luma as usual. Anyone who can reach the route can make a tracked Luma job due now,
no more (the read that follows is Luma's answer).

`WEBHOOKS` is what the Luma provider's `webhooks` returns; `vidpoll serve` calls it for
`POST /webhooks/luma` (vidpoll.web.webhooks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from vidpoll.providers.base import WebhookHint
from vidpoll.webhook import WebhookRejected

MAX_EVENT_ID_CHARS = 200
"""The longest event id the route stores."""
_GENERATION_ID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
"""A generation's id: a UUID in its usual text form (Luma's OpenAPI: `format: uuid`)."""
_STATE = re.compile(r"[a-z][a-z_]{0,31}")
"""A state word as Luma writes them (`dreaming`): anything else is left out of the event id."""


def generation_of(body: bytes) -> tuple[str, str] | None:
    """(id, state word or "") of a callback's Generation; None when the body is not a JSON
    object whose `id` is a UUID."""
    try:
        value: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    found = value.get("id")
    if not isinstance(found, str) or not _GENERATION_ID.fullmatch(found):
        return None
    state = value.get("state")
    word = state.strip().lower() if isinstance(state, str) else ""
    return found, word if _STATE.fullmatch(word) else ""


class LumaWebhooks:
    """Luma's callbacks behind the provider interface (`vidpoll.providers.base.Webhooks`)."""

    signed = False
    """Luma signs nothing: served without a secret, each delivery only a hint."""

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str, now_s: float,
               tolerance_s: float) -> WebhookHint:
        """The generation a callback names; WebhookRejected("malformed") when the body is not
        a JSON object with a UUID `id`. `headers`, `secret`, `now_s` and `tolerance_s` mean
        nothing to an unsigned delivery. A repeat (Luma's retries of one update) is the same
        `id:state`."""
        found = generation_of(body)
        if found is None:
            raise WebhookRejected("malformed", "need a JSON object with the generation's id "
                                               "(a UUID) as its `id`")
        job_id, state = found
        event_id = f"{job_id}:{state}"[:MAX_EVENT_ID_CHARS]
        return WebhookHint(job_id=job_id, event_id=event_id, dedupe=event_id)

    def __repr__(self) -> str:
        return "<webhooks luma>"


WEBHOOKS = LumaWebhooks()
