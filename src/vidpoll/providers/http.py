"""The HTTP plumbing every provider's JSON API client shares: the only code that sends a
provider's key.

`JsonApiClient` opens one connection pool per account, sends each call with a short total
timeout and never follows a redirect, caps the body it reads, and turns every failure into an
`HttpAnswer` (never raised). Each body it returns is scrubbed of the account's key in every
encoding it may take (`scrub_body`, `secret_pattern`) and, unless the call keeps them, of
every link's query string (a signature). It never interprets an answer beyond transport (that
is the provider's `rules`) and never logs headers. A provider's client (`providers/<name>/
client.py`) subclasses it with its paths, its request shapes and its own answers' extras.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import html.entities
import json
import re
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self

import aiohttp
from yarl import URL

from vidpoll.media import job_path_segment, map_strings, may_hold_url, redact_urls
from vidpoll.models import ErrorClass, HttpAnswer
from vidpoll.providers.base import CreatedPage

MAX_BODY_BYTES = 1 << 20
SCRUB_INLINE_BYTES = 64 << 10
"""A body longer than this is scrubbed in a thread, not on the event loop."""


def key_problem(api_key: str) -> str | None:
    """Why `api_key` cannot go into an HTTP header (a control character, which aiohttp
    refuses to write), else None. Never quotes the key."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in api_key):
        return "it holds a control character (a pasted newline or escape?)"
    return None


def normal_base(base_url: str) -> str:
    """`base_url` as the paths are appended to it: parsed once, no trailing slash."""
    return str(URL(base_url)).rstrip("/")


def job_url(base: str, job_id: str, path: str) -> URL:
    """`base` + `path` with `{job_id}` as one percent-encoded path segment, already encoded,
    so aiohttp sends it byte for byte."""
    return URL(base + path.replace("{job_id}", job_path_segment(job_id)), encoded=True)


class JsonApiClient:
    """One account's pool of connections to a provider's JSON API (the transport half of
    `vidpoll.providers.base.Client`); a provider's client subclasses it.

    The key goes in an `Authorization: Bearer` header (`_auth_headers`) on every call, and
    only when `key_problem` finds nothing wrong with it; otherwise every call answers so
    without sending."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100) -> None:
        self.base_url = base_url
        self._base = self._normal_base(base_url)  # parsed once: this runs on every read
        self._api_key = api_key
        self.key_problem = key_problem(api_key)
        """Why the key cannot be sent (then every call answers so without sending); None."""
        self._key_bytes = api_key.encode() if api_key else b""
        if api_key:
            _key_traces(self._key_bytes)  # compiled once, here, not on the first read's loop turn
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def _normal_base(base_url: str) -> str:
        """The base URL the paths are appended to (a provider may drop a version suffix)."""
        return normal_base(base_url)

    def _auth_headers(self) -> dict[str, str]:
        """The headers that carry the key on every call (only ever to the base's origin)."""
        return {"Authorization": f"Bearer {self._api_key}"}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key=<redacted>)"

    async def __aenter__(self) -> Self:
        connector = aiohttp.TCPConnector(limit=self._max_connections,
                                         limit_per_host=self._max_connections)
        headers = {"Accept": "application/json", "User-Agent": "vidpoll"}
        if self.key_problem is None:
            headers.update(self._auth_headers())
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

    def _retry_after(self, status: int, headers: Mapping[str, str], body: bytes) -> str | None:
        """How long the server asked to wait, as `HttpAnswer.retry_after` holds it (seconds
        or an HTTP date, as written): its `Retry-After` header. `body` is already scrubbed."""
        return headers.get("Retry-After")

    async def _call(self, method: str, url: URL, *, keep_links: bool = False,
                    max_body: int = MAX_BODY_BYTES,
                    prepare: Callable[[bytes, int], bytes] | None = None,
                    **kwargs: Any) -> HttpAnswer:
        """Send one request; every failure comes back as an HttpAnswer, never raised. The
        body comes back scrubbed of the key, and of every link's query string unless
        `keep_links` and the answer is a 2xx (see `scrub_body`).

        `max_body`: the longest body read (longer: an error); above MAX_BODY_BYTES only with
        `prepare(body, status)`, which makes of it the body to scrub and return (a provider
        whose answer carries large inline data drops it there), at most MAX_BODY_BYTES, run
        in a thread for a long body."""
        assert self._session is not None, f"use `async with {type(self).__name__}(...)`"
        if self.key_problem is not None:
            return HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                              detail=f"not sent: the API key cannot go into an HTTP header: "
                                     f"{self.key_problem}")
        try:
            # no redirects: a redirect target may carry a signed query string, and an error
            # about it would put that URL into logs and last_error
            async with self._session.request(method, url, allow_redirects=False,
                                             **kwargs) as resp:
                # read(n) answers what has arrived, up to n: read until the end or the cap
                # (one read gave a long body cut at its first chunk)
                got = bytearray()
                while len(got) <= max_body and (
                        chunk := await resp.content.read(max_body + 1 - len(got))):
                    got += chunk
                body = bytes(got)
                del got
                if len(body) > max_body:
                    return HttpAnswer(resp.status, b"", transport_error=ErrorClass.MALFORMED,
                                      detail=f"body larger than {max_body} bytes")
                status, headers = resp.status, resp.headers
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
        scrub = functools.partial(_prepared_scrub, body, self._key_bytes, status,
                                  keep_links=keep_links, prepare=prepare)
        # a long body off the loop: linear, still up to ~0.1 s for 1 MiB of adversarial
        # text, while the loop serves every other job (in a thread the loop waits ~1/8 of it)
        shown = scrub() if len(body) <= SCRUB_INLINE_BYTES else await asyncio.to_thread(scrub)
        if shown is None:
            return HttpAnswer(status, b"", transport_error=ErrorClass.MALFORMED,
                              detail=f"body larger than {MAX_BODY_BYTES} bytes")
        return HttpAnswer(
            status, shown,
            retry_after=self._retry_after(status, headers, shown),
            request_id=headers.get("X-Request-Id"),
            ratelimit_remaining=(headers.get("RateLimit-Remaining")
                                 or headers.get("X-RateLimit-Remaining")),
            ratelimit_reset=(headers.get("RateLimit-Reset")
                             or headers.get("X-RateLimit-Reset")))


