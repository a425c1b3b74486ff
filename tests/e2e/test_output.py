"""Quiet, readable output: `jobs list` at 80 columns, newest first, with --order and a cursor
that holds in both orders; `jobs show` with the intent, the result and the files; no Python
reprs; `vidpoll demo` quiet unless asked; `vidpoll --version`."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

import vidpoll.demo
from vidpoll import logs
from vidpoll.cli import main
from vidpoll.cli._common import _stderr
from vidpoll.cli.jobs import short_id
from vidpoll.store import PgStore

pytestmark = pytest.mark.slow

VIDPOLL = str(Path(sys.executable).with_name("vidpoll"))
BASE = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def env_for(db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(DATABASE_URL=db_url, SUME_API_KEY="sk-output-test-key", **extra)
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([VIDPOLL, *args], env=env, text=True, capture_output=True,
                            timeout=60, check=False)
    assert result.returncode == 0, (args, result.stderr)
    return result


def long_id(i: int) -> str:
    return f"vid_{i:02d}_" + "abcdef0123456789" * 2 + f"_{i:04d}"


async def seed(db_url: str) -> list[str]:
    """Seven jobs of long ids, created a minute apart but two at the same instant (the job id
    breaks the tie), of two accounts, one with errors; returned newest first."""
    rows = []
    for i in range(7):
        created = BASE + timedelta(minutes=min(i, 5))  # 5 and 6 at the same instant
        rows.append((long_id(i), created, "acme_long_account" if i % 2 else "default"))
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for job_id, created, account in rows:
            await conn.execute(
                "INSERT INTO video_jobs (job_id, created_at, account, consecutive_errors, "
                "last_error_class, polls) VALUES (%s, %s, %s, %s, %s, 3)",
                (job_id, created, account, 2 if job_id.endswith("3") else 0,
                 "server_error" if job_id.endswith("3") else None))
    return [r[0] for r in sorted(rows, key=lambda r: (r[1], r[0]), reverse=True)]


async def test_jobs_list_fits_80_columns_newest_first_and_orders_both_ways(db_url, store):
    newest = await seed(db_url)
    env = env_for(db_url, COLUMNS="80")
    listed = run(env, "jobs", "list").stdout
    lines = listed.splitlines()
    assert all(len(line) <= 80 for line in lines), "\n" + listed
    rows = [line for line in lines if line.lstrip().startswith("vid_")]
    assert len(rows) == 7, "\n" + listed  # one line per job: nothing wrapped
    assert [row.split()[0] for row in rows] == [short_id(j) for j in newest], "\n" + listed
    assert short_id(newest[0]) == "vid_06_a…0006" and newest[0] not in listed
    assert "server_error" in listed and "newest first" in lines[0]
    oldest = run(env, "jobs", "list", "--order", "oldest").stdout
    assert [r.split()[0] for r in oldest.splitlines() if r.lstrip().startswith("vid_")] == [
        short_id(j) for j in reversed(newest)]
    whole = json.loads(run(env, "jobs", "list", "--json", "--limit", "3").stdout)
    assert [r["job_id"] for r in whole["jobs"]] == newest[:3] and whole["next"]
    # the cursor pages without gap or repeat in either order, ties included
    for order, expected in (("newest", newest), ("oldest", newest[::-1])):
        seen: list[str] = []
        cursor = None
        while True:
            page, cursor = await store.list_jobs(None, limit=2, cursor=cursor, order=order)
            seen += [r["job_id"] for r in page]
            if cursor is None:
                break
        assert seen == expected, order


async def test_jobs_list_orders_finished_rows_both_ways(db_url, store: PgStore):
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for i in range(4):
            await conn.execute("INSERT INTO video_jobs (job_id, state, finished_at) "
                               "VALUES (%s, 'completed', %s)",
                               (f"f{i}", BASE + timedelta(minutes=i)))
    for order, expected in (("newest", ["f3", "f2", "f1", "f0"]),
                            ("oldest", ["f0", "f1", "f2", "f3"])):
        seen: list[str] = []
        cursor = None
        while True:
            page, cursor = await store.list_jobs("finished", limit=3, cursor=cursor,
                                                 order=order)
            seen += [r["job_id"] for r in page]
            if cursor is None:
                break
        assert seen == expected


async def test_jobs_show_shows_the_intent_the_result_and_the_files(db_url, store: PgStore):
    await store.add_intent("order-77-clip-1", {"prompt": "a lighthouse at dawn",
                                               "duration": 8})
    assert await store.resolve_intent("order-77-clip-1", job_id="vid_show_1")
    result = {"job_id": "vid_show_1", "videos": [
        {"url": "https://cdn.example/v/vid_show_1.mp4?sig=SECRETSIG"}]}
    files = {"files": [{"path": "/srv/videos/vid_show_1/vid_show_1.mp4", "size": 123456,
                        "sha256": "ab" * 32, "url": "https://cdn.example/v/vid_show_1.mp4"}]}
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_jobs SET state = 'completed', result = %s, "
                           "result_state = 'fetched', result_fetched_at = now() "
                           "WHERE job_id = 'vid_show_1'", (Jsonb(result),))
        await conn.execute("INSERT INTO vidpoll_deliveries (job_id, consumer, state, detail, "
                           "done_at) VALUES ('vid_show_1', 'download', 'done', %s, now())",
                           (Jsonb(files),))
    shown = run(env_for(db_url, COLUMNS="120"), "jobs", "show", "vid_show_1").stdout
    assert "order-77-clip-1" in shown and "a lighthouse at dawn" in shown, shown
    assert "/srv/videos/vid_show_1/vid_show_1.mp4" in shown and "123456" in shown, shown
    assert "fetched" in shown and "media links" in shown, shown
    assert "SECRETSIG" not in shown and "{'" not in shown and "datetime.datetime" not in shown


async def test_human_output_shows_no_python_reprs(db_url, store: PgStore):
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    await store.add_minutes([((minute, "poll", "default", "server_error"), 3, 0.0, 0.0),
                             ((minute, "poll", "default", "timeout"), 1, 0.0, 0.0),
                             ((minute, "submit", "default", "submitted"), 2, 0.0, 0.0)])
    await store.add_job("j1")
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("INSERT INTO video_job_events (job_id, kind, detail) "
                           "VALUES ('j1', 'note', %s)", (Jsonb({"why": "a test"}),))
    env = env_for(db_url, COLUMNS="200")
    stats = run(env, "jobs", "stats").stdout
    assert "server_error 3, timeout 1" in stats and "submitted 2" in stats, stats
    shown = run(env, "jobs", "show", "j1").stdout
    assert '"why": "a test"' in shown, shown
    for text in (stats, shown):
        assert not re.search(r"\{'|\['|Decimal\(|datetime\.datetime\(", text), text


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_demo_logs_warnings_only_unless_a_level_is_given(monkeypatch, restore_logging):
    levels: list[int] = []

    async def fake_demo(*_: Any) -> None:
        levels.append(logging.getLogger().getEffectiveLevel())

    monkeypatch.setattr(vidpoll.demo, "run_demo", fake_demo)
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    runner = CliRunner()
    for args in (["demo", "--jobs", "1"], ["--log-level", "info", "demo", "--jobs", "1"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
    assert levels == [logging.WARNING, logging.INFO]


def test_version():
    with (Path(__file__).parents[2] / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    result = subprocess.run([VIDPOLL, "--version"], text=True, capture_output=True,
                            timeout=30, check=False)
    assert result.returncode == 0 and result.stdout == f"vidpoll {version}\n", result


def test_submit_and_usage_errors_speak_for_people(db_url, store: PgStore):
    """A transport error as a person says it (no exception class, no repr), no submitter log
    line among submit's own at the default level, --param named once, and usage errors of
    the group itself in JSON when VIDPOLL_LOG_FORMAT says so."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    env = env_for(db_url, SUME_BASE_URL=f"http://127.0.0.1:{port}")
    json_env = {**env, "VIDPOLL_LOG_FORMAT": "json"}
    cases = [(env, ("submit", "--prompt", "a fox", "--key", "k-people")),
             (env, ("submit", "--param", "=x")),
             (json_env, ("--bogus",)), (json_env, ("no-such-command",))]
    with ThreadPoolExecutor(4) as pool:
        sent, param, bogus, unknown = pool.map(
            lambda case: subprocess.run([VIDPOLL, *case[1]], env=case[0], text=True,
                                        capture_output=True, timeout=60, check=False), cases)
    said = sent.stdout + sent.stderr
    assert sent.returncode == 0, said
    assert f"could not connect to 127.0.0.1:{port} (connection refused)" in said, said
    assert "Error" not in said and "[Connect call" not in said and "('" not in said, said
    assert "vidpoll.submitter" not in said and " INFO " not in said, said
    assert param.returncode == 2 and param.stderr.count("--param") == 1, param.stderr
    for result in (bogus, unknown):
        line = json.loads(result.stderr)  # one JSON object, nothing else
        assert result.returncode == 2 and line["level"] == "error", result.stderr


