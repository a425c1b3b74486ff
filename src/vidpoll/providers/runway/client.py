"""The Runway client: its paths and request shapes over the shared plumbing
(`vidpoll.providers.http.JsonApiClient`: the key scrubbed from every body however it is
encoded, every failure an answer, never raised, status bodies' links without their query
strings).

A create is `POST {base}/v1/{endpoint}` (`submit --model`: `image_to_video`,
`generate/video`, ...) with the request body as `submit` gave it, Runway's own `model` field
included, `Authorization: Bearer <key>` and `X-Runway-Version` (the account's `api_version`);
its answer's `id` is the job. A read is `GET {base}/v1/tasks/{id}`. A SUCCEEDED task's
`output` lists CloudFront URLs signed with a `_jwt` query, valid for 24-48 hours: the stored
task keeps them without their query string, and the downloader asks `fresh_media` for signed
ones just before it fetches (a task read again gives fresh ones). The CDN never gets the key.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from yarl import URL

from vidpoll.media import shown_url
from vidpoll.models import HttpAnswer
from vidpoll.policy import parsed_json_object
from vidpoll.providers.base import Pending, ProviderOptions, Terminal
from vidpoll.providers.http import JsonApiClient, job_url, normal_base, scrub_body
from vidpoll.providers.runway.rules import RULES, RunwayRules, outputs

if TYPE_CHECKING:
    from vidpoll.providers.base import Client

DEFAULT_API_VERSION = "2024-11-06"
"""The `X-Runway-Version` runwayml 5.24 pins (Runway requires the header)."""
VERSION_HEADER = "X-Runway-Version"
TASK_PATH = "/v1/tasks/{job_id}"
MAX_REFUSAL_TEXT = 400
_NO_OPTIONS = ProviderOptions()
_VERSION = re.compile(r"[A-Za-z0-9._-]{1,64}")


def refused_unsent(status: int, why: str) -> HttpAnswer:
    """A call not sent, answered in Runway's envelope (`{"error": "not sent: ..."}`): 401
    for a key no header can carry (the core pauses the account, as for a refused key: a read
    stays due, a create stays queued, never an unknown outcome, which a transport error would
    be), 400 for a request that can never be sent (a create then is rejected, as Runway
    would). `why` never holds a secret."""
    text = f"not sent: {why}"[:MAX_REFUSAL_TEXT]
    return HttpAnswer(status, json.dumps({"error": text}).encode(), detail=text)


class RunwayClient(JsonApiClient):
    """One account's client for Runway's tasks (`vidpoll.providers.base.Client`)."""

    rules: RunwayRules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, options: ProviderOptions = _NO_OPTIONS) -> None:
        super().__init__(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)
        self._version = options.extra.get("api_version") or DEFAULT_API_VERSION
        self._version_problem = None if _VERSION.fullmatch(self._version) else (
            f"the api_version cannot be sent as {VERSION_HEADER} (letters, digits, '.', '_' "
            f"and '-', like {DEFAULT_API_VERSION})")

    @staticmethod
    def _normal_base(base_url: str) -> str:
        """`https://api.dev.runwayml.com` and `.../v1` alike: the paths carry `/v1` (one
        trailing `/v1` is dropped from the setting)."""
        base = normal_base(base_url)
        if URL(base).path.rstrip("/").endswith("/v1"):
            base = base[:-len("/v1")]
        return base

    def _auth_headers(self) -> dict[str, str]:
        """The key as a Bearer token, and the API version Runway requires on every call
        (both only ever to the base URL's origin)."""
        headers = {"Authorization": f"Bearer {self._api_key}"}
        if self._version_problem is None:
            headers[VERSION_HEADER] = self._version
        return headers

    async def _call(self, method: str, url: URL, *, keep_links: bool = False,
                    **kwargs: Any) -> HttpAnswer:
        """JsonApiClient's, but a key no header can carry is a refused key (401), and an
        API version none can a request Runway would refuse (400): never a transport error,
        so an unsent create is never taken for an unknown one."""
        if self.key_problem is not None:
            return refused_unsent(401, f"the API key cannot go into an HTTP header: "
                                       f"{self.key_problem}")
        if self._version_problem is not None:
            return refused_unsent(400, self._version_problem)
        return await super()._call(method, url, keep_links=keep_links, **kwargs)

    def _task_url(self, job_id: str) -> URL:
        """The task's URL, its id one percent-encoded path segment."""
        return job_url(self._base, job_id, TASK_PATH)

    def shown_status_url(self, job_id: str) -> str:
        """A task's URL as logs show it."""
        return shown_url(str(self._task_url(job_id)))

    def shown_create_url(self) -> str:
        return shown_url(f"{self._base}/v1/ENDPOINT")

    def media_headers(self) -> Mapping[str, str]:
        return {}  # signed CDN URLs: the key never leaves for the CDN

    def media_auth_hosts(self) -> frozenset[str]:
        return frozenset()

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the task. Its `output` URLs come back without their signed query strings (as
        every status body's links): what is stored never holds a `_jwt`."""
        return await self._call("GET", self._task_url(job_id))

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """The same GET (the result is inline; the worker never calls this for Runway)."""
        return await self.read_status(job_id, handle)

    async def fresh_media(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> list[str] | HttpAnswer:
        """The task read again now: its `output` URLs with their signed query strings (for
        the download only: never stored, never logged), in `media_urls` order; or the answer
        that holds none (a failed read, a 404 of a deleted task, a task not SUCCEEDED), its
        links stripped of their query strings as a status body's are."""
        answer = await self._call("GET", self._task_url(job_id), keep_links=True)
        if (answer.transport_error is not None or answer.status is None
                or not 200 <= answer.status < 300):
            return answer  # (links of a non-2xx body are stripped already)
        body = parsed_json_object(answer.body)
        view = self.rules.read_status(body) if body is not None else None
        urls = outputs(body) if (isinstance(view, Terminal)
                                 and view.outcome == "succeeded") else []
        if urls:
            return urls
        said = (f"the task ended {view.word}, with no output" if isinstance(view, Terminal)
                else f"the task has not ended ({view.word})" if isinstance(view, Pending)
                else "the answer is not a task")
        return dataclasses.replace(answer, body=scrub_body(answer.body, b"", answer.status),
                                   detail=said)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST the endpoint `model` names with `payload` as the body, fields unchanged (the
        paid call). `idempotency_key` is not sent: Runway has none. No model, or one that
        cannot be an endpoint, is answered unsent, 400 in Runway's envelope (a final refusal:
        `rejected`)."""
        problem = ("no --model (a Runway create names its endpoint, like image_to_video)"
                   if model is None else self.rules.model_problem(model))
        if problem is not None or model is None:
            return refused_unsent(400, problem or "no --model")
        url = URL(f"{self._base}/v1/{model}", encoded=True)
        return await self._call("POST", url, data=json.dumps(payload).encode(),
                                headers={"Content-Type": "application/json"}, keep_links=True)


if TYPE_CHECKING:
    def _is_a_client(client: RunwayClient) -> Client:
        return client  # mypy checks RunwayClient against the protocol
