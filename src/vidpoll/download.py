"""Media downloads: stream each file to a hidden `.part` file, fsync, rename atomically.

A crash at any point leaves either nothing, a `.part` file (resumed with a Range request, or
restarted if the server ignores it) or the complete file under its final name; never a half
file under the final name. Every URL is fetched through vidpoll.fetch_guard (which hosts and
addresses, redirects, size, deadline and minimum rate); the the provider API key is never sent to
media hosts, and a URL is only ever shown without its query string.

Files are reached through directory file descriptors (`dir_fd=`) and opened with
`O_NOFOLLOW`: the job's directory, its `.part` file and its final file are never a symbolic
link followed somewhere else (a link planted there makes the try fail with a DiskError that
says so; a link in place of the final name is replaced by the rename, its target untouched),
and a `.part` that is not a plain file of its own (a device, a pipe, a hard link) is refused.
Only the download directory itself may be a link: the operator chose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from aiohttp.abc import AbstractResolver

from vidpoll.config import Settings
from vidpoll.errors import DiskError, DownloadError, DownloadRefused, UrlExpired
from vidpoll.fetch_guard import FetchGuard, FetchPolicy
from vidpoll.media import file_names, job_dir_name, shown_url
from vidpoll.models import DEFAULT_ACCOUNT, HttpAnswer, MediaFile
from vidpoll.policy import parsed_json_object
from vidpoll.providers.base import Terminal

CHUNK_BYTES = 1 << 16
WRITE_BATCH_BYTES = 1 << 20
"""Bytes gathered before one write (in a thread, so a slow disk never blocks polling)."""
EXPIRED_STATUSES = frozenset({401, 403, 404, 410})
"""A media host's answers to a signed link that expired (or was never valid)."""
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
INLINE_PREFIX = "inline:"
"""A media "URL" `inline:{n}`: video n came back as bytes in the provider's own answer (which
are never stored); the account's client reads them again (`inline_media`) when it is
downloaded. A provider's `Rules.media_urls` names such a video so."""
_INLINE = re.compile(r"inline:(\d{1,4})")

InlineFetch = Callable[[str, str, int], Awaitable[bytes]]
"""(account, job id, n) -> the bytes of the job's inline video n; raises a DownloadError
(DownloadRefused when they are gone for good)."""


def inline_fetcher(clients: Mapping[str, object]) -> InlineFetch:
    """An `InlineFetch` over the (entered) clients of the accounts served: each account's
    client's `inline_media`, an answer that is not the bytes turned into a DownloadError (for
    good, DownloadRefused, when the provider answered without them or no longer knows the
    job)."""
    # optional on a client: `async def inline_media(job_id, handle, index) -> bytes |
    # HttpAnswer` (the bytes of its inline video `index`, or the answer that did not hold them)
    readers: dict[str, Callable[..., Awaitable[bytes | HttpAnswer]]] = {}
    for account, client in clients.items():
        method = getattr(client, "inline_media", None)
        if callable(method):
            readers[account] = method

    async def fetch(account: str, job_id: str, index: int) -> bytes:
        what = f"{INLINE_PREFIX}{index} of job {job_id[:120]}"
        reader = readers.get(account)
        if reader is None:
            raise DownloadRefused(f"{what}: the provider of account {account!r} serves no "
                                  "inline media")
        got = await reader(job_id, None, index)
        if isinstance(got, bytes):
            return got
        said = got.detail or (f"HTTP {got.status}" if got.status is not None
                              else "no answer")
        if got.status is not None and (200 <= got.status < 300 or got.status in (404, 410)):
            raise DownloadRefused(f"{what}: the bytes are gone: {said}"[:500])
        raise DownloadError(f"{what}: could not be read again: {said}"[:500])

    return fetch


MediaRefresh = Callable[[str, str], Awaitable[list[str] | None]]
"""(account, job id) -> the job's media URLs read again now, signed query strings and all
(never stored), or None when the account's provider keeps its links (they are downloaded as
stored); raises a DownloadError (DownloadRefused when the provider no longer holds them)."""