def test_a_json_notice_carries_no_vidpoll_prefix(capsys, restore_logging):
    logs.setup("INFO", "json")
    _stderr("vidpoll: DATABASE_URL is unset: using the embedded PostgreSQL in /x")
    line = json.loads(capsys.readouterr().err)
    assert line["msg"].startswith("DATABASE_URL is unset"), line
    logs.setup("INFO", "text")
    _stderr("vidpoll: DATABASE_URL is unset: using the embedded PostgreSQL in /x")
    assert capsys.readouterr().err.startswith("vidpoll: DATABASE_URL")


async def test_the_shortened_ids_jobs_list_prints_are_taken_and_ctrl_c_stops_watching(
        db_url, store: PgStore):
    one = "vid_short_" + "0123456789" * 2 + "_x1y2"
    await store.add_job(one)
    await store.add_job("ambiguous-one-zz99")
    await store.add_job("ambiguous-two-zz99")
    shortened_and_ctrl_c(env_for(db_url, COLUMNS="200"), one)


def shortened_and_ctrl_c(env: dict[str, str], one: str) -> None:
    short = short_id(one)
    assert "…" in short and short in run(env, "jobs", "list").stdout
    watch = subprocess.Popen([VIDPOLL, "jobs", "watch", short], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with ThreadPoolExecutor(3) as pool:
            shown, due, ambiguous = pool.map(
                lambda args: subprocess.run([VIDPOLL, *args], env=env, text=True,
                                            capture_output=True, timeout=60, check=False),
                [("jobs", "show", short, "--json"), ("jobs", "poll-now", short),
                 ("jobs", "show", short_id("ambiguous-one-zz99"))])
        assert shown.returncode == 0 and json.loads(shown.stdout)["job_id"] == one, shown
        assert due.returncode == 0 and due.stdout.startswith(f"{one}: "), due
        assert ambiguous.returncode == 1 and "ambiguous" in ambiguous.stderr, ambiguous
        assert "ambiguous-one-zz99" in ambiguous.stderr and len(
            ambiguous.stderr.splitlines()) == 1, ambiguous.stderr
        # Ctrl-C while watching: one line saying the job goes on, exit 130
        assert watch.stderr is not None
        line = watch.stderr.readline()  # it waits: no worker polls the account
        assert line.startswith("warning: no `vidpoll worker`"), line
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 130, err
    assert err.strip() == f"stopped watching {one} (it goes on)", err
