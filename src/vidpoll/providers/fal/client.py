"""The fal HTTP client: its queue's paths and request shapes over the shared plumbing
(`vidpoll.providers.http.JsonApiClient`: the key scrubbed from every body however it is
encoded, status bodies' links without their query strings, every failure an answer, never
raised), with fal's `Authorization: Key <key>`.

Creates go to `POST {base_url}/{endpoint_id}` with the input as `submit` gave it (and
`?fal_webhook=` when the account names a webhook URL); fal keeps the payloads (no
`X-Fal-Store-IO: 0`: the request history's `json_input` is what reconciles an unanswered
create). The answer's `status_url` and `response_url` are kept with the job (its handle,
`rules.created_handle`) and every later read goes to them, never to a URL rebuilt from the
endpoint (fal: "do not build these URLs yourself"); but the key goes only to the account's
base URL's origin (scheme, host, port) and its `platform_url`'s: a handle URL anywhere else is
refused unsent.

Two places build queue URLs, because nothing else gives them: a job adopted from the request
history (its items carry `endpoint_id`, no URLs) gets the URLs fal documents,
`{base_url}/{owner}/{app}/requests/{request_id}[/status]`; and a read with no handle at all (a
job tracked by hand, the core's probe of a paused account) goes to the same shape under
NO_HANDLE_APP, where fal answers its own "not found".

The request history (`GET {platform_url}/v1/models/requests/by-endpoint`, `expand=payloads`)
is what `list_created` pages through for the core's reconciliation (`vidpoll.reconcile`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from yarl import URL

from vidpoll.media import job_path_segment, shown_url
from vidpoll.models import ErrorClass, HttpAnswer
from vidpoll.providers.base import Created, CreatedPage, ProviderOptions
from vidpoll.providers.fal.rules import RULES, model_problem, owner_app
from vidpoll.providers.http import JsonApiClient, list_page, normal_base

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Reconciler

DEFAULT_BASE_URL = "https://queue.fal.run"
DEFAULT_PLATFORM_URL = "https://api.fal.ai"
START_TIMEOUT_HEADER = "X-Fal-Request-Timeout"
"""fal's server-side start deadline: "a request that has not started by then gets 504 and is
not processed" (PROVIDERS.md section 5)."""
START_TIMEOUT_MARGIN_S = 10.0
"""Added to the start deadline before a create not in the history counts as never made (the
two clocks may differ a little)."""
HISTORY_PATH = "/v1/models/requests/by-endpoint"
"""The platform API's request history of one endpoint (cursor pages, newest first)."""
PAGE_LIMIT = 100
"""The history's largest page."""
REQUEST_PATH = "/{app}/requests/{job_id}"
"""A request's response URL, as fal documents it (owner/app only); `/status` and `/cancel`
follow it. Built only for a job without the URLs of its create answer (see the module)."""
NO_HANDLE_APP = "fal-ai/vidpoll-no-handle"
"""The owner/app of a read of a job that has no handle: no request of it exists, so fal's own
404 answers (a probe of a paused account wants exactly that)."""
INVALID_MODEL = "invalid_model"
"""The `error_type` of the answer `create_video` gives, unsent, for a model fal cannot take."""
NOT_SENT = "not sent"
MAX_CURSOR = 1000
_NO_OPTIONS = ProviderOptions()
_EARLIEST = datetime.min.replace(tzinfo=UTC)


