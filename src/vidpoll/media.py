"""Pure rules for media files: which URLs a result carries, the file names they get, and the
form of a URL that may be shown (no query string, no credentials). No I/O."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
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
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return "<unparseable URL>"


MEDIA_URL_KEYS = ("url", "video_url", "download_url", "media_url", "file_url")
"""Keys whose value is a media file (Sume's `videos[].url`; the common other spellings).
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


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_urls(text: str) -> str:
    """`text` with every URL in it shown by `shown_url` (error messages of HTTP libraries and
    user hooks often quote the signed URL they were given)."""
    return _URL_IN_TEXT.sub(lambda m: shown_url(m.group(0)), text)


def without_signatures(value: Any) -> Any:
    """A copy of a JSON value with every URL string shown by `shown_url` (for `jobs show`,
    the dashboard and logs: a stored result keeps its signed links, nothing shown does)."""
    if isinstance(value, dict):
        return {k: without_signatures(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_signatures(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return redact_urls(value)
    return value


def job_path_segment(job_id: str) -> str:
    """Percent-encode a job id as exactly one path segment.

    `quote(safe="")` encodes '/', '?', '#', '%' and everything else outside the unreserved set;
    '.' and '..' are unreserved yet mean "this/parent directory", so they are encoded too.
    """
    segment = quote(job_id, safe="")
    if segment in (".", ".."):
        segment = segment.replace(".", "%2E")
    return segment
