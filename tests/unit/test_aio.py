"""cancel_and_wait: a stop that arrives while a helper is being stopped is never lost."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from vidpoll.aio import cancel_and_wait


def _slow_to_stop(release: asyncio.Event, ends_with: BaseException) -> asyncio.Task[None]:
    async def helper() -> None:
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            await release.wait()  # then it takes a while to end
            raise ends_with from None

    return asyncio.create_task(helper())


async def test_a_caller_cancelled_while_it_waits_is_cancelled() -> None:
    release = asyncio.Event()
    helper = _slow_to_stop(release, asyncio.CancelledError())
    await asyncio.sleep(0)  # the helper waits
    caller = asyncio.create_task(cancel_and_wait(helper))
    await asyncio.sleep(0)  # the caller has cancelled the helper and waits for it
    assert not caller.done() and not helper.done()
    caller.cancel()  # a stop for the caller, while it waits
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller  # `with suppress(CancelledError): await helper` returned normally here
    await asyncio.wait([helper])
    assert helper.cancelled()


async def test_the_helpers_own_cancellation_is_not_raised_but_its_error_is() -> None:
    release = asyncio.Event()
    release.set()
    quiet = _slow_to_stop(release, asyncio.CancelledError())
    broken = _slow_to_stop(release, RuntimeError("broke while stopping"))
    await asyncio.sleep(0)  # both wait
    await cancel_and_wait(quiet)
    assert quiet.cancelled()
    with pytest.raises(RuntimeError, match="broke while stopping"):
        await cancel_and_wait(broken)
    with pytest.raises(RuntimeError, match="broke while stopping"):
        await cancel_and_wait(broken)  # ended already: still what it ended with
    await cancel_and_wait(None)


async def test_a_cancel_arriving_with_the_wake_up_is_never_lost():
    # asyncio.wait_for(event.wait(), t) on Python 3.11 returns normally when the event is set
    # and the waiter cancelled in the same turn of the loop (CPython gh-86296): a loop
    # sleeping so then ignores its stop. wait_event must end cancelled every time.
    from vidpoll.aio import wait_event

    for _ in range(50):
        event = asyncio.Event()
        task = asyncio.create_task(wait_event(event, 30.0))
        await asyncio.sleep(0)  # the task now waits on the event
        event.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await wait_event(asyncio.Event(), 0.01) is False
    done = asyncio.Event()
    done.set()
    assert await wait_event(done, 5.0) is True


async def test_a_cancel_a_library_swallowed_ends_the_loop_at_its_next_turn():
    from vidpoll.aio import honour_cancel

    turned = asyncio.Event()

    async def loop() -> None:
        while True:
            honour_cancel()
            turned.set()
            # what a library's wait_for on Python 3.11 may do with a cancellation
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    task = asyncio.create_task(loop())
    await turned.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    honour_cancel()  # this task was never cancelled: nothing happens
