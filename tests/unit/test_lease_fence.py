"""LeaseFence, the watchdog that ends a process before a lease lapses under a running hook
(the end is injected here; tests/integration/test_hook_exclusive.py lets it end a worker)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from vidpoll.deliver import LOST_LEASE_EXIT_CODE, HeldLease, LeaseFence, fence_margin_s


class Ended:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.at: list[float] = []
        self.event = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.at.append(time.monotonic())
        self.event.set()


def critical(caplog: pytest.LogCaptureFixture) -> str:
    """The one critical message, once the fence's logging thread has written it."""
    deadline = time.monotonic() + 10
    while not (found := [r for r in caplog.records if r.levelno == logging.CRITICAL]):
        assert time.monotonic() < deadline, "no critical log line"
        time.sleep(0.01)
    [record] = found
    return record.getMessage()


def test_the_margin_is_a_sixth_of_the_lease_and_at_most_two_seconds():
    assert fence_margin_s(3.0) == 0.5
    assert fence_margin_s(0.6) == pytest.approx(0.1)
    assert fence_margin_s(30.0) == 2.0


def test_a_hook_still_held_when_its_lease_is_about_to_lapse_ends_the_process(caplog):
    ended = Ended()
    fence = LeaseFence(0.2, ended)
    lease = HeldLease(time.monotonic() + 0.3)
    fence.hold(lease, "job j1: hook h (in its thread)")
    assert ended.event.wait(30)
    assert ended.codes == [LOST_LEASE_EXIT_CODE]
    assert ended.at[0] >= lease.ends_at - 0.1  # not before half the margin is left
    assert critical(caplog).startswith("job j1: hook h (in its thread) still runs")


def test_an_extended_lease_is_waited_for_and_a_released_one_never_ends_anything(caplog):
    ended = Ended()
    fence = LeaseFence(0.2, ended)
    now = time.monotonic()
    # seconds of room (the watchdog acts at the margin, 0.1 s before): a machine that stalls
    # this test for up to ~5 s between two lines still extends and releases in time
    extended, released = HeldLease(now + 5), HeldLease(now + 5)
    fence.hold(extended, "extended")
    release = fence.hold(released, "released")
    release()
    release()  # twice is harmless
    extended.ends_at = now + 3600  # a heartbeat got through
    sentinel = HeldLease(now + 5.5)
    fence.hold(sentinel, "sentinel")  # ends it, after the other two would have
    assert ended.event.wait(10)
    assert ended.codes == [LOST_LEASE_EXIT_CODE]
    assert critical(caplog).startswith("sentinel still runs")


def test_the_watchdog_runs_only_while_something_is_held():
    fence = LeaseFence(0.2, Ended())
    release = fence.hold(HeldLease(time.monotonic() + 3600), "a long hook")
    watchdog = fence._watchdog
    assert watchdog is not None and watchdog.is_alive()
    release()
    watchdog.join(10)
    assert not watchdog.is_alive()
