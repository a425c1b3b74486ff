"""The Luma HTTP client: Dream Machine's paths and request shapes over the shared plumbing
(`vidpoll.providers.http.JsonApiClient`: `Authorization: Bearer <key>`, the key scrubbed from
every body however it is encoded, status bodies' links without their query strings, every
failure an answer, never raised).

Creates go to `POST {base_url}/generations/video` with the body as `submit` gave it, `model`
set from `--model` and, when the account names a webhook URL, `callback_url` set to it (else
the body's own `callback_url`, if any, goes unchanged). Luma has no idempotency key, and its
SDK's retries bill again (PROVIDERS.md "Updates": one create that hit a 500 after billing made
3 paid generations), so nothing here retries: an unanswered create is looked up in the
account's generations (`list_created`: pages the core walks), never sent again blindly. A
generation's status answer holds its video (inline results); the video is on Luma's CDN, which
is sent no key.

The base URL is used as given (`https://api.lumalabs.ai/dream-machine/v1`, or a gateway's):
the paths follow it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from yarl import URL

from vidpoll.media import shown_url
from vidpoll.models import HttpAnswer
from vidpoll.providers.base import Created, CreatedPage, ProviderOptions
from vidpoll.providers.http import JsonApiClient, job_url, list_page
from vidpoll.providers.luma.rules import (
    CALLBACK_FIELD,
    MODEL_FIELD,
    RULES,
    model_problem,
    payload_problem,
)

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Reconciler

DEFAULT_BASE_URL = "https://api.lumalabs.ai/dream-machine/v1"
CREATE_PATH = "/generations/video"
"""A video generation (lumaai 1.21's `generations.video.create`; older docs: POST /generations)."""
GENERATION_PATH = "/generations/{job_id}"
LIST_PATH = "/generations"
"""Every generation of the account, newest first, `limit` and `offset` pages."""
PAGE_LIMIT = 100
"""The list's default page (Luma's OpenAPI: `limit` defaults to 100)."""
LISTING = "listing generations"
NOT_SENT = "not sent"
MAX_CURSOR = 2048
_NO_OPTIONS = ProviderOptions()


def parse_time(value: Any) -> datetime | None:
    """A generation's `created_at` (ISO 8601, `Z` or an offset; naive means UTC), or None when
    it has none that parses."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _cursor(offset: int, anchor_id: str, anchor_at: datetime | None) -> str:
    return json.dumps([offset, anchor_id, anchor_at.isoformat() if anchor_at else None])


def _read_cursor(cursor: str) -> tuple[int, str, datetime | None] | None:
    """(offset, anchor id, anchor's creation time) of a cursor `_cursor` wrote; None if not."""
    if len(cursor) > MAX_CURSOR:
        return None
    try:
        value = json.loads(cursor)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(value, list) and len(value) == 3):
        return None
    offset, anchor_id, at = value
    if (not isinstance(offset, int) or isinstance(offset, bool) or offset < 0
            or not isinstance(anchor_id, str) or not (at is None or isinstance(at, str))):
        return None
    return offset, anchor_id, parse_time(at)


class LumaClient(JsonApiClient):
    """One account's client for Luma's generations (`vidpoll.providers.base.Client`, and a
    `Reconciler`: `list_scope`, `list_created`)."""

    rules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, options: ProviderOptions = _NO_OPTIONS) -> None:
        super().__init__(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)
        self._webhook_url = options.webhook_url

    def shown_status_url(self, job_id: str) -> str:
        """A generation's URL as logs show it: scheme, host, port and path only."""
        return shown_url(str(job_url(self._base, job_id, GENERATION_PATH)))

    def shown_create_url(self) -> str:
        return shown_url(self._base + CREATE_PATH)

    def media_headers(self) -> Mapping[str, str]:
        """None: the video URLs Luma answers are its CDN's, fetched without the key (which
        goes only to the API)."""
        return {}

    def media_auth_hosts(self) -> frozenset[str]:
        return frozenset()

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the generation; its links lose their query strings (the answer is stored)."""
        return await self._call("GET", job_url(self._base, job_id, GENERATION_PATH))

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """The same GET (results are inline; the deliverer asks again after an expired link),
        a 2xx keeping its links whole."""
        return await self._call("GET", job_url(self._base, job_id, GENERATION_PATH),
                                keep_links=True)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST a video generation of `model` with `payload` as its body (the paid call):
        `model` set, `callback_url` the account's webhook URL when it names one.
        `idempotency_key` is not sent: Luma has none.

        A model or body Luma cannot take (no model, not a model id, a body naming another
        model) is not sent: the answer is a 422 in Luma's own shape, `{"detail": "not sent:
        ..."}`, which the core reads as a final refusal (`rejected`). A key no header can
        carry is not sent either: a 401 in Luma's shape, so the account pauses as for a
        refused key and the intent stays queued (a transport error would be an unknown
        create, looked up for nothing)."""
        if self.key_problem is not None:
            return HttpAnswer(401, json.dumps({
                "detail": f"{NOT_SENT}: the API key cannot go into an HTTP header: "
                          f"{self.key_problem}"}).encode(), detail="not sent: unusable key")
        problem = ("no --model (a Luma create names its model, like ray-2)" if model is None
                   else model_problem(model) or payload_problem(payload, model))
        if model is None or problem is not None:
            return HttpAnswer(422, json.dumps({"detail": f"{NOT_SENT}: {problem}"}).encode())
        body = {MODEL_FIELD: model, **{k: v for k, v in payload.items() if k != MODEL_FIELD}}
        if self._webhook_url:
            body[CALLBACK_FIELD] = self._webhook_url
        # a 2xx is kept whole but for the key: its id is read as sent
        return await self._call("POST", URL(self._base + CREATE_PATH, encoded=True),
                                data=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"}, keep_links=True)

    # ---- the account's generations (reconciliation) ----

    def list_scope(self, model: str | None) -> str:
        """One listing serves every model: Luma lists all of the account's generations."""
        return ""

    async def list_created(self, model: str | None, since: datetime, until: datetime,
                           cursor: str | None) -> CreatedPage:
        """One page of the account's generations (`GET /generations?limit=100&offset=N`,
        newest first), each with its id and `created_at`; `rules.match_created` compares each
        with an intent. The walk ends (the last page) when Luma has no more (`has_more`: a
        page without it is followed until one adds nothing, a short page is no proof), or once
        a page reaches a generation older than `since`. The cursor (opaque to the core) is
        JSON: the next offset, and the id and creation time of its anchor (below).

        Offsets move while the walk runs. A generation made meanwhile pushes the older ones
        down: some are read twice (the core counts a job once). One deleted meanwhile pulls
        them up, and a page would skip the ones that crossed its edge, a create among them
        then never seen. So each page after the first starts at the previous page's oldest
        generation (its anchor, in the cursor) and must find it there, or must hold only
        generations newer than it (pushed down by a page or more: the next page looks again);
        otherwise the page's records still count but the walk ends unproven (`final`: the
        core starts a new walk next time). A failed call or an answer that is not
        `{"generations": [...]}` is a failed page (tried again by the core). Never raises for
        an HTTP failure."""
        anchor: tuple[str, datetime | None] | None = None
        offset = 0
        if cursor is not None:
            read_cursor = _read_cursor(cursor)
            if read_cursor is None:
                return CreatedPage(detail=f"{LISTING}: not a cursor of this client",
                                   final=True, calls=0)
            offset, anchor_id, anchor_at = read_cursor
            anchor = (anchor_id, anchor_at)
        url = URL(self._base + LIST_PATH, encoded=True).with_query(
            {"limit": str(PAGE_LIMIT), "offset": str(offset)})
        read = await list_page(self, url, LISTING, "generations")
        if isinstance(read, CreatedPage):
            return read
        page, items = read
        entries = tuple(Created(RULES.created_job_id(item), item,
                                parse_time(item.get("created_at"))
                                if isinstance(item, dict) else None)
                        for item in items)
        said_offset = page.get("offset")
        if (isinstance(said_offset, int) and not isinstance(said_offset, bool)
                and said_offset != offset):
            return CreatedPage(entries, detail=f"{LISTING}: asked for offset {offset}, the "
                                               f"page says {said_offset}", final=True)
        more = page.get("has_more")
        fresh = len(entries)  # those after the anchor: none read before
        if anchor is not None:
            at = next((i for i, e in enumerate(entries) if e.job_id == anchor[0]), None)
            if at is None:
                if more is not False and _all_newer(entries, anchor[1]):
                    # pushed down by a page or more: the anchor is on a later page
                    return CreatedPage(entries, next_cursor=_cursor(offset + len(entries),
                                                                    *anchor))
                return CreatedPage(entries, detail=f"{LISTING}: the list moved up between "
                                                   f"pages (a generation deleted while it "
                                                   f"was read?): some may have been skipped",
                                   final=True)
            fresh = len(entries) - at - 1
        if more is False or (more is not True and fresh == 0):
            # the last page (a page without `has_more` is followed until one adds nothing)
            return CreatedPage(entries)
        times = [e.created_at for e in entries if e.created_at is not None]
        if times and min(times) < since:
            return CreatedPage(entries)  # newest first: every later page is older still
        last = next((i for i in range(len(entries) - 1, -1, -1)
                     if entries[i].job_id is not None), None)
        if not last:  # None, or the page's first: the next page would be this one
            return CreatedPage(entries, detail=f"{LISTING}: more pages, but no generation "
                                               f"past this page's first has a usable id to "
                                               f"go on from", final=True)
        found = entries[last]
        assert found.job_id is not None
        # the next page starts at this one's oldest generation (it must find it again)
        return CreatedPage(entries, next_cursor=_cursor(offset + last, found.job_id,
                                                        found.created_at))


def _all_newer(entries: tuple[Created, ...], anchor_at: datetime | None) -> bool:
    """Whether every generation on a non-empty page was made after `anchor_at` (then a page
    that should start at the anchor was pushed down by a page or more, and skipped nothing)."""
    return bool(entries) and anchor_at is not None and all(
        e.created_at is not None and e.created_at > anchor_at for e in entries)


if TYPE_CHECKING:
    def _is_a_client(client: LumaClient) -> Client:
        return client  # mypy checks LumaClient against both protocols

    def _is_a_reconciler(client: LumaClient) -> Reconciler:
        return client