def media_refresher(clients: Mapping[str, object]) -> MediaRefresh:
    """A `MediaRefresh` over the (entered) clients of the accounts served: each account's
    client's `fresh_media` (optional: Runway signs its output URLs anew on each read of the
    task, and they expire within a day or two), an answer without URLs turned into a
    DownloadError: for good (DownloadRefused) only when the provider itself said they are gone
    (its own 404/410, in its error envelope, or the job read as ended without them); a proxy's
    error page, a garbled answer or a job that reads as not ended is tried again later (a
    signed link's files live a day or two: a passing fault must not lose them)."""
    # optional on a client: `async def fresh_media(job_id, handle) -> list[str] | HttpAnswer`
    readers: dict[str, Callable[..., Awaitable[list[str] | HttpAnswer]]] = {}
    rules: dict[str, Any] = {}
    for account, client in clients.items():
        method = getattr(client, "fresh_media", None)
        if callable(method):
            readers[account] = method
            rules[account] = getattr(client, "rules", None)

    async def refresh(account: str, job_id: str) -> list[str] | None:
        reader = readers.get(account)
        if reader is None:
            return None
        got = await reader(job_id, None)
        if isinstance(got, list) and got:
            return got
        what = f"the media of job {job_id[:120]}"
        if isinstance(got, list):
            raise DownloadRefused(f"{what}: the provider's answer lists no media now")
        said = got.detail or (f"HTTP {got.status}" if got.status is not None
                              else "no answer")
        if _gone_for_good(got, rules.get(account)):
            raise DownloadRefused(f"{what}: the provider no longer holds them: {said}"[:500])
        raise DownloadError(f"{what}: fresh links could not be read: {said}"[:500])

    return refresh


def _gone_for_good(answer: HttpAnswer, rules: Any) -> bool:
    """Whether a job read again says its media are gone in the provider's own words: its 404
    or 410 in its error envelope, or a 2xx that reads as the job ended (without media)."""
    body = parsed_json_object(answer.body)
    if answer.status is None or rules is None or body is None:
        return False
    if answer.status in (404, 410):
        code, _ = rules.error_code(body)
        return code is not None
    if 200 <= answer.status < 300:
        return isinstance(rules.read_status(body), Terminal)
    return False


def _disk_error(exc: OSError, path: Path) -> DiskError:
    reason = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
              errno.EFBIG: "the file is larger than this system allows",
              errno.EACCES: "permission denied", errno.EPERM: "permission denied",
              errno.EROFS: "the file system is read-only",
              errno.ENOTDIR: "a path component is not a directory",
              errno.ELOOP: "it is a symbolic link, and links there are not followed",
              }.get(exc.errno or 0, exc.strerror or type(exc).__name__)
    return DiskError(f"cannot write {path}: {reason}")


@dataclass
class _Dirs:
    """Open descriptors of the download directory and of one job's directory in it."""

    base: int
    job: int

    def close(self) -> None:
        os.close(self.job)
        os.close(self.base)


