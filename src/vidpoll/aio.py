"""Small asyncio helpers every layer may use."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait until it has ended, re-raising what it ended with, but never
    its CancelledError and never swallowing a cancellation of the caller.

    `task.cancel(); with suppress(CancelledError): await task` swallows both: a caller
    cancelled while it waits there goes on as if nothing happened. A listener did that while
    subscribing, and the runner that had cancelled it waited for it forever (a `--drain` that
    never ended, about one run in ten).
    """
    if task is None:
        return
    if not task.done():
        task.cancel()
        await asyncio.wait([task])  # raises only if the caller itself is cancelled
    if not task.cancelled():
        task.result()  # what it ended with instead, if anything


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set, at most `seconds`; whether it was set.

    Not `asyncio.wait_for(event.wait(), seconds)`: on Python 3.11 that loses a cancellation
    arriving in the same turn of the loop as the event (CPython gh-86296), and a loop that
    sleeps this way then ignores its stop (seen: a cancelled submitter sending on)."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


def honour_cancel() -> None:
    """Raise CancelledError if the running task was cancelled but goes on (a library's
    `asyncio.wait_for` on Python 3.11 can swallow the cancellation, CPython gh-86296:
    psycopg_pool's wait for a connection is one; `Task.cancelling()` still counts it). The
    loops call it each turn, so a cancelled loop ends at its next turn, whatever swallowed
    the first CancelledError."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