def _prepared_scrub(body: bytes, api_key: bytes, status: int, *, keep_links: bool,
                    prepare: Callable[[bytes, int], bytes] | None) -> bytes | None:
    """`scrub_body` of what `prepare` makes of `body`; None when that is still too long."""
    shaped = body if prepare is None else prepare(body, status)
    if len(shaped) > MAX_BODY_BYTES:
        return None
    return scrub_body(shaped, api_key, status, keep_links=keep_links)


async def list_page(client: JsonApiClient, url: URL, what: str,
                    member: str) -> tuple[dict[str, Any], list[Any]] | CreatedPage:
    """One page of a provider's records, read for the core's look-ups (`vidpoll.reconcile`):
    the page (a JSON object) and its list under `member`, or the CreatedPage that says why
    there is none (not sent: a key no header can carry, `final`; a failed call or an answer
    that is not `{member: [...]}`: a failed page, tried again by the core). `what` names the
    list in messages ("listing predictions")."""
    if client.key_problem is not None:
        return CreatedPage(detail=f"{what}: not sent: {client.key_problem}", final=True,
                           calls=0)
    answer = await client._call("GET", url, keep_links=True)  # an echoed input is an input
    if answer.transport_error is not None or answer.status is None:
        shown = redact_urls(answer.detail) or "no answer"
        return CreatedPage(failure=answer, detail=f"{what}: {shown}")
    if not 200 <= answer.status < 300:
        return CreatedPage(failure=answer, detail=f"{what}: HTTP {answer.status}")
    try:
        page = json.loads(answer.body)
    except (ValueError, RecursionError):
        page = None
    items = page.get(member) if isinstance(page, dict) else None
    if not isinstance(page, dict) or not isinstance(items, list):
        return CreatedPage(failure=answer,
                           detail=f"{what}: the answer is not {{\"{member}\": [...]}}")
    return page, items


