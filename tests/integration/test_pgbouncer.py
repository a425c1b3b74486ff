"""The distributed path of docs/SCALING.md: workers through PgBouncer in transaction mode
(`--claim lease --no-listen`, VIDPOLL_DB_PREPARE=off), against a real PgBouncer that hands
each transaction whichever of its two server connections is free."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from vidpoll.store import PgStore

from ..conftest import free_port, run_until

PGBOUNCER = os.environ.get("VIDPOLL_PGBOUNCER") or shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer")


@pytest.fixture
def bouncer_url(db_url: str) -> Iterator[str]:
    """A PgBouncer (transaction pooling, 2 server connections) in front of db_url's server."""
    assert Path(PGBOUNCER).exists(), (
        f"PgBouncer not found at {PGBOUNCER}: `make test` installs Debian's pgbouncer; or set "
        "VIDPOLL_PGBOUNCER")
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    host = str(info.get("host") or "127.0.0.1")
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="vp-bouncer-"))
    work.chmod(0o755)
    ini = work / "pgbouncer.ini"
    ini.write_text(f"""[databases]
* = host={host} port={info.get("port") or 5432} user={info.get("user") or "postgres"}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
ignore_startup_parameters = extra_float_digits
""")
    ini.chmod(0o644)
    cmd = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        owner = pwd.getpwuid(Path(host).stat().st_uid).pw_name if host.startswith("/") else (
            "nobody")
        cmd[1:1] = ["-u", owner]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = psycopg.conninfo.make_conninfo("", host="127.0.0.1", port=port,
                                         dbname=info["dbname"], user=info.get("user") or
                                         "postgres")
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(url, prepare_threshold=None).close()
                break
            except psycopg.OperationalError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "PgBouncer did not come up"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(work, ignore_errors=True)


async def test_a_worker_polls_through_pgbouncer_in_transaction_mode(
        bouncer_url, store, fake, make_worker):
    for i in range(40):
        fake.add_job(f"pb{i}")
        await store.add_job(f"pb{i}", delay_s=-1)
    through = await PgStore.open(bouncer_url, max_size=4, prepare=False)
    try:
        worker = make_worker(listen=False, concurrency=8, batch_size=4, vacuum_every_rows=20)
        worker.store = through
        # dozens of claims and writes: far past psycopg's fifth use, when it would prepare
        await run_until(worker, lambda: worker.stats.finished == 40 and worker.stats.vacuums
                        >= 1, within_s=30)
    finally:
        await through.close()
    assert worker.stats.db_errors == 0 and worker.stats.fenced_out == 0
    # the table (read directly, not through PgBouncer) agrees
    assert await store.has_pending() is False
