"""The one LISTEN connection every subscriber of a store shares (PgStore.notifications), and
the channels vidpoll NOTIFYs on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg

from vidpoll.aio import cancel_and_wait
from vidpoll.errors import DatabaseUnavailable
from vidpoll.models import Notice
from vidpoll.schema import _first_line
from vidpoll.store.pool import translate_errors

JOBS_CHANNEL = "vidpoll_jobs"
"""NOTIFY channel: rows inserted or made due sooner (wakes pollers)."""
INTENTS_CHANNEL = "vidpoll_intents"
"""NOTIFY channel: intents recorded or re-queued (wakes submitters)."""
JOB_DONE_CHANNEL = "vidpoll_job_done"
"""NOTIFY channel: a job left `pending`; the payload is its id (wakes waiters, submitters)."""


class Listener:
    """One LISTEN connection shared by every subscriber of a store.

    A subscriber names its channels; a channel nobody listened to yet is added with LISTEN
    (the reader steps out of notifies() for it; psycopg keeps what arrives meanwhile). Each
    NOTIFY goes to the subscribers of its channel. When the connection drops, every
    subscriber's iterator raises DatabaseUnavailable and the next subscribe reconnects; the
    connection closes when its last subscriber leaves.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: set[str] = set()
        self._subscribers: dict[int, tuple[frozenset[str], asyncio.Queue[Notice | Exception]]] \
            = {}
        self._lock = asyncio.Lock()

    async def subscribe(self, channels: Sequence[str]) -> AsyncIterator[Notice]:
        queue: asyncio.Queue[Notice | Exception] = asyncio.Queue()
        async with self._lock:
            await self._listen(channels)
            self._subscribers[id(queue)] = (frozenset(channels), queue)
        try:
            yield Notice("", "")
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self._subscribers.pop(id(queue), None)
            if not self._subscribers:
                async with self._lock:
                    if not self._subscribers:
                        await self._drop()

    async def _listen(self, channels: Sequence[str]) -> None:
        """Connected and listening on `channels` (caller holds the lock)."""
        async with translate_errors():
            if self._conn is None or self._conn.closed:
                await self._drop()
                self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
            new = [c for c in dict.fromkeys(channels) if c not in self._channels]
            if new:
                await self._stop_reader()
                for channel in new:
                    await self._conn.execute(psycopg.sql.SQL("LISTEN {}").format(
                        psycopg.sql.Identifier(channel)))
                    self._channels.add(channel)
            if self._reader is None:
                self._reader = asyncio.create_task(self._read(self._conn),
                                                   name="vidpoll-listener")

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            async for note in conn.notifies():
                for wanted, queue in list(self._subscribers.values()):
                    if note.channel in wanted:
                        queue.put_nowait(Notice(note.channel, note.payload))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection dropped: every subscriber reconnects
            lost = DatabaseUnavailable(f"the LISTEN connection dropped: {_first_line(exc)}")
            lost.__cause__ = exc
            subscribers = list(self._subscribers.values())
            self._subscribers.clear()
            for _, queue in subscribers:
                queue.put_nowait(lost)
            self._reader = None
            self._channels.clear()
            with contextlib.suppress(Exception):
                await conn.close()

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        await cancel_and_wait(reader)

    async def _drop(self) -> None:
        await self._stop_reader()
        conn, self._conn = self._conn, None
        self._channels.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._drop()