def scrub_body(body: bytes, api_key: bytes, status: int, *, keep_links: bool = False) -> bytes:
    """The body as stored and logged downstream: never our own key (a provider or proxy may
    echo it, escaped or not), and no URL's query string (a signature) unless `keep_links`
    (a 2xx result, whose signed links the download needs, or a 2xx create, whose job id is
    read as sent).

    A JSON body is parsed, each string and object key scrubbed as decoded text, and written
    again, so it stays valid JSON (a text substitution could eat an escaped quote) and no
    escape (`\\/`, `\\u0041`) hides the key; a member the parse dropped (a duplicated name:
    the last one wins) goes with the rewrite. Any other body (HTML, text, JSON cut short or
    nested too deep to parse) is scrubbed as text, where the key is found in each form it
    may take there: as written, JSON-escaped, percent-encoded, as HTML character references,
    `+` form-decoded to a space (`secret_pattern`) or base64-encoded (Basic auth). A UTF-16
    or UTF-32 body (a BOM, or text starting with ASCII) is scrubbed as the text it encodes
    and, when anything went, comes back as UTF-8; the key's own UTF-16/32 bytes go wherever
    they are. Walks are iterative: no depth raises RecursionError, and every pattern is
    linear in the body's length. An answer with nothing to scrub is returned as it came.
    """
    if not body:
        return body
    if len(body) > MAX_BODY_BYTES:
        # never called with more (the read stops there): no caller hands the patterns a
        # body longer than the one the linear-time tests measure
        return b""
    traces = _key_traces(api_key) if api_key else None
    if traces is not None:
        for wide, replacement in traces.wide:
            if wide in body:
                body = body.replace(wide, replacement)
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        # UTF-16/32 (a BOM, or NUL bytes beside the first characters): the text it encodes,
        # scrubbed as UTF-8; nothing found there, the body as it came
        narrow = body.decode(encoding, "replace").encode("utf-8", "surrogateescape")
        shown = _scrub_narrow(narrow, traces, status, keep_links)
        if shown is not narrow:
            body = shown
    # and always as UTF-8 (a body that only looked wide: binary with NUL bytes up front)
    return _scrub_narrow(body, traces, status, keep_links)


def _scrub_narrow(body: bytes, traces: _KeyTraces | None, status: int,
                  keep_links: bool) -> bytes:
    """`scrub_body` of a body read as UTF-8: `body` itself when nothing was scrubbed."""
    pattern = traces.pattern if traces is not None else None
    # without an escape's first byte (JSON, percent, HTML) the key can only be there as
    # written (or with a space for a `+`, or base64), a URL's query, fragment or
    # credentials only behind a plain `?`, `#` or `@`
    escaped = b"\\" in body or b"%" in body or b"&" in body  # (faster than one regex)
    has_key = traces is not None and (
        traces.plain in body or any(b64 in body for b64 in traces.base64) or (
            escaped and traces.pattern.search(body.decode("utf-8", "surrogateescape"))
            is not None))
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
        if pattern is None or traces is None:
            return text
        text = pattern.sub(REDACTED, text)
        for b64 in traces.base64_text:
            if b64 in text:
                text = text.replace(b64, REDACTED)
        return text

    text = body.decode("utf-8", "surrogateescape")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than json parses
        shown = scrub(text)
        return body if shown == text else shown.encode("utf-8", "surrogateescape")
    value, changed = map_strings(value, scrub, scrub)
    if not changed:
        if not (has_key or urls):
            return body
        if not _duplicate_members(body):
            # the key in a form the values do not show: scrubbed as text, else as it came
            shown = scrub(text) if has_key else text
            return body if shown == text else shown.encode("utf-8", "surrogateescape")
    # written again: a duplicated member (`{"error": "<key>", "error": "x"}`) is in the
    # bytes, not in the value the parse kept
    try:
        return json.dumps(value).encode()
    except (ValueError, RecursionError):  # parsed here, yet too deep to write back: text
        return scrub(text).encode("utf-8", "surrogateescape")


REDACTED = "<redacted>"
_MAY_HOLD_URL = re.compile(rb"(?i):(?://|\\|&|%(?:25)*+2f)|%(?:25)*+3a")
"""The start of a URL's `://`, as written or escaped (see media.redact_urls)."""
_WIDE_ENCODINGS = ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
_MIN_BASE64_CORE = 8
"""A base64 core shorter than this (a key of a few bytes) is not searched for: it would
match ordinary words."""


@dataclasses.dataclass(frozen=True)
class _KeyTraces:
    """What betrays one key in a body, computed once per key."""

    pattern: re.Pattern[str]
    plain: bytes
    """The key's longest run without `+`: a form-decoded echo (`+` read as a space) holds it."""
    base64: tuple[bytes, ...]
    base64_text: tuple[str, ...]
    wide: tuple[tuple[bytes, bytes], ...]
    """(the key in UTF-16/32, `<redacted>` in the same encoding)."""


