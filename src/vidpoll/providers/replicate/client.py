"""The Replicate HTTP client: its paths and request shapes over the shared plumbing
(`vidpoll.providers.http.JsonApiClient`: `Authorization: Bearer <token>`, the token scrubbed
from every body however it is encoded, status bodies' links without their query strings,
every failure an answer, never raised).

Creates go to `POST /v1/predictions` (`--model owner/name:VERSION`) or
`POST /v1/models/{owner}/{name}/predictions` (`--model owner/name`, an official model), with
the input as `submit` gave it; Replicate has no idempotency key, so an unanswered create is
looked up in the account's own list (`list_created`: pages the core walks), never sent again
blindly. A prediction's status answer holds its output (inline results); its files are on
`replicate.delivery`, which wants the token ("You'll need to pass the Authorization header to
request them").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from yarl import URL

from vidpoll.media import shown_url
from vidpoll.models import HttpAnswer
from vidpoll.providers.base import Created, CreatedPage, ProviderOptions
from vidpoll.providers.http import JsonApiClient, job_url, list_page, normal_base
from vidpoll.providers.replicate.rules import RULES, model_problem, split_model

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Reconciler

DEFAULT_BASE_URL = "https://api.replicate.com"
PREDICTIONS_PATH = "/v1/predictions"
"""Create with a version (POST), list (GET, newest first, 100 a page, `next` a full URL)."""
PREDICTION_PATH = "/v1/predictions/{job_id}"
MODEL_PREDICTIONS_PATH = "/v1/models/{owner}/{name}/predictions"
"""Create on an official model (its current version)."""
FILE_HOST = "replicate.delivery"
"""Where output files live (and its subdomains): they want the account's Authorization."""
INVALID_MODEL = "Invalid model"
"""The title of the answer `create_video` gives, unsent, for a model Replicate cannot take."""
COMPLETED_EVENT = "completed"
"""The webhook event of a prediction that ended (`webhook_events_filter`)."""
_NO_OPTIONS = ProviderOptions()
_THROTTLED = re.compile(
    r"(?:resets in|available in)\s*~?\s*(\d{1,6}(?:\.\d{1,3})?)\s*(?:s|secs?|seconds?)\b",
    re.IGNORECASE)
"""The wait in a 429's `detail`: "Your rate limit resets in ~30s." (the rate-limits page
today), "Expected available in 1 second." (as it read before)."""
MAX_THROTTLE_BODY = 64 << 10


def throttle_wait(body: bytes) -> str | None:
    """The seconds a 429 body's `detail` says to wait, as written ("30"); None when it says
    none."""
    if not body or len(body) > MAX_THROTTLE_BODY:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    detail = value.get("detail") if isinstance(value, dict) else None
    found = _THROTTLED.search(detail) if isinstance(detail, str) else None
    return found.group(1) if found else None


