"""The completion hook chaos workers run (`--on-terminal tests.chaos.hook:record`).

Each call appends one line to the file CHAOS_HOOK_LOG names, with O_APPEND so lines from
several processes never interleave; a kill -9 after the write keeps it (the page cache
outlives the process), so the harness sees every call that returned.
"""

from __future__ import annotations

import os

from vidpoll.models import Job


def record(job: Job) -> None:
    """Append `job_id state pid` to the hook log."""
    line = f"{job.job_id} {job.state} {os.getpid()}\n".encode()
    fd = os.open(os.environ["CHAOS_HOOK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
