"""The hook tests/integration/test_hook_exclusive.py starts workers with (`--on-terminal
tests.integration.hook_exclusive_fixture:exclusive`): it notices a run beside another one."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from vidpoll.models import Job

from .hook_fixtures import _log


def exclusive(job: Job) -> None:
    """Hold an exclusive flock on HOOK_LOCK while running (while HOOK_BLOCK exists); a run that
    finds it taken logs `beside`. The kernel drops the lock when the holder's process ends."""
    fd = os.open(os.environ["HOOK_LOCK"], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"beside {job.job_id} {os.getpid()}")
            return
        _log(f"start {job.job_id} {os.getpid()}")
        block = os.environ.get("HOOK_BLOCK")
        while block and Path(block).exists():
            time.sleep(0.05)
        _log(f"done {job.job_id} {os.getpid()}")
    finally:
        os.close(fd)
