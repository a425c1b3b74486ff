"""The Sume HTTP client: the only module that talks HTTP to the provider.

It never interprets an answer beyond transport (that is vidpoll.policy's job) and never logs
headers, so the API key cannot leak through it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import TracebackType
from typing import Any

import aiohttp
from yarl import URL

from vidpoll.media import job_path_segment, redact_urls, shown_url
from vidpoll.models import ErrorClass, HttpAnswer

DEFAULT_BASE_URL = "https://api.sume.com"
DEFAULT_STATUS_PATH = "/v1/jobs/{job_id}/status"
DEFAULT_CREATE_PATH = "/v1/videos"
DEFAULT_RESULT_PATH = "/v1/jobs/{job_id}/result"
MAX_BODY_BYTES = 1 << 20


def status_url(base_url: str, job_id: str, path: str = DEFAULT_STATUS_PATH) -> URL:
    """The status URL of one job, already encoded, so aiohttp sends it byte for byte."""
    return _job_url(_normal_base(base_url), job_id, path)


def key_problem(api_key: str) -> str | None:
    """Why `api_key` cannot go into an HTTP header (a control character, which aiohttp
    refuses to write), else None. Never quotes the key."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in api_key):
        return "it holds a control character (a pasted newline or escape?)"
    return None


def _normal_base(base_url: str) -> str:
    return str(URL(base_url)).rstrip("/")


def _job_url(base: str, job_id: str, path: str) -> URL:
    return URL(base + path.replace("{job_id}", job_path_segment(job_id)), encoded=True)


class SumeClient:
    """Async client for Sume's job endpoints with a short total timeout per call."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, status_path: str = DEFAULT_STATUS_PATH,
                 create_path: str = DEFAULT_CREATE_PATH) -> None:
        self.base_url = base_url
        self._base = _normal_base(base_url)  # parsed once: this runs on every read
        self._api_key = api_key
        self.key_problem = key_problem(api_key)
        """Why the key cannot be sent (then every call answers so without sending); None."""
        self._key_bytes = api_key.encode() if api_key else b""
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_connections = max_connections
        self._status_path = status_path
        self._create_path = create_path
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"SumeClient(base_url={self.base_url!r}, api_key=<redacted>)"

    async def __aenter__(self) -> SumeClient:
        connector = aiohttp.TCPConnector(limit=self._max_connections,
                                         limit_per_host=self._max_connections)
        headers = {"Accept": "application/json", "User-Agent": "vidpoll"}
        if self.key_problem is None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, raise_for_status=False,
            headers=headers)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def shown_status_url(self, job_id: str) -> str:
        """The status URL of `job_id` as logs and `vidpoll doctor` show it: scheme, host, port
        and path only (never credentials, a query string or the key, which is a header)."""
        return shown_url(str(_job_url(self._base, job_id, self._status_path)))

    def shown_create_url(self) -> str:
        """The create URL (POST) as logs show it: scheme, host, port and path only."""
        return shown_url(self._base + self._create_path)

    async def read_status(self, job_id: str) -> HttpAnswer:
        """GET the job's status; every failure comes back as an HttpAnswer, never raised."""
        return await self._call("GET", _job_url(self._base, job_id, self._status_path))

    async def read_result(self, job_id: str) -> HttpAnswer:
        """GET a completed job's result (409 job_not_completed until it is ready)."""
        return await self._call("GET", _job_url(self._base, job_id, DEFAULT_RESULT_PATH))

    async def create_video(self, payload: dict[str, Any], idempotency_key: str) -> HttpAnswer:
        """POST a new render with our own Idempotency-Key (the paid call)."""
        url = URL(self._base + self._create_path, encoded=True)
        return await self._call("POST", url, data=json.dumps(payload).encode(),
                                headers={"Idempotency-Key": idempotency_key,
                                         "Content-Type": "application/json"})

    def _scrub(self, body: bytes, status: int) -> bytes:
        return _scrub_body(body, self._key_bytes, status)

    async def _call(self, method: str, url: URL, **kwargs: Any) -> HttpAnswer:
        assert self._session is not None, "use `async with SumeClient(...)`"
        if self.key_problem is not None:
            return HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                              detail=f"not sent: the API key cannot go into an HTTP header: "
                                     f"{self.key_problem}")
        try:
            # no redirects: a redirect target may carry a signed query string, and an error
            # about it would put that URL into logs and last_error
            async with self._session.request(method, url, allow_redirects=False,
                                             **kwargs) as resp:
                body = await resp.content.read(MAX_BODY_BYTES + 1)
                if len(body) > MAX_BODY_BYTES:
                    return HttpAnswer(resp.status, b"", transport_error=ErrorClass.MALFORMED,
                                      detail=f"body larger than {MAX_BODY_BYTES} bytes")
                headers = resp.headers
                return HttpAnswer(
                    resp.status, self._scrub(body, resp.status),
                    retry_after=headers.get("Retry-After"),
                    request_id=headers.get("X-Request-Id"),
                    ratelimit_remaining=(headers.get("RateLimit-Remaining")
                                         or headers.get("X-RateLimit-Remaining")),
                    ratelimit_reset=(headers.get("RateLimit-Reset")
                                     or headers.get("X-RateLimit-Reset")))
        except TimeoutError:
            return HttpAnswer(None, transport_error=ErrorClass.TIMEOUT,
                              detail=f"no answer within {self._timeout.total:g} s")
        except aiohttp.ClientPayloadError as exc:
            return HttpAnswer(None, transport_error=ErrorClass.MALFORMED,
                              detail=f"broken body: {type(exc).__name__}")
        except (aiohttp.ClientError, OSError) as exc:
            return HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                              detail=f"{type(exc).__name__}: {_short(exc)}")
        except ValueError as exc:
            # aiohttp refuses a header it cannot write (a control character: "Forbidden
            # control character detected in headers"); its text is not shown, a header may be
            # the key
            return HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                              detail=f"not sent: a request header could not be written "
                                     f"({type(exc).__name__}); check the API key's setting")


def _scrub_body(body: bytes, api_key: bytes, status: int) -> bytes:
    """The body as stored and logged downstream: never our own key (a provider or proxy may
    echo it in an error), and an error's URLs without their query strings (signatures).

    A JSON body is scrubbed value by value and written again, so it stays valid JSON (a text
    substitution could eat an escaped quote); other bodies as text. A 2xx body keeps its
    URLs: a result's signed links are what the download needs. An answer with nothing to
    scrub is returned as it came.
    """
    has_key = bool(api_key) and api_key in body
    urls = not 200 <= status < 300 and b":" in body and (b"://" in body or b":\\/\\/" in body)
    if not (has_key or urls):
        return body
    key = api_key.decode()

    def scrub(text: str) -> str:
        if key:
            text = text.replace(key, "<redacted>")
        return redact_urls(text) if urls and "://" in text else text

    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return scrub(body.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    return json.dumps(_scrub_json(value, scrub)).encode()


def _scrub_json(value: Any, scrub: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(k): _scrub_json(v, scrub) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_json(v, scrub) for v in value]
    return value


def _short(exc: BaseException) -> str:
    # aiohttp messages can embed the URL; the URL holds the job id, never the key.
    return str(exc).splitlines()[0][:200] if str(exc) else ""
