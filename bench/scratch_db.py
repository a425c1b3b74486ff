"""A throw-away database for one benchmark run: DATABASE_URL's server, else the embedded one."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from vidpoll.embedded import start_embedded
from vidpoll.store import create_database_if_missing, drop_database


@contextmanager
def scratch_database() -> Iterator[str]:
    """Create `bench_<random>`, yield its URL, drop it afterwards (even on failure)."""
    admin = os.environ.get("DATABASE_URL") or start_embedded(
        Path(os.environ.get("VIDPOLL_HOME")
             or Path(tempfile.gettempdir()) / "vidpoll-bench"), database="postgres")
    name = f"bench_{uuid.uuid4().hex[:8]}"
    create_database_if_missing(admin, name)
    try:
        yield psycopg.conninfo.make_conninfo(admin, dbname=name)
    finally:
        drop_database(admin, name)
