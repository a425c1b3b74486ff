"""Media downloads: stream each file to a hidden `.part` file, fsync, rename atomically.

A crash at any point leaves either nothing, a `.part` file (resumed with a Range request, or
restarted if the server ignores it) or the complete file under its final name; never a half
file under the final name. The Sume API key is never sent to media hosts (their own session,
no Authorization header) and a URL is only ever shown without its query string.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import os
import re
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import aiohttp
from yarl import URL

from vidpoll.errors import DiskError, DownloadError, UrlExpired
from vidpoll.media import file_names, job_dir_name, redact_urls, shown_url
from vidpoll.models import MediaFile

CHUNK_BYTES = 1 << 16
WRITE_BATCH_BYTES = 1 << 20
"""Bytes gathered before one write (in a thread, so a slow disk never blocks polling)."""
EXPIRED_STATUSES = frozenset({401, 403, 404, 410})
"""A media host's answers to a signed link that expired (or was never valid)."""
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def _disk_error(exc: OSError, path: Path) -> DiskError:
    reason = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
              errno.EFBIG: "the file is larger than this system allows",
              errno.EACCES: "permission denied", errno.EPERM: "permission denied",
              errno.EROFS: "the file system is read-only",
              errno.ENOTDIR: "a path component is not a directory",
              }.get(exc.errno or 0, exc.strerror or type(exc).__name__)
    return DiskError(f"cannot write {path}: {reason}")


class Downloader:
    """Downloads the media of completed jobs into `directory/<job>/<n>-<name>`."""

    def __init__(self, directory: str | os.PathLike[str], *, connect_timeout_s: float = 15.0,
                 read_timeout_s: float = 60.0, max_connections: int = 8) -> None:
        self.directory = Path(directory).absolute()
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s,
                                              sock_read=read_timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Downloader:
        # the bytes as stored: a transparently decompressed body would never match its
        # Content-Length, and a Range offset counts stored bytes
        self._session = aiohttp.ClientSession(
            timeout=self._timeout, raise_for_status=False, auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=self._max_connections),
            headers={"User-Agent": "vidpoll", "Accept-Encoding": "identity"})
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def check_directory(self) -> None:
        """Create the directory if needed and prove it takes a file; DiskError if not."""
        probe = self.directory / ".vidpoll-write-test"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise _disk_error(exc, probe) from exc

    async def download(self, job_id: str, urls: list[str]) -> list[MediaFile]:
        """Every URL of one job, in order; raises a DownloadError subclass on the first
        failure (files already complete stay and are not fetched again next time)."""
        folder = self.directory / job_dir_name(job_id)
        try:
            await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise _disk_error(exc, folder) from exc
        return [await self._one(url, folder / name)
                for url, name in zip(urls, file_names(urls), strict=True)]

    async def _one(self, url: str, final: Path) -> MediaFile:
        part = final.with_name(f".{final.name}.part")
        try:
            if await asyncio.to_thread(final.exists):
                # complete and renamed before a crash kept it from being recorded
                size, digest = await asyncio.to_thread(_hash_file, final)
            else:
                size, digest = await self._fetch(url, part, final)
        except OSError as exc:
            raise _disk_error(exc, part) from exc
        return MediaFile(str(final), size, digest, shown_url(url))

    async def _fetch(self, url: str, part: Path, final: Path) -> tuple[int, str]:
        """Stream `url` into `part` (resuming what it holds) under an exclusive lock, fsync
        it and rename it to `final` still holding the lock; (size, sha256)."""
        assert self._session is not None, "use `async with Downloader(...)`"
        out = await asyncio.to_thread(_open_locked, part)
        try:
            return await self._fill(url, out, part, final)
        finally:
            out.close()  # also releases the lock

    async def _fill(self, url: str, out: BinaryIO, part: Path, final: Path
                    ) -> tuple[int, str]:
        assert self._session is not None
        offset = os.fstat(out.fileno()).st_size
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        shown = shown_url(url)
        hasher = hashlib.sha256()
        try:
            # sent byte for byte as Sume gave it: re-encoding would break a signature
            async with self._session.get(URL(url, encoded=True), headers=headers,
                                         allow_redirects=True, max_redirects=5) as resp:
                if resp.status in EXPIRED_STATUSES:
                    raise UrlExpired(f"{shown} answered HTTP {resp.status}: the link expired")
                content_range = resp.headers.get("Content-Range", "")
                if resp.status == 416:
                    if content_range == f"bytes */{offset}":  # complete before a crash
                        await asyncio.to_thread(_hash_into, out, hasher, offset)
                        await asyncio.to_thread(_sync_and_publish, out, part, final)
                        return offset, hasher.hexdigest()
                    await asyncio.to_thread(_restart, out)
                    raise DownloadError(f"{shown}: the partial file does not fit the media "
                                        "(HTTP 416); starting over")
                expected: int | None
                if resp.status == 206:
                    match = _CONTENT_RANGE.fullmatch(content_range)
                    if match is None or int(match.group(1)) != offset:
                        await asyncio.to_thread(_restart, out)
                        raise DownloadError(f"{shown}: the server resumed at the wrong place")
                    expected = None if match.group(3) == "*" else int(match.group(3))
                elif resp.status == 200:
                    offset = 0  # the server ignores Range (or there was nothing): start over
                    expected = (int(resp.headers["Content-Length"])
                                if resp.headers.get("Content-Length", "").isdigit() else None)
                else:
                    raise DownloadError(f"{shown} answered HTTP {resp.status}")
                await asyncio.to_thread(_hash_into, out, hasher, offset)
                written = offset
                batch = bytearray()
                async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                    batch += chunk
                    if len(batch) >= WRITE_BATCH_BYTES:
                        await asyncio.to_thread(_write, out, hasher, bytes(batch))
                        written += len(batch)
                        batch.clear()
                if batch:
                    await asyncio.to_thread(_write, out, hasher, bytes(batch))
                    written += len(batch)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DownloadError(f"{shown}: {type(exc).__name__}: "
                                f"{redact_urls(str(exc))[:200]}") from exc
        if expected is not None and written != expected:
            raise DownloadError(f"{shown}: got {written} of {expected} bytes; resumed next time")
        await asyncio.to_thread(_sync_and_publish, out, part, final)
        return written, hasher.hexdigest()