def iso_utc(when: datetime, *, round_up: bool = False) -> str:
    """`when` as the list's filters take it (ISO 8601, UTC, whole seconds: `…T12:00:05Z`),
    rounded down, or up with `round_up` (the window only ever widens). Naive means UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    when = when.astimezone(UTC)
    whole = when.replace(microsecond=0)
    if round_up and whole != when:
        whole += timedelta(seconds=1)
    return whole.strftime("%Y-%m-%dT%H:%M:%SZ")


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme.lower(), (url.host or "").lower(), url.port


class ReplicateClient(JsonApiClient):
    """One account's client for Replicate's predictions (`vidpoll.providers.base.Client`,
    and a `Reconciler`: `list_scope`, `list_created`)."""

    rules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, options: ProviderOptions = _NO_OPTIONS) -> None:
        super().__init__(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)
        self._webhook_url = options.webhook_url

    @staticmethod
    def _normal_base(base_url: str) -> str:
        """`https://api.replicate.com` and `https://api.replicate.com/v1` alike: the paths
        carry `/v1` (one trailing `/v1` is dropped from the setting)."""
        base = normal_base(base_url)
        if URL(base).path.rstrip("/").endswith("/v1"):
            base = base[:-len("/v1")]
        return base

    def _retry_after(self, status: int, headers: Mapping[str, str], body: bytes) -> str | None:
        """The `Retry-After` header, else (a 429) the wait its `detail` names."""
        header = super()._retry_after(status, headers, body)
        if header is not None or status != 429:
            return header
        return throttle_wait(body)

    def shown_status_url(self, job_id: str) -> str:
        """A prediction's URL as logs show it: scheme, host, port and path only."""
        return shown_url(str(job_url(self._base, job_id, PREDICTION_PATH)))

    def shown_create_url(self) -> str:
        """The create URL (POST, with a version) as logs show it; an official model's
        creates go to /v1/models/{owner}/{name}/predictions."""
        return shown_url(self._base + PREDICTIONS_PATH)

    def media_headers(self) -> Mapping[str, str]:
        """The token, for output files on the API's origin and on `media_auth_hosts`."""
        return self._auth_headers() if self.key_problem is None else {}

    def media_auth_hosts(self) -> frozenset[str]:
        """Replicate's file host (and its subdomains), over https only."""
        return frozenset({FILE_HOST})

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the prediction. Its links lose their query strings whatever the status (the
        answer is stored as `last_response`); Replicate's file URLs carry none: the
        download sends the token instead."""
        return await self._call("GET", job_url(self._base, job_id, PREDICTION_PATH))

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """The same GET: the result is inline (the worker never calls this for Replicate);
        a 2xx keeps its links whole, as every result read does (the token never)."""
        return await self._call("GET", job_url(self._base, job_id, PREDICTION_PATH),
                                keep_links=True)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST a new prediction of `model` with `payload` as its input, fields unchanged
        (the paid call), and `webhook` with `webhook_events_filter: [completed]` when the
        account names a webhook URL. `idempotency_key` is not sent: Replicate has none.

        A model Replicate cannot take (none, or not `owner/name[:VERSION]`) is not sent: the
        answer is a 422 in Replicate's own problem shape, `{"title": "Invalid model",
        "detail": "not sent: ..."}`, which the core reads as a final refusal (`rejected`). A
        token no header can carry is not sent either: a 401 in Replicate's shape, so the
        account pauses as for a refused token and the intent stays queued (a transport error
        would be an unknown create, looked up for nothing)."""
        if self.key_problem is not None:
            return HttpAnswer(401, json.dumps({
                "title": "Unauthenticated", "status": 401,
                "detail": f"not sent: the API token cannot go into an HTTP header: "
                          f"{self.key_problem}"}).encode(), detail="not sent: unusable token")
        problem = ("no --model (a Replicate create names owner/name or owner/name:VERSION)"
                   if model is None else model_problem(model))
        parts = split_model(model) if model is not None and problem is None else None
        if parts is None:
            return HttpAnswer(422, json.dumps({
                "title": INVALID_MODEL, "status": 422,
                "detail": f"not sent: {problem or 'unusable model'}"}).encode())
        owner_name, version = parts
        body: dict[str, Any] = {"input": payload}
        if version is not None:
            body = {"version": version, **body}
            url = self._base + PREDICTIONS_PATH
        else:
            owner, name = owner_name.split("/")
            url = self._base + MODEL_PREDICTIONS_PATH.format(owner=owner, name=name)
        if self._webhook_url:
            body["webhook"] = self._webhook_url
            body["webhook_events_filter"] = [COMPLETED_EVENT]
        # a 2xx is kept whole but for the token: its id is read as sent
        return await self._call("POST", URL(url, encoded=True), data=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"}, keep_links=True)

    def list_scope(self, model: str | None) -> str:
        """One listing serves every model: Replicate's list holds all of the account's."""
        return ""

    async def list_created(self, model: str | None, since: datetime, until: datetime,
                           cursor: str | None) -> CreatedPage:
        """One page of the account's predictions created between `since` and `until`
        (`GET /v1/predictions?created_after=…&created_before=…`, newest first; `cursor`: the
        page's `next` URL), each with its id and creation time; `rules.match_created` compares
        each with an intent.

        A `next` page is followed only on the API's own origin (scheme, host and port): the
        token goes nowhere else; another origin or a page read already end the walk
        (`final`). A failed call or an answer that is not `{"results": [...]}` is a failed
        page (tried again by the core). Never raises for an HTTP failure."""
        first = URL(self._base + PREDICTIONS_PATH, encoded=True).with_query(
            {"created_after": iso_utc(since), "created_before": iso_utc(until, round_up=True)})
        url = first
        if cursor is not None:
            try:
                url = URL(cursor, encoded=True)
            except (ValueError, TypeError):
                return CreatedPage(detail="listing predictions: its 'next' is not a URL",
                                   final=True)
        read = await list_page(self, url, "listing predictions", "results")
        if isinstance(read, CreatedPage):
            return read
        page, results = read
        entries = tuple(Created(RULES.created_job_id(entry), entry, _created_at(entry))
                        for entry in results)
        following = page.get("next")
        if following is None:
            return CreatedPage(entries)
        if not isinstance(following, str) or not following.strip():
            return CreatedPage(entries, detail="listing predictions: its 'next' is not a URL",
                               final=True)
        try:
            found = URL(following.strip(), encoded=True)
            nxt = found if found.is_absolute() else url.join(found)
        except (ValueError, TypeError):
            return CreatedPage(entries, detail="listing predictions: its 'next' is not a URL",
                               final=True)
        if _origin(nxt) != _origin(first) or nxt.user is not None or nxt.password is not None:
            return CreatedPage(entries, detail=f"listing predictions: the next page is on "
                                               f"another origin ({shown_url(str(nxt))}); not "
                                               f"followed with the token", final=True)
        if str(nxt) == str(url):
            return CreatedPage(entries, detail="listing predictions: the next page is one "
                                               "already read", final=True)
        return CreatedPage(entries, next_cursor=str(nxt))


def _created_at(entry: Any) -> datetime | None:
    """A prediction's `created_at` (ISO 8601), or None when it has none that parses."""
    value = entry.get("created_at") if isinstance(entry, dict) else None
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


if TYPE_CHECKING:
    def _is_a_client(client: ReplicateClient) -> Client:
        return client  # mypy checks ReplicateClient against both protocols

    def _is_a_reconciler(client: ReplicateClient) -> Reconciler:
        return client