def iso_utc(when: datetime, *, round_up: bool = False) -> str:
    """`when` as the history's `start`/`end` take it (ISO 8601, UTC, whole seconds), rounded
    down, or up with `round_up` (the window only ever widens). Naive means UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    when = when.astimezone(UTC)
    whole = when.replace(microsecond=0)
    if round_up and whole != when:
        whole += timedelta(seconds=1)
    return whole.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 time of the history (`sent_at`: `...Z` or an offset; naive means UTC), or
    None when it has none that parses."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme.lower(), (url.host or "").lower(), url.port


class FalClient(JsonApiClient):
    """One account's client for fal's queue (`vidpoll.providers.base.Client`) and its request
    history (a `Reconciler`: `list_scope`, `list_created`)."""

    rules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, options: ProviderOptions = _NO_OPTIONS) -> None:
        super().__init__(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)
        self._webhook_url = options.webhook_url
        platform = (options.extra or {}).get("platform_url") or DEFAULT_PLATFORM_URL
        self._platform = normal_base(platform)
        self._base_origin = _origin(URL(self._base))
        self._platform_origin = _origin(URL(self._platform))
        timeout = (options.extra or {}).get("start_timeout_s")
        self._start_timeout_s = float(timeout) if timeout else None
        """`X-Fal-Request-Timeout` on every create (fal drops a request not started by then,
        unprocessed), and what lets the history prove a create absent in a quiet account."""

    def _auth_headers(self) -> dict[str, str]:
        """fal's `Authorization: Key <key_id>:<key_secret>` (sent only to the base URL's and
        the platform URL's origins)."""
        return {"Authorization": f"Key {self._api_key}"}

    # ---- URLs ----

    def _request_url(self, app: str, job_id: str, suffix: str = "") -> URL:
        return URL(self._base + REQUEST_PATH.format(app=app, job_id=job_path_segment(job_id))
                   + suffix, encoded=True)

    def handle_for(self, endpoint_id: Any, job_id: str) -> dict[str, Any] | None:
        """The URLs fal documents for a request of `endpoint_id` (owner/app only), for a job
        adopted from the history, whose items carry no URLs; None for an unusable id."""
        app = owner_app(endpoint_id) if isinstance(endpoint_id, str) else None
        if app is None:
            return None
        return {"status_url": str(self._request_url(app, job_id, "/status")),
                "response_url": str(self._request_url(app, job_id)),
                "cancel_url": str(self._request_url(app, job_id, "/cancel"))}

    def _handle_url(self, job_id: str, handle: Mapping[str, Any] | None, name: str,
                    suffix: str) -> URL | HttpAnswer:
        """The URL a read of `job_id` goes to: its handle's `name`, checked (absolute, http(s),
        the base URL's origin, no credentials), or an answer saying why nothing was sent."""
        if handle is None:
            return self._request_url(NO_HANDLE_APP, job_id, suffix)
        value = handle.get(name) if isinstance(handle, Mapping) else None
        if not isinstance(value, str) or not value.strip():
            return _unsent(f"the job's handle has no {name}")
        try:
            url = URL(value.strip(), encoded=True)
        except (ValueError, TypeError):
            return _unsent(f"the job's {name} is not a URL")
        if not url.is_absolute() or url.scheme.lower() not in ("http", "https"):
            return _unsent(f"the job's {name} is not an http(s) URL")
        if (_origin(url) != self._base_origin or url.user is not None
                or url.password is not None):
            return _unsent(f"the job's {name} ({shown_url(str(url))}) is not on the account's "
                           f"base URL's origin ({shown_url(self._base)}); the key goes nowhere "
                           f"else")
        return url

    def shown_status_url(self, job_id: str) -> str:
        """A read's URL as logs show it: a job's own `status_url` is on the base URL's origin;
        this is the one a read without a handle (a probe) goes to."""
        return shown_url(str(self._request_url(NO_HANDLE_APP, job_id, "/status")))

    def shown_create_url(self) -> str:
        """The create URL as logs show it (the endpoint id follows the base URL)."""
        return shown_url(self._base) + "/{endpoint_id}"

    def media_headers(self) -> Mapping[str, str]:
        """None: fal's CDN files are public, and the key goes only to fal's API."""
        return {}

    def media_auth_hosts(self) -> frozenset[str]:
        return frozenset()

    # ---- calls ----

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the request's `status_url` (202 while queued or running, 200 once completed:
        both 2xx). Its links lose their query strings (the answer is stored)."""
        url = self._handle_url(job_id, handle, "status_url", "/status")
        if isinstance(url, HttpAnswer):
            return url
        return await self._call("GET", url)

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the request's `response_url`: the model's output (a 2xx keeps its links whole:
        the download needs them), or 400 "Request is still in progress"."""
        url = self._handle_url(job_id, handle, "response_url", "")
        if isinstance(url, HttpAnswer):
            return url
        return await self._call("GET", url, keep_links=True)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST a request to the endpoint `model` with `payload` as its body, unchanged (the
        paid call), with `?fal_webhook=` when the account names a webhook URL.
        `idempotency_key` is not sent: fal has none.

        A model fal cannot take (none, or not an endpoint id) is not sent: the answer is a 422
        in fal's own shape, `{"detail": "not sent: ...", "error_type": "invalid_model"}`,
        which the core reads as a final refusal (`rejected`). A key no header can carry is
        not sent either: a 401 in fal's shape, so the account pauses as for a refused key and
        the intent stays queued (a transport error would be an unknown create)."""
        if self.key_problem is not None:
            return HttpAnswer(401, json.dumps({
                "detail": f"not sent: the API key cannot go into an HTTP header: "
                          f"{self.key_problem}"}).encode(), detail="not sent: unusable key")
        problem = ("no --model (a fal create names its endpoint id, like "
                   "fal-ai/kling-video/v2/master/text-to-video)"
                   if model is None else model_problem(model))
        if model is None or problem is not None:
            return HttpAnswer(422, json.dumps({"detail": f"{NOT_SENT}: {problem}",
                                               "error_type": INVALID_MODEL}).encode())
        url = URL(f"{self._base}/{model}", encoded=True)
        if self._webhook_url:
            url = url.with_query({"fal_webhook": self._webhook_url})
        headers = {"Content-Type": "application/json"}
        if self._start_timeout_s is not None:
            headers[START_TIMEOUT_HEADER] = f"{self._start_timeout_s:g}"
        # a 2xx is kept whole but for the key: its id and URLs are read as sent
        return await self._call("POST", url, data=json.dumps(payload).encode(),
                                headers=headers, keep_links=True)

    # ---- the request history (reconciliation) ----

    def list_scope(self, model: str | None) -> str:
        """One listing per endpoint: fal's history is read by `endpoint_id`."""
        return model or ""

    async def list_created(self, model: str | None, since: datetime, until: datetime,
                           cursor: str | None) -> CreatedPage:
        """One page of the endpoint's requests sent between `since` and `until`
        (`GET {platform_url}/v1/models/requests/by-endpoint?endpoint_id=…&start=…&end=…
        &limit=100&expand=payloads[&cursor=…]`), each with its id, its `sent_at` and the URLs
        fal documents for it (adopted jobs read them); `rules.match_created` compares each
        with an intent.

        fal lists a request once it has started (PROVIDERS.md "Updates": whether a queued one
        is listed is unconfirmed), and its queue starts requests in order: `listed_through` is
        the newest `sent_at` of a started request on the page (the earliest time there is when
        none started: nothing is proven by such a page). A failed call or an answer that is
        not `{"items": [...]}` is a failed page (tried again by the core). Never raises for an
        HTTP failure."""
        if model is None or model_problem(model) is not None:
            return CreatedPage(detail="listing fal requests: no endpoint id to list", final=True,
                               calls=0)
        query = {"endpoint_id": model, "start": iso_utc(since),
                 "end": iso_utc(until, round_up=True), "limit": str(PAGE_LIMIT),
                 "expand": "payloads"}
        if cursor is not None:
            query["cursor"] = cursor
        url = URL(self._platform + HISTORY_PATH, encoded=True).with_query(query)
        read = await list_page(self, url, "listing fal requests", "items")
        if isinstance(read, CreatedPage):
            return read
        page, items = read
        entries = tuple(self._created(item) for item in items)
        through = max((e.created_at for e, item in zip(entries, items, strict=True)
                       if e.created_at is not None and isinstance(item, dict)
                       and item.get("started_at") is not None), default=_EARLIEST)
        if self._start_timeout_s is not None:
            # every create carries X-Fal-Request-Timeout: one sent before this has started
            # (and is listed) or was dropped unprocessed, whatever else the queue holds
            through = max(through, datetime.now(UTC) - timedelta(
                seconds=self._start_timeout_s + START_TIMEOUT_MARGIN_S))
        following = page.get("next_cursor")
        more = page.get("has_more")
        if more is False or (more is None and following is None):
            return CreatedPage(entries, listed_through=through)
        if not isinstance(following, str) or not following.strip():
            return CreatedPage(entries, detail="listing fal requests: more pages, but no "
                                               "next_cursor", final=True,
                               listed_through=through)
        if len(following) > MAX_CURSOR or "://" in following:
            # an opaque cursor (base64 of a page number); a URL is never followed with the key
            return CreatedPage(entries, detail="listing fal requests: its next_cursor is not a "
                                               "cursor", final=True, listed_through=through)
        if following == cursor:
            return CreatedPage(entries, detail="listing fal requests: the next page is the one "
                                               "just read", final=True, listed_through=through)
        return CreatedPage(entries, next_cursor=following, listed_through=through)

    def _created(self, item: Any) -> Created:
        job_id = RULES.created_job_id(item) if isinstance(item, dict) else None
        at = parse_time(item.get("sent_at")) if isinstance(item, dict) else None
        handle = (self.handle_for(item.get("endpoint_id"), job_id)
                  if isinstance(item, dict) and job_id is not None else None)
        return Created(job_id, item, at, handle)


def _unsent(why: str) -> HttpAnswer:
    return HttpAnswer(None, transport_error=ErrorClass.CLIENT_ERROR, detail=f"{NOT_SENT}: {why}")


if TYPE_CHECKING:
    def _is_a_client(client: FalClient) -> Client:
        return client  # mypy checks FalClient against both protocols

    def _is_a_reconciler(client: FalClient) -> Reconciler:
        return client