def _open_locked(part: Path) -> BinaryIO:
    """Open (or create) the partial file and lock it, so two downloads of one file (two
    workers after a lost lease) never write into it at once."""
    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
    out = os.fdopen(fd, "r+b")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # the lock holder may have published it meanwhile: then this is the final file
        if os.fstat(fd).st_ino != os.stat(part).st_ino:
            raise DownloadError(f"{part.name} was published meanwhile")
    except BlockingIOError:
        out.close()
        raise DownloadError(f"another download of {part.name} is running") from None
    except BaseException:
        out.close()
        raise
    return out


def _restart(out: BinaryIO) -> None:
    out.seek(0)
    out.truncate()


def _hash_into(out: BinaryIO, hasher: hashlib._Hash, length: int) -> None:
    """Hash the first `length` bytes already in `out`, leaving it positioned at their end
    (and nothing after them)."""
    out.seek(0)
    left = length
    while left:
        data = out.read(min(left, WRITE_BATCH_BYTES))
        if not data:
            raise OSError(errno.EIO, "the partial file shrank while it was read")
        hasher.update(data)
        left -= len(data)
    out.seek(length)
    if os.fstat(out.fileno()).st_size != length:
        out.truncate()


def _write(out: BinaryIO, hasher: hashlib._Hash, data: bytes) -> None:
    out.write(data)
    hasher.update(data)


def _sync_and_publish(out: BinaryIO, part: Path, final: Path) -> None:
    """fsync the file, rename it into place, and make the rename (and the job's directory
    entry) durable."""
    out.flush()
    os.fsync(out.fileno())
    os.replace(part, final)
    for folder in (final.parent, final.parent.parent):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _hash_file(path: Path) -> tuple[int, str]:
    hasher = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while data := f.read(WRITE_BATCH_BYTES):
            hasher.update(data)
            size += len(data)
    return size, hasher.hexdigest()