@functools.lru_cache(maxsize=32)
def _key_traces(api_key: bytes) -> _KeyTraces:
    key = api_key.decode("utf-8", "surrogateescape")
    cores = _base64_cores(api_key)
    return _KeyTraces(
        secret_pattern(key), max(api_key.split(b"+"), key=len), cores,
        tuple(c.decode() for c in cores),
        tuple((key.encode(enc, "surrogatepass"), REDACTED.encode(enc))
              for enc in _WIDE_ENCODINGS))


def _base64_cores(key: bytes) -> tuple[bytes, ...]:
    """The base64 characters that depend on `key` alone, for each of the three alignments
    it may have in an encoded string (`key`, `key:`, `user:key`: HTTP Basic auth), in the
    standard and the URL-safe alphabet. A body holding one holds the key, base64-encoded."""
    cores: list[bytes] = []
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + key + b"\0\0")
        # character j carries bits 6j..6j+5; the key's bits are 8*pad..8*(pad+len)-1
        core = encoded[-(-8 * pad // 6):8 * (pad + len(key)) // 6]
        if len(core) >= _MIN_BASE64_CORE:
            for alphabet in (core, core.translate(bytes.maketrans(b"+/", b"-_"))):
                if alphabet not in cores:
                    cores.append(alphabet)
    return tuple(cores)


@functools.lru_cache(maxsize=32)
def secret_pattern(secret: str) -> re.Pattern[str]:
    """A pattern that finds `secret` in text, each of its characters as written or in the
    forms an error body may put it in: JSON escapes (`\\/`, `\\"`, `\\u002F`, with any
    number of backslashes: JSON inside a JSON string), percent-encoding (`%2F`, `%252F`,
    the UTF-8 bytes of any character), HTML character references (`&#47;`, `&#x2f;`,
    `&sol;`) and, for a `+`, a space (a form-decoded echo) in each of those forms; forms
    may mix within one occurrence.

    Linear in the text's length: a backslash run starts a match only at its first
    backslash (`(?<!\\\\)`), and every run is taken possessively, so a 1 MiB run of
    backslashes is not tried again from each of its positions."""
    # the lookahead lets the scan skip, at C speed, every place no form of the first
    # character can start (a 1 MiB HTML page: 8 ms instead of 13)
    starts = secret[:1] + (" " if secret[:1] == "+" else "")
    first = "[\\\\%&" + "".join(re.escape(c) for c in starts) + "]"
    return re.compile(f"(?={first})" + "".join(
        _char_forms(c, first=i == 0) for i, c in enumerate(secret)))


def _char_forms(char: str, *, first: bool = False) -> str:
    forms = _forms(char, first)
    if char == "+":
        forms += _forms(" ", first)  # application/x-www-form-urlencoded: `+` is a space
    return "(?:" + "|".join(forms) + ")"


def _duplicate_members(body: bytes) -> bool:
    """Whether a JSON object in `body` names a member twice (the parse keeps the last)."""
    seen = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal seen
        seen = seen or len({k for k, _ in items}) != len(items)
        return dict(items)

    try:
        json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return False
    return seen


def _forms(char: str, first: bool) -> list[str]:
    # a backslash run is taken whole (`\\++`: what follows it is never a backslash); the
    # secret's first character starts only at a run's first backslash, else a long run is
    # retried from each of its backslashes (quadratic)
    more = r"\\++"
    run = (r"(?<!\\)" if first else "") + more
    # (a key starting with a backslash: as written, only at a run's first one too)
    forms = [(r"(?<!\\)" if first and char == "\\" else "") + re.escape(char)]
    if char in "/\"":
        forms.append(run + re.escape(char))
    elif char == "\\":
        # escaped backslashes: two or more, at most 16 (JSON in JSON in JSON in JSON);
        # bounded, not possessive (that would leave none for a backslash after it), so a
        # long run costs a constant per place, never a rescan of the run (quadratic)
        forms.append((r"(?<!\\)" if first else "") + r"\\{2,16}")
    units = char.encode("utf-16-be", "surrogatepass")
    forms.append("".join(rf"{run if i == 0 else more}u(?i:{int.from_bytes(units[i:i + 2]):04x})"
                         for i in range(0, len(units), 2)))
    # `(?:25)*` is not possessive: the percent sign's own code is 25
    forms.append("".join(rf"%(?:25)*(?i:{b:02x})"
                         for b in char.encode("utf-8", "surrogatepass")))
    forms.append(rf"&#(?:0*{ord(char)}|[xX]0*(?i:{ord(char):x}));?")
    forms += [re.escape("&" + name) for name in _entity_names().get(char, ())]
    return forms


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
