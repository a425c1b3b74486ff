"""What tests/integration/test_shutdown_grace.py runs: hooks that mark their runs in a file,
and a worker process (`python -m tests.integration.shutdown_fixtures DATABASE_URL`) whose
sync hook outlives its grace period.

A hook holds an exclusive flock on HOOK_LOCK while it runs (the kernel drops it when the
holder's process ends), so a run that starts beside another one is seen by the hook itself
and marked `beside`.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.models import Job
from vidpoll.policy import PollPolicy
from vidpoll.store import PgStore

HOOK_NAME = "shutdown:hook"
"""The hook's name in both workers (its deliveries: `hook:shutdown:hook`)."""
CONSUMER = f"hook:{HOOK_NAME}"


def mark(log: Path, word: str, who: str) -> None:
    """One line `word who pid`, on disk before this returns."""
    with log.open("a") as f:
        f.write(f"{word} {who} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


def marks(log: Path) -> list[tuple[str, str, int]]:
    """(word, who, pid) of every line marked so far."""
    if not log.exists():
        return []
    return [(word, who, int(pid)) for word, who, pid in
            (line.split() for line in log.read_text().splitlines())]


def exclusive_run(log: Path, lock: Path, who: str, block: Path | None) -> None:
    """Mark a run's start and end under an exclusive flock on `lock` (`beside` if another run
    holds it); block while the file `block` exists."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            mark(log, "beside", who)
            return
        mark(log, "start", who)
        while block is not None and block.exists():
            time.sleep(0.02)
        mark(log, "end", who)
    finally:
        os.close(fd)


def blocking_hook(job: Job) -> None:
    """The worker process's sync hook: runs while HOOK_BLOCK exists."""
    exclusive_run(Path(os.environ["HOOK_LOG"]), Path(os.environ["HOOK_LOCK"]), "first",
                  Path(os.environ["HOOK_BLOCK"]))


async def _serve(url: str) -> None:
    store = await PgStore.open(url, max_size=4)
    try:
        deliverer = Deliverer(store, DeliveryConfig(
            hooks={HOOK_NAME: blocking_hook}, lease_s=3.0,
            shutdown_timeout_s=float(os.environ["SHUTDOWN_TIMEOUT_S"]),
            policy=PollPolicy(min_poll_s=0.05, backoff_base_s=0.1, backoff_max_s=0.5)))
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, deliverer.stop)
        await deliverer.run()
    finally:
        await store.close()


def main(argv: list[str]) -> Any:
    """Deliver with `blocking_hook` until SIGTERM."""
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(_serve(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
