"""The Sume HTTP client: Sume's paths and request shapes over the shared plumbing
(`vidpoll.providers.http.JsonApiClient`: the key scrubbed from every body, links' query
strings from status bodies, every failure an answer).

It never interprets an answer beyond transport (that is `rules`, applied by vidpoll.policy's
generic rules) and never logs headers, so the API key cannot leak through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from yarl import URL

from vidpoll.media import job_path_segment as job_path_segment
from vidpoll.media import shown_url
from vidpoll.models import HttpAnswer
from vidpoll.providers.http import MAX_BODY_BYTES as MAX_BODY_BYTES
from vidpoll.providers.http import REDACTED as REDACTED
from vidpoll.providers.http import SCRUB_INLINE_BYTES as SCRUB_INLINE_BYTES
from vidpoll.providers.http import JsonApiClient, job_url, normal_base, scrub_body
from vidpoll.providers.http import key_problem as key_problem
from vidpoll.providers.http import secret_pattern as secret_pattern
from vidpoll.providers.sume.rules import RULES

DEFAULT_BASE_URL = "https://api.sume.com"
DEFAULT_STATUS_PATH = "/v1/jobs/{job_id}/status"
DEFAULT_CREATE_PATH = "/v1/videos"
DEFAULT_RESULT_PATH = "/v1/jobs/{job_id}/result"

_scrub_body = scrub_body
"""The scrub under its earlier name here (tests/unit/test_scrub.py and others import it)."""


def status_url(base_url: str, job_id: str, path: str = DEFAULT_STATUS_PATH) -> URL:
    """The status URL of one job, already encoded, so aiohttp sends it byte for byte."""
    return job_url(normal_base(base_url), job_id, path)


class SumeClient(JsonApiClient):
    """Async client for Sume's job endpoints with a short total timeout per call
    (`vidpoll.providers.base.Client`)."""

    rules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, status_path: str = DEFAULT_STATUS_PATH,
                 create_path: str = DEFAULT_CREATE_PATH) -> None:
        super().__init__(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)
        self._status_path = status_path
        self._create_path = create_path

    def shown_status_url(self, job_id: str) -> str:
        """The status URL of `job_id` as logs and `vidpoll doctor` show it: scheme, host, port
        and path only (never credentials, a query string or the key, which is a header)."""
        return shown_url(str(job_url(self._base, job_id, self._status_path)))

    def media_headers(self) -> Mapping[str, str]:
        """Sume's media links are signed: a download carries no header of the account."""
        return {}

    def media_auth_hosts(self) -> frozenset[str]:
        """No file host gets the account's headers (its links are signed)."""
        return frozenset()

    def shown_create_url(self) -> str:
        """The create URL (POST) as logs show it: scheme, host, port and path only."""
        return shown_url(self._base + self._create_path)

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the job's status; every failure comes back as an HttpAnswer, never raised.
        Its URLs lose their query strings whatever the status: the answer is stored
        (`last_response`) and archived, and nothing downloads from a status answer."""
        return await self._call("GET", job_url(self._base, job_id, self._status_path))

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET a completed job's result (409 job_not_completed until it is ready)."""
        # its signed links are the download's: a 2xx keeps them (the key never)
        return await self._call("GET", job_url(self._base, job_id, DEFAULT_RESULT_PATH),
                                keep_links=True)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST a new render with our own Idempotency-Key (the paid call). Sume's creates
        name no model (`rules.takes_model`): the body says everything."""
        url = URL(self._base + self._create_path, encoded=True)
        # a 2xx is kept whole but for the key: its job id is read as sent, whatever it holds
        return await self._call("POST", url, data=json.dumps(payload).encode(),
                                headers={"Idempotency-Key": idempotency_key,
                                         "Content-Type": "application/json"},
                                keep_links=True)
