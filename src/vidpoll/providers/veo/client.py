"""The Veo client on the Gemini API: its paths and request shapes over the shared plumbing
(`vidpoll.providers.http.JsonApiClient`: the key scrubbed from every body however it is
encoded, every failure an answer, never raised).

A create is `POST {base}/{version}/models/{model}:predictLongRunning` with the request body as
`submit` gave it (`{"instances": [...], "parameters": {...}}`) and the key in
`x-goog-api-key`; its answer is an operation whose `name` is the job. A read is
`GET {base}/{version}/{name}`. The finished operation holds the videos' file URIs, on the
API's own host, which want the key ("Download needs the API key": google-genai's
`files.download`); they are kept whole (`?alt=media` is what makes a file URI answer the
bytes, and they carry no signature).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from yarl import URL

from vidpoll.media import job_path_segment, shown_url
from vidpoll.models import HttpAnswer
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.http import JsonApiClient
from vidpoll.providers.veo.rules import RULES, VeoRules, operation_path

if TYPE_CHECKING:
    from vidpoll.providers.base import Client

DEFAULT_API_VERSION = "v1beta"
"""The API version the Gemini API serves `predictLongRunning` for Veo on (google-genai 2.x's
default; 3.x sends `generate_videos` only to Vertex AI)."""
KEY_HEADER = "x-goog-api-key"
MAX_RETRY_BODY = 64 << 10
MAX_REFUSAL_TEXT = 400
_NO_OPTIONS = ProviderOptions()
_DELAY = re.compile(r"^\s*(\d{1,6}(?:\.\d{1,9})?)s\s*$")


def retry_delay(body: bytes) -> str | None:
    """The seconds a Google 429's `google.rpc.RetryInfo` says to wait (`"retryDelay": "30s"`),
    as written ("30"); None when it names none."""
    if not body or len(body) > MAX_RETRY_BODY:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    error = value.get("error") if isinstance(value, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for item in details if isinstance(details, list) else ():
        delay = item.get("retryDelay") if isinstance(item, dict) else None
        found = _DELAY.match(delay) if isinstance(delay, str) else None
        if found:
            return found.group(1)
    return None


def refused_unsent(why: str) -> HttpAnswer:
    """A call not sent because the account's credential cannot be used: a 401 in Google's
    envelope, so the core pauses the account as for a refused key (reads stay due, a create
    stays queued: never an unknown outcome, which a transport error would be). `why` is its
    `code` (and no `status`), which is what the core's log line of a refused key shows
    (`google_error` takes a text code as the word); it never holds a secret."""
    text = f"not sent: {why}"[:MAX_REFUSAL_TEXT]
    return HttpAnswer(401, json.dumps({"error": {"code": text, "message": text}}).encode(),
                      detail=text)


NO_SUCH_MODEL = "vidpoll-no-such-model"
"""The model an id that is no operation name is read under (Google answers its own 404)."""


class VeoClient(JsonApiClient):
    """One account's client for Veo on the Gemini API (`vidpoll.providers.base.Client`)."""

    rules: VeoRules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, options: ProviderOptions = _NO_OPTIONS) -> None:
        super().__init__(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)
        self._version = options.extra.get("api_version") or DEFAULT_API_VERSION

    def _auth_headers(self) -> dict[str, str]:
        """Google's API key header (sent only to the base URL's origin)."""
        return {KEY_HEADER: self._api_key}

    async def _call(self, method: str, url: URL, *, keep_links: bool = False,
                    **kwargs: Any) -> HttpAnswer:
        """JsonApiClient's, but a key no header can carry is a refused key (401), not a
        transport error: an unsent create must never be taken for an unknown one."""
        if self.key_problem is not None:
            return refused_unsent(f"the API key cannot go into an HTTP header: "
                                  f"{self.key_problem}")
        return await super()._call(method, url, keep_links=keep_links, **kwargs)

    def _retry_after(self, status: int, headers: Mapping[str, str], body: bytes) -> str | None:
        """A `Retry-After` header if one came, else (a 429) the body's `retryDelay`."""
        header = super()._retry_after(status, headers, body)
        if header is not None or status != 429:
            return header
        return retry_delay(body)

    def _operation_url(self, job_id: str) -> URL:
        """The operation's URL; an id that is no operation name (a job added by hand, the
        core's probe of a paused account) as one encoded segment under NO_SUCH_MODEL: a real
        request that Google answers with its own 404, which proves the route (never a
        made-up answer), and that no id can turn into another path."""
        path = operation_path(job_id) or (
            f"models/{NO_SUCH_MODEL}/operations/{job_path_segment(job_id)}")
        return URL(f"{self._base}/{self._version}/{path}", encoded=True)

    def shown_status_url(self, job_id: str) -> str:
        """An operation's URL as logs show it."""
        return shown_url(str(self._operation_url(job_id)))

    def shown_create_url(self) -> str:
        return shown_url(f"{self._base}/{self._version}/models/MODEL:predictLongRunning")

    def media_headers(self) -> Mapping[str, str]:
        """The key: the videos' file URIs are on the API's own origin and want it."""
        return self._auth_headers() if self.key_problem is None else {}

    def media_auth_hosts(self) -> frozenset[str]:
        return frozenset()  # the files are on the API's own origin: nowhere else gets the key

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the operation. Its links are kept whole (its file URIs need `?alt=media` and
        carry no signature); the key is scrubbed as from every body."""
        return await self._call("GET", self._operation_url(job_id), keep_links=True)

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """The same GET (the result is inline; the worker never calls this for Veo)."""
        return await self.read_status(job_id, handle)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST `predictLongRunning` for `model` with `payload` as the request body, fields
        unchanged (the paid call). `idempotency_key` is not sent: Google has none. A model
        that cannot be one is answered unsent, 400 INVALID_ARGUMENT in Google's envelope (a
        final refusal: `rejected`)."""
        problem = ("no --model (a Veo create names the model id)" if model is None
                   else self.rules.model_problem(model))
        if problem is not None or model is None:
            return HttpAnswer(400, json.dumps({"error": {
                "code": 400, "status": "INVALID_ARGUMENT",
                "message": f"not sent: {problem}"}}).encode())
        url = URL(f"{self._base}/{self._version}/models/{model}:predictLongRunning",
                  encoded=True)
        return await self._call("POST", url, data=json.dumps(payload).encode(),
                                headers={"Content-Type": "application/json"}, keep_links=True)


if TYPE_CHECKING:
    def _is_a_client(client: VeoClient) -> Client:
        return client  # mypy checks VeoClient against the protocol
