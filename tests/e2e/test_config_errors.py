"""A bad setting is one line on stderr and exit 2, never a traceback, never a secret.

Run as a user runs it: the installed `vidpoll` command, as subprocesses (several at once, to
keep the matrix quick), in text and JSON log formats.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ..conftest import API_KEY

pytestmark = pytest.mark.slow

PASSWORD = "S3cretPW"
VIDPOLL = str(Path(sys.executable).with_name("vidpoll"))

# (DATABASE_URL, exit code): 2 for a setting to fix, 3 for a server that does not answer
MALFORMED = [
    (f"postgres:{PASSWORD}@host:5432/db", 2),  # the scheme left off
    (f"u:{PASSWORD}@host", 2),
    (f"postgresql://u:{PASSWORD}@host:notaport/db", 2),
    (f"postgresql://u:{PASSWORD}@[::1/db", 2),
    (f"postgresql://u:{PASSWORD}@host:99999/db", 2),
    (f"postgresql://u:{PASSWORD}@host:0/db", 2),
    (f"host=x password={PASSWORD} port=abc", 2),
    (f"host=x {PASSWORD}", 2),
    (f"postgresql://u:{PASSWORD}@/db?sslmode=bogus", 2),
    (f"postgresql://u:{PASSWORD}@127.0.0.1/db?keepalives=often", 2),
    (f"postgresql://u:{PASSWORD}@127.0.0.1/db?nosuchoption=1", 2),
    (f"postgresql://u:{PASSWORD[:3]}%zz{PASSWORD[3:]}@h/db", 2),
    (f"postgresql://u:{PASSWORD}@127.0.0.1:1/db?connect_timeout=2", 3),  # unreachable
]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != "DATABASE_URL" and not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(SUME_API_KEY=API_KEY, VIDPOLL_EMBEDDED="off", **extra)
    return env


def run(env: dict[str, str], *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([VIDPOLL, *args], env=env, text=True, capture_output=True,
                          timeout=timeout, check=False)


def run_all(cases: Sequence[tuple[dict[str, str], tuple[str, ...]]]
            ) -> list[subprocess.CompletedProcess[str]]:
    """Each (env, args) at once, four at a time (each start of vidpoll costs ~0.5 s)."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda case: run(case[0], *case[1]), cases))


def assert_one_clean_line(result: subprocess.CompletedProcess[str], code: int,
                          secret: str, what: object, json_format: bool = False) -> str:
    assert result.returncode == code, (what, result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, (what, result.stderr)
    assert "Traceback" not in result.stderr, what
    assert secret not in result.stdout + result.stderr, (what, result.stderr)
    if json_format:
        line = json.loads(lines[0])  # every line is JSON in this format
        assert line["level"] == "error", (what, line)
        return str(line["msg"])
    assert lines[0].startswith("error: "), (what, lines[0])
    return lines[0]


def test_every_malformed_database_url_is_one_line_without_the_password():
    cases = []
    for url, _ in MALFORMED:
        cases.append((base_env(DATABASE_URL=url), ("jobs", "list")))
    # the JSON log format for a few, another command for others: the same one line
    json_urls = [MALFORMED[0], MALFORMED[3], MALFORMED[6], MALFORMED[-1]]
    for url, _ in json_urls:
        cases.append((base_env(DATABASE_URL=url), ("--log-format", "json", "jobs", "list")))
    migrate_urls = [MALFORMED[0], MALFORMED[2], MALFORMED[8]]
    for url, _ in migrate_urls:
        cases.append((base_env(DATABASE_URL=url), ("migrate",)))
    results = run_all(cases)
    expected = ([code for _, code in MALFORMED] + [code for _, code in json_urls]
                + [code for _, code in migrate_urls])
    for (env, args), result, code in zip(cases, results, expected, strict=True):
        what = (env["DATABASE_URL"], args)
        message = assert_one_clean_line(result, code, PASSWORD, what,
                                        json_format="json" in args)
        if code == 2:
            assert "DATABASE_URL" in message, (what, message)
        else:
            assert "cannot connect to PostgreSQL" in message, (what, message)


def test_a_malformed_database_url_is_not_read_by_help_and_an_empty_one_is_refused():
    url = MALFORMED[0][0]
    helped, empty = run_all([(base_env(DATABASE_URL=url), ("worker", "--help")),
                             (base_env(DATABASE_URL=""), ("jobs", "list"))])
    assert helped.returncode == 0 and "--metrics-port" in helped.stdout, helped.stderr
    assert PASSWORD not in helped.stdout + helped.stderr
    assert_one_clean_line(empty, 2, PASSWORD, "empty DATABASE_URL")


def test_bad_flags_and_unreadable_files_are_one_line_and_exit_2(tmp_path):
    env = base_env(DATABASE_URL=MALFORMED[0][0])
    (tmp_path / "broken_hook.py").write_text("raise RuntimeError('boom at import')\n")
    results = run_all([
        (env, ("submit", "--json", str(tmp_path / "missing.json"))),
        (env, ("fake-sume", "--port", "99999")),
        (env, ("--log-format", "json", "serve", "--port", "-1")),
        (env, ("worker", "--download-dir", str(tmp_path / "a-file"), "--help-me")),
        ({**env, "PYTHONPATH": str(tmp_path)}, ("worker", "--on-terminal", "broken_hook:f")),
    ])
    for result in results[:-1]:
        message = assert_one_clean_line(result, 2, PASSWORD, result.args,
                                        json_format="json" in result.args)
        assert "--help" in message, message  # says where to look
    message = assert_one_clean_line(results[-1], 2, PASSWORD, "a hook that fails to import")
    assert "RuntimeError: boom at import" in message and "broken_hook" in message


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_port_in_use_is_one_line_and_exit_2(db_url, taken_port):
    env = base_env(DATABASE_URL=db_url, SUME_WEBHOOK_SECRET="whsec-for-serve")
    port = str(taken_port)
    results = run_all([
        (env, ("serve", "--port", port)),
        (env, ("fake-sume", "--port", port)),
        (env, ("worker", "--metrics-port", port)),
        (env, ("--log-format", "json", "worker", "--metrics-port", port)),
    ])
    for result in results:
        json_format = "json" in result.args
        message = assert_one_clean_line(result, 2, API_KEY, result.args,
                                        json_format=json_format)
        assert f"127.0.0.1:{port} is already in use" in message, message