class Downloader:
    """Downloads the media of completed jobs into `directory/<job>/<n>-<name>`."""

    def __init__(self, directory: str | os.PathLike[str], *, policy: FetchPolicy | None = None,
                 connect_timeout_s: float = 15.0, read_timeout_s: float = 60.0,
                 max_connections: int = 8,
                 resolver: AbstractResolver | None = None,
                 inline_fetch: InlineFetch | None = None,
                 fresh_media: MediaRefresh | None = None) -> None:
        """`policy`: which URLs of which account may be fetched, and the limits (none given:
        https:// to public addresses only, default limits); `resolver`: an aiohttp resolver
        to resolve names with (its answers are still checked); `inline_fetch`: what reads an
        `inline:{n}` video's bytes (`inline_fetcher`; None: such a video is refused);
        `fresh_media`: what reads a job's signed media links again just before its download
        (`media_refresher`; None: stored links are fetched as they are)."""
        self.directory = Path(directory).absolute()
        self._inline_fetch = inline_fetch
        self._fresh_media = fresh_media
        # the bytes as stored: a transparently decompressed body would never match its
        # Content-Length, a Range offset counts stored bytes, and so does the size limit
        self._guard = FetchGuard(policy, connect_timeout_s=connect_timeout_s,
                                 read_timeout_s=read_timeout_s, max_connections=max_connections,
                                 resolver=resolver, headers={"Accept-Encoding": "identity"})

    @classmethod
    def from_settings(cls, directory: str | os.PathLike[str], settings: Settings,
                      headers: Mapping[str, Mapping[str, str]] | None = None,
                      header_hosts: Mapping[str, frozenset[str]] | None = None,
                      **kwargs: Any) -> Downloader:
        """A Downloader with the fetch policy the environment sets (FetchPolicy.from_settings:
        each account's base URL, VIDPOLL_MEDIA_ALLOW_HOSTS*, VIDPOLL_DOWNLOAD_*)."""
        return cls(directory, policy=FetchPolicy.from_settings(settings, headers, header_hosts),
                   **kwargs)

    @property
    def policy(self) -> FetchPolicy:
        """The fetch policy in force."""
        return self._guard.policy

    async def __aenter__(self) -> Downloader:
        await self._guard.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._guard.__aexit__(exc_type, exc, tb)

    def check_directory(self) -> None:
        """Create the directory if needed and prove it takes a file; DiskError if not."""
        # a fresh name, created exclusively: a link planted under a fixed name is never
        # followed (O_EXCL fails on any existing entry, a link included)
        probe = self.directory / f".vidpoll-write-test-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            os.close(fd)
            probe.unlink()
        except OSError as exc:
            raise _disk_error(exc, probe) from exc

    async def download(self, job_id: str, urls: list[str], account: str = DEFAULT_ACCOUNT
                       ) -> list[MediaFile]:
        """Every URL of one job of `account`, in order; raises a DownloadError subclass on
        the first failure (files already complete stay and are not fetched again next time;
        a refused URL or an expired link leaves no partial file of its own)."""
        name = job_dir_name(job_id)
        folder = self.directory / name
        try:
            dirs = await asyncio.to_thread(_open_dirs, self.directory, name)
        except OSError as exc:
            raise _disk_error(exc, folder) from exc
        # an inline video is named as a file URL without a plain name is: `<n>-video.mp4`
        named = ["inline:video.mp4" if url.startswith(INLINE_PREFIX) else url for url in urls]
        try:
            fresh = (await self._fresh_media(account, job_id)
                     if self._fresh_media is not None else None)
            if fresh is None:
                return [await self._one(account, job_id, url, dirs, folder, file_name)
                        for url, file_name in zip(urls, file_names(named), strict=True)]
            # links signed anew by this read (never stored): named by their paths, and read
            # once more for a link that expired meanwhile
            files = []
            for index, file_name in enumerate(file_names(fresh)):
                try:
                    files.append(await self._one(account, job_id, fresh[index], dirs, folder,
                                                 file_name))
                except UrlExpired:
                    again = await self._fresh_media(account, job_id)  # type: ignore[misc]
                    if again is None or len(again) != len(fresh):
                        raise DownloadError(f"the media of job {job_id[:120]} changed between "
                                            "two reads; starting over") from None
                    fresh = again
                    files.append(await self._one(account, job_id, fresh[index], dirs, folder,
                                                 file_name))
            return files
        except (DownloadRefused, UrlExpired):
            await asyncio.to_thread(_remove_if_empty, dirs.base, name)
            raise
        finally:
            dirs.close()

    async def _one(self, account: str, job_id: str, url: str, dirs: _Dirs, folder: Path,
                   name: str) -> MediaFile:
        part = folder / f".{name}.part"
        try:
            if await asyncio.to_thread(_plain_file, dirs.job, name):
                # complete and renamed before a crash kept it from being recorded
                size, digest = await asyncio.to_thread(_hash_file, dirs.job, name)
            elif url.startswith(INLINE_PREFIX):
                size, digest = await self._inline(account, job_id, url, dirs, part, name)
            else:
                size, digest = await self._fetch(account, url, dirs, part, name)
        except OSError as exc:
            raise _disk_error(exc, part) from exc
        return MediaFile(str(folder / name), size, digest, shown_url(url))

    async def _inline(self, account: str, job_id: str, url: str, dirs: _Dirs, part: Path,
                      name: str) -> tuple[int, str]:
        """Write an inline video's bytes (`inline_fetch`) as a fetched file is written: into
        `part` under its lock, fsync, rename to `name`; (size, sha256)."""
        found = _INLINE.fullmatch(url)
        if found is None:
            raise DownloadRefused(f"{url[:40]!r} is not an inline video's name (inline:N)")
        if self._inline_fetch is None:
            raise DownloadRefused(f"{url}: this downloader reads no inline media (no client "
                                  "of the account was given to it)")
        out = await asyncio.to_thread(_open_locked, dirs.job, part)
        try:
            data = await self._inline_fetch(account, job_id, int(found.group(1)))
            limit = self.policy.limits.max_bytes
            if len(data) > limit:
                raise DownloadRefused(f"{url}: {len(data)} bytes, larger than the download "
                                      f"limit ({limit} bytes, VIDPOLL_DOWNLOAD_MAX_BYTES)")
            digest = await asyncio.to_thread(_write_whole, out, data)
            await asyncio.to_thread(_sync_and_publish, out, dirs, part.name, name)
            return len(data), digest
        except DownloadRefused:
            await asyncio.to_thread(_discard, out, dirs.job, part.name)
            raise
        finally:
            out.close()  # also releases the lock

    async def _fetch(self, account: str, url: str, dirs: _Dirs, part: Path, name: str
                     ) -> tuple[int, str]:
        """Stream `url` into `part` (resuming what it holds) under an exclusive lock, fsync
        it and rename it to `name` still holding the lock; (size, sha256). A refused URL or
        size, or an expired link, removes the partial file (the next link may be a fresh one
        of another file, or none at all: the provider may have deleted it)."""
        out = await asyncio.to_thread(_open_locked, dirs.job, part)
        try:
            return await self._fill(account, url, out, dirs, part.name, name)
        except (DownloadRefused, UrlExpired):
            await asyncio.to_thread(_discard, out, dirs.job, part.name)
            raise
        finally:
            out.close()  # also releases the lock

    async def _fill(self, account: str, url: str, out: BinaryIO, dirs: _Dirs, part: str,
                    name: str) -> tuple[int, str]:
        offset = os.fstat(out.fileno()).st_size
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        shown = shown_url(url)
        hasher = hashlib.sha256()
        async with self._guard.get(account, url, headers=headers, held=offset) as resp:
            if resp.status in EXPIRED_STATUSES:
                raise UrlExpired(f"{shown} answered HTTP {resp.status}: the link expired")
            content_range = resp.headers.get("Content-Range", "")
            if resp.status == 416:
                if content_range == f"bytes */{offset}":  # complete before a crash
                    await asyncio.to_thread(_hash_into, out, hasher, offset)
                    await asyncio.to_thread(_sync_and_publish, out, dirs, part, name)
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
            while chunk := await resp.read():
                batch += chunk
                if len(batch) >= WRITE_BATCH_BYTES:
                    await asyncio.to_thread(_write, out, hasher, bytes(batch))
                    written += len(batch)
                    batch.clear()
            if batch:
                await asyncio.to_thread(_write, out, hasher, bytes(batch))
                written += len(batch)
        if expected is not None and written != expected:
            raise DownloadError(f"{shown}: got {written} of {expected} bytes; resumed next time")
        await asyncio.to_thread(_sync_and_publish, out, dirs, part, name)
        return written, hasher.hexdigest()


