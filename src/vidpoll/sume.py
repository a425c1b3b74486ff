"""The Sume HTTP client: the only module that talks HTTP to the provider.

It never interprets an answer beyond transport (that is vidpoll.policy's job) and never logs
headers, so the API key cannot leak through it.
"""

from __future__ import annotations

import functools
import html.entities
import json
import re
from types import TracebackType
from typing import Any

import aiohttp
from yarl import URL

from vidpoll.media import job_path_segment, map_strings, may_hold_url, redact_urls, shown_url
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
        if api_key:
            secret_pattern(api_key)  # compiled once, here, not on the first read's loop turn
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
        """GET the job's status; every failure comes back as an HttpAnswer, never raised.
        Its URLs lose their query strings whatever the status: the answer is stored
        (`last_response`) and archived, and nothing downloads from a status answer."""
        return await self._call("GET", _job_url(self._base, job_id, self._status_path))

    async def read_result(self, job_id: str) -> HttpAnswer:
        """GET a completed job's result (409 job_not_completed until it is ready)."""
        # its signed links are the download's: a 2xx keeps them (the key never)
        return await self._call("GET", _job_url(self._base, job_id, DEFAULT_RESULT_PATH),
                                keep_links=True)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str) -> HttpAnswer:
        """POST a new render with our own Idempotency-Key (the paid call)."""
        url = URL(self._base + self._create_path, encoded=True)
        # a 2xx is kept whole but for the key: its job id is read as sent, whatever it holds
        return await self._call("POST", url, data=json.dumps(payload).encode(),
                                headers={"Idempotency-Key": idempotency_key,
                                         "Content-Type": "application/json"},
                                keep_links=True)

    async def _call(self, method: str, url: URL, *, keep_links: bool = False,
                    **kwargs: Any) -> HttpAnswer:
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
                    resp.status,
                    _scrub_body(body, self._key_bytes, resp.status, keep_links=keep_links),
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


def _scrub_body(body: bytes, api_key: bytes, status: int, *, keep_links: bool = False) -> bytes:
    """The body as stored and logged downstream: never our own key (a provider or proxy may
    echo it, escaped or not), and no URL's query string (a signature) unless `keep_links`
    (a 2xx result, whose signed links the download needs, or a 2xx create, whose job id is
    read as sent).

    A JSON body is parsed, each string and object key scrubbed as decoded text, and written
    again, so it stays valid JSON (a text substitution could eat an escaped quote) and no
    escape (`\\/`, `\\u0041`) hides the key. Any other body (HTML, text, JSON cut short or
    nested too deep to parse) is scrubbed as text, where the key is found in each form it
    may take there: as written, JSON-escaped, percent-encoded or as HTML character references
    (`secret_pattern`). Walks are iterative: no depth raises RecursionError. An answer with
    nothing to scrub is returned as it came.
    """
    if not body:
        return body
    pattern = secret_pattern(api_key.decode("utf-8", "surrogateescape")) if api_key else None
    # without an escape's first byte (JSON, percent, HTML) the key can only be there as
    # written, a URL's query, fragment or credentials only behind a plain `?`, `#` or `@`
    escaped = b"\\" in body or b"%" in body or b"&" in body  # (faster than one regex)
    has_key = pattern is not None and (api_key in body or (
        escaped and pattern.search(body.decode("utf-8", "surrogateescape")) is not None))
    urls = (not (keep_links and 200 <= status < 300)
            and (escaped or b"?" in body or b"#" in body or b"@" in body)
            and _MAY_HOLD_URL.search(body) is not None)
    if not (has_key or urls):
        return body

    def scrub(text: str) -> str:
        if urls and may_hold_url(text):
            # URLs first: a key inside a query string goes with it, and the `<redacted>`
            # put in its place would end the URL early (its `<`), leaving the rest shown
            text = redact_urls(text)
        return pattern.sub(REDACTED, text) if pattern is not None else text

    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than json parses
        text = body.decode("utf-8", "surrogateescape")
        shown = scrub(text)
        return body if shown == text else shown.encode("utf-8", "surrogateescape")
    value, changed = map_strings(value, scrub, scrub)
    if not changed:
        return body
    try:
        return json.dumps(value).encode()
    except (ValueError, RecursionError):  # parsed here, yet too deep to write back: text
        text = body.decode("utf-8", "surrogateescape")
        return scrub(text).encode("utf-8", "surrogateescape")


REDACTED = "<redacted>"
_MAY_HOLD_URL = re.compile(rb"(?i):(?://|\\|&|%(?:25)*2f)|%(?:25)*3a")
"""The start of a URL's `://`, as written or escaped (see media.redact_urls)."""


@functools.lru_cache(maxsize=32)
def secret_pattern(secret: str) -> re.Pattern[str]:
    """A pattern that finds `secret` in text, each of its characters as written or in the
    forms an error body may put it in: JSON escapes (`\\/`, `\\"`, `\\u002F`, with any
    number of backslashes: JSON inside a JSON string), percent-encoding (`%2F`, `%252F`,
    the UTF-8 bytes of any character) and HTML character references (`&#47;`, `&#x2f;`,
    `&sol;`); forms may mix within one occurrence."""
    # the lookahead lets the scan skip, at C speed, every place no form of the first
    # character can start (a 1 MiB HTML page: 8 ms instead of 13)
    first = "[\\\\%&" + re.escape(secret[:1]) + "]"
    return re.compile(f"(?={first})" + "".join(_char_forms(c) for c in secret))


def _char_forms(char: str) -> str:
    forms = [re.escape(char)]
    if char in "/\\\"":
        forms.append(r"\\+" + re.escape(char))
    units = char.encode("utf-16-be", "surrogatepass")
    forms.append("".join(rf"\\+u(?i:{int.from_bytes(units[i:i + 2]):04x})"
                         for i in range(0, len(units), 2)))
    forms.append("".join(rf"%(?:25)*(?i:{b:02x})"
                         for b in char.encode("utf-8", "surrogatepass")))
    forms.append(rf"&#(?:0*{ord(char)}|[xX]0*(?i:{ord(char):x}));?")
    forms += [re.escape("&" + name) for name in _entity_names().get(char, ())]
    return "(?:" + "|".join(forms) + ")"


@functools.cache
def _entity_names() -> dict[str, list[str]]:
    """HTML's named character references of single characters, by character (`/`: `sol;`)."""
    names: dict[str, list[str]] = {}
    for name, char in html.entities.html5.items():
        if len(char) == 1:
            names.setdefault(char, []).append(name)
    return names


def _short(exc: BaseException) -> str:
    # aiohttp messages can embed the URL; the URL holds the job id, never the key.
    return str(exc).splitlines()[0][:200] if str(exc) else ""
