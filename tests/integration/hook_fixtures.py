"""Hooks the process tests start workers with (`--on-terminal
tests.integration.hook_fixtures:record`); they report through files named in the env."""

from __future__ import annotations

import os
import time
from pathlib import Path

from vidpoll.models import Job


def _log(line: str) -> None:
    with Path(os.environ["HOOK_LOG"]).open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def record(job: Job) -> None:
    """Log the call; hang while the file HOOK_BLOCK exists (so a test can kill -9 us)."""
    _log(f"start {job.job_id}")
    block = os.environ.get("HOOK_BLOCK")
    while block and Path(block).exists():
        time.sleep(0.05)
    _log(f"done {job.job_id} {job.state} files={len(job.files)}")


def record_cost(job: Job) -> None:
    """Log what the job cost and its tags, as a hook sees them."""
    _log(f"cost {job.job_id} {job.cost} {job.provider_cost} {job.provider_cost_unit} "
         f"{sorted((job.tags or {}).items())}")