def _open_dirs(base: Path, name: str) -> _Dirs:
    """Create (if needed) and open the download directory and the job's directory in it,
    the latter never through a symbolic link."""
    base.mkdir(parents=True, exist_ok=True)
    base_fd = os.open(base, _DIRECTORY)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, dir_fd=base_fd)
        try:
            job_fd = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=base_fd)
        except NotADirectoryError:  # what Linux says of a link opened this way
            if stat.S_ISLNK(os.stat(name, dir_fd=base_fd, follow_symlinks=False).st_mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP)) from None
            raise
    except BaseException:
        os.close(base_fd)
        raise
    return _Dirs(base_fd, job_fd)


def _remove_if_empty(base_fd: int, name: str) -> None:
    """Remove a job's directory that holds nothing (a refused download leaves no trace)."""
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=base_fd)


def _plain_file(dir_fd: int, name: str) -> bool:
    """Whether `name` is a regular file with no other link (not a symbolic link to one)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _open_locked(dir_fd: int, part: Path) -> BinaryIO:
    """Open (or create) the partial file, never through a link, and lock it, so two
    downloads of one file (two workers after a lost lease) never write into it at once."""
    fd = os.open(part.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                 dir_fd=dir_fd)
    out = os.fdopen(fd, "r+b")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise DiskError(f"cannot write {part}: it is not a plain file of its own (a "
                            "device, a pipe or a hard link to another file); not written")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # the lock holder may have published it meanwhile: then this is the final file
        try:
            now = os.stat(part.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise DownloadError(f"{part.name} was published meanwhile")
    except BlockingIOError:
        out.close()
        raise DownloadError(f"another download of {part.name} is running") from None
    except BaseException:
        out.close()
        raise
    return out


def _discard(out: BinaryIO, dir_fd: int, part: str) -> None:
    """Remove the partial file `out` holds (locked), if its name still leads to it."""
    with contextlib.suppress(FileNotFoundError):
        st = os.fstat(out.fileno())
        now = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.unlink(part, dir_fd=dir_fd)


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


def _write_whole(out: BinaryIO, data: bytes) -> str:
    """`out` made to hold exactly `data` (whatever it held before); its sha256."""
    _restart(out)
    hasher = hashlib.sha256()
    view = memoryview(data)
    for start in range(0, len(data), WRITE_BATCH_BYTES):
        _write(out, hasher, view[start:start + WRITE_BATCH_BYTES])
    return hasher.hexdigest()


def _write(out: BinaryIO, hasher: hashlib._Hash, data: bytes | memoryview) -> None:
    out.write(data)
    hasher.update(data)


def _sync_and_publish(out: BinaryIO, dirs: _Dirs, part: str, name: str) -> None:
    """fsync the file, rename it into place (a link there is replaced, never followed), and
    make the rename (and the job's directory entry) durable."""
    out.flush()
    os.fsync(out.fileno())
    os.replace(part, name, src_dir_fd=dirs.job, dst_dir_fd=dirs.job)
    os.fsync(dirs.job)
    os.fsync(dirs.base)


def _hash_file(dir_fd: int, name: str) -> tuple[int, str]:
    hasher = hashlib.sha256()
    size = 0
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        while data := f.read(WRITE_BATCH_BYTES):
            hasher.update(data)
            size += len(data)
    return size, hasher.hexdigest()
