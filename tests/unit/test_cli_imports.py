"""The `vidpoll` command starts fast (issue 19): importing vidpoll.cli and showing `--help` or
`submit --help` loads neither aiohttp, psycopg nor the fake provider; a command loads them in
its body, when it runs. Checked in a fresh interpreter (this one has them loaded already), so
it holds for what the user's shell starts, not for what the test run happened to import.
The public API stays importable by name (`from vidpoll import Vidpoll`), imported on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import vidpoll

MUST_WAIT = ("aiohttp", "psycopg", "psycopg_pool", "vidpoll.providers.sume.fake")
"""Modules a command may load only once it runs (a submodule loaded loads these too)."""

PROBE = """
import json, sys
import vidpoll.cli
from vidpoll.cli import main

def loaded():
    return [m for m in {must_wait!r} if m in sys.modules]

seen = {{"import vidpoll.cli": loaded()}}
for argv in {argvs!r}:
    try:
        main(argv, standalone_mode=False)
    except SystemExit:
        pass
    seen["vidpoll " + " ".join(argv)] = loaded()
print(json.dumps(seen))
"""


def loaded_by(argvs: list[list[str]]) -> dict[str, list[str]]:
    """What of MUST_WAIT a fresh interpreter holds after `import vidpoll.cli`, then after each
    `vidpoll ARGV` run in it, in order."""
    code = PROBE.format(must_wait=MUST_WAIT, argvs=argvs)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    seen: dict[str, list[str]] = json.loads(proc.stdout.splitlines()[-1])
    return seen


@pytest.mark.parametrize("argv", [["--help"], ["submit", "--help"]], ids=" ".join)
def test_help_loads_no_http_database_or_fake(argv: list[str]) -> None:
    seen = loaded_by([argv])
    assert seen == {"import vidpoll.cli": [], f"vidpoll {' '.join(argv)}": []}, seen


def test_every_public_name_is_there_on_first_use() -> None:
    for name in vidpoll.__all__:
        assert getattr(vidpoll, name).__name__ == name
        assert name in dir(vidpoll)
    assert isinstance(vidpoll.__version__, str) and vidpoll.__version__
    from vidpoll import Vidpoll
    from vidpoll.api import Vidpoll as Defined

    assert Vidpoll is Defined
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        vidpoll.Nothing  # noqa: B018  # an unknown name is still an AttributeError


def test_a_bad_event_loop_setting_is_one_line_and_exit_2() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "VIDPOLL_EVENT_LOOP": "tokio", "DATABASE_URL": "postgresql:///x"}
    done = subprocess.run([sys.executable, "-m", "vidpoll.cli", "jobs", "list"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "VIDPOLL_EVENT_LOOP must be one of auto, asyncio, uvloop, not 'tokio'" in done.stderr
