"""Pure rules for media files: which URLs a result carries, the file names they get, and the
form of a URL that may be shown (no query string, no credentials). No I/O."""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

MAX_MEDIA_URLS = 20
"""A result with more media URLs than this is not downloaded (it is not a video result)."""

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SAFE_EXT = re.compile(r"\.[A-Za-z0-9]{1,8}")


def shown_url(url: str) -> str:
    """`url` without its query string, fragment and credentials: safe for logs and the
    database (a signed URL's signature lives in the query string)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 address: its brackets, or the port could not be told apart
            host = f"[{host}]"
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return "<unparseable URL>"


MEDIA_URL_KEYS = ("url", "video_url", "download_url", "media_url", "file_url")
"""Keys whose value is a media file (the provider's `videos[].url`; the common other spellings).
Other `*_url` keys (a status or web page link) are not media and are never fetched."""


def media_urls(result: Any) -> list[str]:
    """The http(s) URLs of a result body under MEDIA_URL_KEYS (at any depth; a key like
    `hd_video_url` counts), in order, without repeats."""
    found: list[str] = []
    for key, value in _walk(result):
        if (isinstance(value, str) and (key == "url" or key.endswith(MEDIA_URL_KEYS[1:]))
                and value.lower().startswith(("http://", "https://")) and value not in found):
            found.append(value)
    return found


def _walk(node: Any, key: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    if depth > 20:
        return
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, str(k).lower(), depth + 1)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, key, depth + 1)
    else:
        yield key, node


def job_dir_name(job_id: str) -> str:
    """A directory name for a job: the id itself when it is a plain name, else a digest (a job
    id may hold '/', '..', NUL or anything else; it never becomes a path by itself)."""
    if _SAFE.fullmatch(job_id) and job_id not in (".", ".."):
        return job_id
    return "job-" + hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def file_names(urls: list[str]) -> list[str]:
    """One distinct, plain file name per URL: `<n>-<basename>` from the URL path, or
    `<n>.mp4` when the basename is not a plain name."""
    names = []
    for i, url in enumerate(urls, start=1):
        try:
            base = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        except ValueError:
            base = ""
        if not (_SAFE.fullmatch(base) and base not in (".", "..")):
            ext = ""
            if "." in base:
                candidate = "." + base.rsplit(".", 1)[1]
                ext = candidate if _SAFE_EXT.fullmatch(candidate) else ""
            base = f"video{ext or '.mp4'}"
        names.append(f"{i}-{base}")
    return names


_SLASH = r"(?:/|\\++/|\\++u002[fF]|%(?:25)*+2[fF]|&#(?:0*+47|[xX]0*+2[fF]);?|&sol;)"
_URL_IN_TEXT = re.compile(
    # a match starts only where a run of scheme characters starts, and takes the run whole:
    # tried from each letter of a long run with no `://` after it, the scan was quadratic
    # (32 KiB of letters and a `%3a`: 9 s). The scheme is the run from its first letter on;
    # what comes before that letter (`lead`: digits, `+`, `.`, `-`) is kept as it is
    r"(?<![A-Za-z0-9+.-])(?P<lead>[0-9+.-]*+)"
    r"(?P<url>[A-Za-z][A-Za-z0-9+.-]*+(?P<sep>://|(?::|%(?:25)*+3[aA])" + _SLASH + "{2})"
    r"[^\s'\"<>]++)")
"""A URL in free text, its `://` as written or escaped: JSON's `\\/` and `\\u002f` (any
number of backslashes: JSON inside a JSON string), percent-encoding (`%3A%2F%2F`, `%253A...`)
or an HTML character reference (`&#x2F;`, `&#47;`, `&sol;`), as an error page may quote it.
Linear in the text's length: every run (scheme, backslashes, `25`s, zeros) is taken
possessively, and only from its start."""
_JSON_ESCAPE = re.compile(r"(?<!\\)\\++(?:u([0-9a-fA-F]{4})|([/\"]))")
MAX_UNESCAPE_ROUNDS = 4
"""An escaped URL is decoded at most this many times over (a URL percent-encoded into a
JSON string inside an HTML page is three)."""


def _json_unescape(match: re.Match[str]) -> str:
    if not match.group(1):
        return match.group(2)
    code = int(match.group(1), 16)
    # a lone surrogate stays written as it was: as a character it could not be encoded again
    return match.group(0) if 0xD800 <= code <= 0xDFFF else chr(code)


def _unescaped(url: str) -> str:
    """An escaped URL as its own text (JSON escapes, percent-encoding, HTML references)."""
    for _ in range(MAX_UNESCAPE_ROUNDS):
        before = url
        url = _JSON_ESCAPE.sub(_json_unescape, url)
        url = unquote(html.unescape(url), errors="surrogateescape")
        if url == before:
            break
    return url


def _shown_match(match: re.Match[str]) -> str:
    url = match.group("url")
    # a URL written plainly is shown as before, byte for byte; an escaped one is decoded
    # first (its `?` may itself be escaped), then shown
    return match.group("lead") + shown_url(
        url if match.group("sep") == "://" else _unescaped(url))


def redact_urls(text: str) -> str:
    """`text` with every URL in it shown by `shown_url` (error messages of HTTP libraries and
    user hooks often quote the signed URL they were given; an error page may quote it
    JSON-escaped, percent-encoded or HTML-escaped: those lose their query string too)."""
    return _URL_IN_TEXT.sub(_shown_match, text)


def without_signatures(value: Any) -> Any:
    """A copy of a JSON value with every URL string shown by `shown_url` (for `jobs show`,
    the dashboard and logs: a stored result keeps its signed links, nothing shown does).
    Iterative: a stored body of any depth is shown without a RecursionError."""
    return map_strings(value, lambda s: redact_urls(s) if may_hold_url(s) else s)[0]


def may_hold_url(text: str) -> bool:
    """Whether `text` may hold a URL `redact_urls` would change (a cheap test first)."""
    return ":" in text or "%" in text  # the scheme's colon, as written or percent-encoded


def map_strings(value: Any, change: Callable[[str], str],
                keys: Callable[[str], str] | None = None) -> tuple[Any, bool]:
    """A copy of a JSON value with `change` applied to every string in it (and `keys` to every
    object key), and whether anything changed. Iterative, never recursive: a body nested
    100,000 deep is walked without a RecursionError."""
    changed = False

    def fresh(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, str):
            new = change(node)
            changed = changed or new != node
            return new
        if isinstance(node, dict):
            return {}
        if isinstance(node, list):
            return []
        return node

    root = fresh(value)
    stack: list[tuple[Any, Any]] = [(value, root)] if isinstance(value, dict | list) else []
    while stack:
        source, target = stack.pop()
        if isinstance(source, dict):
            for k, v in source.items():
                new_key = keys(k) if keys is not None and isinstance(k, str) else k
                changed = changed or new_key != k
                target[new_key] = child = fresh(v)
                if isinstance(v, dict | list):
                    stack.append((v, child))
        else:
            for v in source:
                child = fresh(v)
                target.append(child)
                if isinstance(v, dict | list):
                    stack.append((v, child))
    return root, changed


def job_path_segment(job_id: str) -> str:
    """Percent-encode a job id as exactly one path segment.

    `quote(safe="")` encodes '/', '?', '#', '%' and everything else outside the unreserved set;
    '.' and '..' are unreserved yet mean "this/parent directory", so they are encoded too.
    """
    segment = quote(job_id, safe="")
    if segment in (".", ".."):
        segment = segment.replace(".", "%2E")
    return segment
