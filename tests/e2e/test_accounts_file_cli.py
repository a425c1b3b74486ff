"""A bad accounts file stops the real `vidpoll` command at start: one line, exit 2.

Run as a user runs it: the installed command, in a working directory holding a bad
`vidpoll.toml` (found there with VIDPOLL_CONFIG unset), before any database is reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

VIDPOLL = str(Path(sys.executable).with_name("vidpoll"))
SECRET = "sk-live-9f8e7d6c5b4a3210"
ENV_KEY = "sk-env-4c3b2a1f0e9d"


def test_a_key_written_into_vidpoll_toml_is_one_line_naming_account_and_field(tmp_path):
    (tmp_path / "vidpoll.toml").write_text(
        '[accounts.rep]\nprovider = "sume"\napi_key_env = "REP_TOKEN"\n'
        f'api_key = "{SECRET}"\n')
    env = {k: v for k, v in os.environ.items()
           if k != "DATABASE_URL" and not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(REP_TOKEN=ENV_KEY, VIDPOLL_EMBEDDED="off")
    commands = [("jobs", "list"), ("doctor",), ("--log-format", "json", "jobs", "list")]
    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(pool.map(lambda args: subprocess.run(
            [VIDPOLL, *args], cwd=tmp_path, env=env, text=True, capture_output=True,
            timeout=60, check=False), commands))
    expected = (f"{tmp_path / 'vidpoll.toml'}: [accounts.rep] api_key: keys never go in the "
                'file: set api_key_env = "NAME" and export NAME (the value is not shown)')
    for args, result in zip(commands, results, strict=True):
        assert result.returncode == 2, (args, result.returncode, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (args, result.stderr)
        shown = result.stdout + result.stderr
        assert SECRET not in shown and ENV_KEY not in shown, (args, result.stderr)
        if "json" in args:
            line = json.loads(lines[0])
            assert (line["level"], line["msg"]) == ("error", expected), (args, line)
        else:
            assert lines[0] == f"error: {expected}", (args, lines[0])
