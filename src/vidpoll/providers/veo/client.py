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

from vidpoll.media import shown_url
from vidpoll.models import HttpAnswer
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.http import JsonApiClient
from vidpoll.providers.veo.rules import RULES, VeoRules

if TYPE_CHECKING:
    from vidpoll.providers.base import Client

DEFAULT_API_VERSION = "v1beta"
"""The API version the Gemini API serves `predictLongRunning` for Veo on (google-genai 2.x's
default; 3.x sends `generate_videos` only to Vertex AI)."""
KEY_HEADER = "x-goog-api-key"
MAX_RETRY_BODY = 64 << 10
_NO_OPTIONS = ProviderOptions()
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,255}")
"""One segment of an operation's name (`models`, `veo-x`, `operations`, its id)."""
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


def operation_path(name: str) -> str | None:
    """An operation's `name` as a path under the API version, each segment checked (letters,
    digits, `.`, `_`, `~`, `-`; never `.` or `..`); None when it is not one."""
    parts = name.split("/")
    if len(parts) < 2 or not all(_SEGMENT.fullmatch(p) for p in parts):
        return None
    return "/".join(parts)


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

    def _retry_after(self, status: int, headers: Mapping[str, str], body: bytes) -> str | None:
        """A `Retry-After` header if one came, else (a 429) the body's `retryDelay`."""
        header = super()._retry_after(status, headers, body)
        if header is not None or status != 429:
            return header
        return retry_delay(body)

    def _operation_url(self, job_id: str) -> URL | None:
        path = operation_path(job_id)
        return None if path is None else URL(f"{self._base}/{self._version}/{path}",
                                             encoded=True)

    @staticmethod
    def _not_an_operation(job_id: str) -> HttpAnswer:
        # in Google's own envelope: a final "no such job" for the row, never sent
        return HttpAnswer(404, json.dumps({"error": {
            "code": 404, "status": "NOT_FOUND",
            "message": "not sent: the job id is not an operation name "
                       "(models/MODEL/operations/ID)"}}).encode(),
                          detail=f"not an operation name: {job_id[:80]!r}")

    def shown_status_url(self, job_id: str) -> str:
        """An operation's URL as logs show it."""
        url = self._operation_url(job_id)
        return shown_url(str(url)) if url is not None else f"{self._base}/{self._version}/?"

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
        url = self._operation_url(job_id)
        if url is None:
            return self._not_an_operation(job_id)
        return await self._call("GET", url, keep_links=True)

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
