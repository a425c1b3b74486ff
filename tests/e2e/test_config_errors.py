"""A bad setting is one line on stderr and exit 2, never a traceback, never a secret.

Run as a user runs it: the installed `vidpoll` command, as subprocesses (several at once, to
keep the matrix quick), in text and JSON log formats.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vidpoll import logs
from vidpoll.errors import ConfigError
from vidpoll.schema import check_database_url

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


# passwords of every length and with every character that upsets a parser; their pieces are
# distinctive, so that finding one in a message can only be a leak
PASSWORDS = ["Q7", "Zq7", "Kx9Wv2p", "Mj4Rt8Yb2", 'Lq8"Tn4Wz', "Hv3 Bk7Pd", "Fg5@Nh2",
             "Cz6:Jq3", "Dm2%Xw9", "Pw4'Qe7", "Vb8\\Yn1", "Ŧü9ßÅ"]
FORMS = [
    "postgres:{pw}@127.0.0.1:5432/db",  # the scheme left off
    '"postgres:{pw}@127.0.0.1:5432/db"',  # ... and in quotes (docker --env-file keeps them)
    "'postgresql://u:{pw}@127.0.0.1:5432/db'",
    '"postgresql://u:{pw}@h:5432/db"',
    "postgresql://u:{pw}@[::1/db",
    "postgresql://u:{pw}@h/db?nosuchoption=1",
    "mysql://u:{pw}@h/db",
    "http://u:{pw}@h/db",
    "host=x password={pw} port=abc",
    "host=x password='{quoted}' port=abc",
    "host=x password={pw} nosuch=1",
    'host=x password="{pw}" sslmode=required',
]


def pieces(password: str) -> list[str]:
    """The password, and each piece of it (split at the characters parsers split at) that is
    at least 3 characters long."""
    return [password, *(p for p in re.split(r"[\s\"'@:%\\]+", password) if len(p) >= 3)]


def test_no_piece_of_a_database_password_is_ever_shown(monkeypatch, own_logging):
    """The pure path of every bad DATABASE_URL (check_database_url, then logs.say as the CLI
    prints it), text and JSON: neither the message nor the line quotes the password or a
    piece of it, whatever its length or characters, however libpq pairs quotes."""
    leaks = []
    for password in PASSWORDS:
        quoted = password.replace("\\", "\\\\").replace("'", "\\'")
        for form in FORMS:
            url = form.format(pw=password, quoted=quoted)
            monkeypatch.setenv("DATABASE_URL", url)
            try:
                check_database_url(url)
            except ConfigError as exc:
                message = str(exc)
            else:
                continue  # parses: libpq refuses it at connect time (the subprocess test)
            for fmt in ("text", "json"):
                logs.setup("INFO", fmt)
                line = logs.say("error", message)
                leaks += [(url, fmt, piece, where) for piece in pieces(password)
                          for where, text in (("message", message), ("line", line))
                          if piece in text]
    assert leaks == []


def test_the_database_password_is_redacted_by_say_at_any_length(monkeypatch, own_logging):
    """Should a message ever quote it, say() blanks the database password out: 3 characters
    and more anywhere, shorter ones where they stand as a word."""
    for password in ["Q7", "Zq7", "Kx9Wv2p", 'Lq8"Tn4Wz', "Hv3 Bk7Pd"]:
        monkeypatch.setenv("DATABASE_URL", f'"postgres:{password}@127.0.0.1:5432/db"')
        logs.setup("INFO", "text")
        line = logs.say("error", f'missing "=" after ""postgres:{password}@127.0.0.1""')
        assert password not in line, line
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:Q7@h/db")
    logs.setup("INFO", "json")
    assert "Q7" not in logs.say("error", "x Q7 y") and "AQ7B" in logs.say("error", "AQ7B")


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
    # passwords libpq quotes in its messages (short, with a quote, with a space), in quotes as
    # docker --env-file keeps them, without the scheme: text and JSON
    quoted = [f'"postgres:{pw}@127.0.0.1:5432/db"' for pw in ("Kx9Wv2p", 'Lq8"Tn4Wz', "Hv3 Bk7Pd")]
    for url in quoted:
        cases.append((base_env(DATABASE_URL=url), ("jobs", "list")))
        cases.append((base_env(DATABASE_URL=url), ("--log-format", "json", "migrate")))
    results = run_all(cases)
    expected = ([code for _, code in MALFORMED] + [code for _, code in json_urls]
                + [code for _, code in migrate_urls] + [2] * 2 * len(quoted))
    for (env, args), result, code in zip(cases, results, expected, strict=True):
        what = (env["DATABASE_URL"], args)
        secret = next((pw for pw in ("Kx9Wv2p", 'Lq8"Tn4Wz', "Hv3 Bk7Pd")
                       if pw in env["DATABASE_URL"]), PASSWORD)
        message = assert_one_clean_line(result, code, secret, what,
                                        json_format="json" in args)
        for piece in pieces(secret):
            assert piece not in result.stdout + result.stderr, (what, piece, result.stderr)
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


def test_serve_without_a_webhook_secret_and_a_host_not_here_are_one_line(db_url, taken_port):
    """The missing webhook secret is a warning said once serve runs, not before its error; an
    address not on this machine names --host (the port is not the problem)."""
    env = base_env(DATABASE_URL=db_url)
    in_use, bad_url, not_here = run_all([
        (env, ("serve", "--port", str(taken_port))),
        (base_env(DATABASE_URL="mysql://u:Kx9Wv2p@h/db"), ("serve",)),
        (env, ("fake-sume", "--host", "10.255.255.1", "--port", "0")),
    ])
    assert "already in use" in assert_one_clean_line(in_use, 2, API_KEY, "serve, port in use")
    message = assert_one_clean_line(bad_url, 2, "Kx9Wv2p", "serve, mysql:// DATABASE_URL")
    assert "postgresql:// or postgres://" in message, message
    message = assert_one_clean_line(not_here, 2, API_KEY, "fake-sume --host elsewhere")
    assert "10.255.255.1 is not an address of this machine" in message, message
    assert message.endswith("choose another with --host"), message


def test_control_characters_and_garbled_base_urls_are_one_line_naming_the_variable(db_url):
    """A key pasted with a control character or a line break (sent as typed, it would make
    the HTTP client raise), a base URL with a query or an unclosed [IPv6] host: one line,
    exit 2, naming the variable, never the value and never a query string (before anything
    is recorded: the database is a good one)."""
    env = base_env(DATABASE_URL=db_url, SUME_BASE_URL="http://127.0.0.1:1")
    cases = [
        ({**env, "SUME_API_KEY": "sk-ab\x01cdefgh"}, ("submit", "--prompt", "a fox"),
         "SUME_API_KEY"),
        ({**env, "SUME_API_KEY": "sk-ab\ncdefgh"}, ("doctor",), "SUME_API_KEY"),
        ({**env, "SUME_API_KEY_ACME": "sk-ac\tme1234"}, ("--log-format", "json", "doctor"),
         "SUME_API_KEY_ACME"),
        ({**env, "SUME_WEBHOOK_SECRET": "whsec\x7f1234"}, ("serve",), "SUME_WEBHOOK_SECRET"),
        ({**env, "SUME_BASE_URL": "http://127.0.0.1:8900/api?token=Tk9Qz3"},
         ("submit", "--prompt", "a fox"), "SUME_BASE_URL"),
        ({**env, "SUME_BASE_URL": "http://[::1"}, ("jobs", "list"), "SUME_BASE_URL"),
    ]
    results = run_all([(e, a) for e, a, _ in cases])
    for (_, args, variable), result in zip(cases, results, strict=True):
        message = assert_one_clean_line(result, 2, "Tk9Qz3", args, json_format="json" in args)
        assert variable in message, (args, message)
        for value in ("cdefgh", "me1234", "1234", "token"):
            assert value not in result.stderr + result.stdout, (args, result.stderr)
        assert "unparseable" not in message and "scheme://" not in message, message
