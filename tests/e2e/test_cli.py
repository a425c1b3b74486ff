"""The CLI as a new user runs it: no DATABASE_URL (embedded PostgreSQL), the bundled fake Sume."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import free_port

pytestmark = pytest.mark.slow

KEY = "sk-e2e-secret-value-0042"


@pytest.fixture
def new_user_env() -> Iterator[dict[str, str]]:
    """The environment of a user who set nothing but a key: DATABASE_URL unset."""
    # not pytest's tmp_path: the embedded server's own user must traverse the folder
    home = Path(tempfile.mkdtemp(prefix="vidpoll-e2e-"))
    env = {k: v for k, v in os.environ.items()
           if k != "DATABASE_URL" and not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(VIDPOLL_HOME=str(home), SUME_API_KEY=KEY)
    yield env
    shutil.rmtree(home, ignore_errors=True)


def vidpoll(env: dict[str, str], *args: str,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vidpoll.cli", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


def test_embedded_path_end_to_end(new_user_env):
    env = new_user_env
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "vidpoll.cli", "fake-sume", "--port",
                             str(port), "--api-key", KEY, "--render-seconds", "0.5",
                             "--next-poll-after", "0.2", "--uppercase", "--auto-create"],
                            env=env, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{base}/_fake/stats", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        env["SUME_BASE_URL"] = base
        first = vidpoll(env, "migrate")
        assert first.returncode == 0, first.stderr
        assert "0001_seed_table.sql" in first.stdout
        assert (Path(env["VIDPOLL_HOME"]) / "pgdata" / "PG_VERSION").exists()
        again = vidpoll(env, "migrate")
        assert again.returncode == 0 and "up to date" in again.stdout
        added = vidpoll(env, "jobs", "add", "--delay", "0", "e2e-1", "e2e/2", "e2e?3")
        assert added.returncode == 0 and "added 3" in added.stdout, added.stderr
        env["VIDPOLL_FIRST_POLL_S"] = "0"
        sent = vidpoll(env, "submit", "--prompt", "a heron", "--key", "e2e-key-1")
        assert sent.returncode == 0 and sent.stdout.startswith("vid_"), sent.stderr
        queued = vidpoll(env, "submit", "--prompt", "a crane", "--queue-only")
        assert queued.returncode == 0 and "queued" in queued.stdout, queued.stderr
        run = vidpoll(env, "worker", "--drain", "--concurrency", "5")
        assert run.returncode == 0, run.stderr
        stats = vidpoll(env, "jobs", "stats", "--json")
        assert json.loads(stats.stdout)["states"] == {"completed": 5}
        intents = json.loads(vidpoll(env, "intents", "stats", "--json").stdout)
        assert intents["states"] == {"submitted": 2}
        linked = json.loads(vidpoll(env, "intents", "show", "e2e-key-1").stdout)
        assert linked["job_id"] == sent.stdout.strip()
        shown = json.loads(vidpoll(env, "jobs", "show", "e2e/2", "--json").stdout)
        assert shown["state"] == "completed" and shown["provider_status"] == "completed"
        assert KEY not in run.stderr + stats.stderr + first.stderr
        missing = vidpoll(env, "jobs", "show", "nope")
        assert missing.returncode == 1 and "no job 'nope'" in missing.stderr
        finished = vidpoll(env, "jobs", "resume", "e2e-1")  # Sume's final states stay final
        assert finished.returncode == 1 and "resumable" in finished.stderr
        empty = vidpoll(env, "jobs", "add", "")
        assert empty.returncode == 6 and "non-empty" in empty.stderr
        assert json.loads(vidpoll(env, "jobs", "stats", "--json").stdout)["states"] == {
            "completed": 5}
    finally:
        fake.terminate()
        fake.wait(10)


def test_demo_runs_to_completion(new_user_env):
    result = vidpoll(new_user_env, "--log-level", "warning", "demo", "--jobs", "12",
                     timeout=150)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "summary" in result.stdout
    summary = " ".join(result.stdout.split())
    states = summary.split("summary:")[-1].split(" in ")[0]  # "completed 9, failed 2, ..."
    assert "pending" not in states and "completed" in states, summary
    assert "{'" not in result.stdout, result.stdout  # counts for people, never a dict's repr
    assert "overlapping reads of one job seen by the fake: 0" in summary
    assert "renders billed: 12 for 12 intents (keys billed twice: 0)" in summary
    # Replicate, without an idempotency key: every input billed once, every file on disk
    assert re.search(r"Replicate: \d+ creates, 12 predictions billed, 0 inputs billed twice; "
                     r"\d+ list pages read", summary), summary
    # fal, Veo, Runway, Luma and Kling: each input billed once; Veo's and Runway's one lost
    # reply each parked (nothing to look it up in), the others' unknown creates adopted or
    # proven absent, none parked
    assert re.search(r"unknown creates without an idempotency key: adopted from the "
                     r"provider's records \d+, proven absent and sent again \d+, parked for an "
                     r"operator 2\b", summary), summary
    assert re.search(r"fal: \d+ creates, 8 requests billed, 0 inputs billed twice; .*no key "
                     r"sent there", summary), summary
    assert re.search(r"Veo: \d+ creates, 6 operations billed, 0 bodies billed twice; .*parked "
                     r"for an operator \(a lost reply, no list to look in\): 1 ", summary), summary
    # Runway: tasks wait THROTTLED; every download through a fresh read of the task (one link
    # that expired before its fetch read once more); its lost reply parked
    assert re.search(r"Runway: \d+ creates, 4 tasks billed, 0 bodies billed twice; tasks held "
                     r"THROTTLED behind its concurrency of 1: [1-9]\d*; .*CDN 403s 1\), no key "
                     r"sent there, no signed link stored, .*parked for an operator \(a lost "
                     r"reply, no list to look in\): 1 ", summary), summary
    # Luma: its lost reply and its 5xx after billing found in its list; Kling: its lost reply
    # found by its external_task_id; none parked
    assert re.search(r"Luma: \d+ creates, 5 generations billed, 0 inputs billed twice; .*found "
                     r"in its list and adopted: 2, parked: 0; ", summary), summary
    assert re.search(r"Kling: \d+ creates, 4 tasks billed, 0 inputs billed twice; its lost "
                     r"reply found by its external_task_id and adopted: 1, parked: 0; ",
                     summary), summary
    assert "lowered Runway's and Kling's 5 s poll floor to 1 s" in summary, summary
    # every completed job's video is on disk and whole (the demo exits non-zero otherwise)
    assert re.search(r"\d+ videos downloaded to .*demo-videos, each checked against the "
                     r"fake's sha256 \(links refreshed after expiring: 3\)", summary), summary


def test_dead_database_url_is_a_clear_error(new_user_env):
    env = dict(new_user_env, DATABASE_URL="postgresql://postgres@127.0.0.1:1/x?connect_timeout=2")
    for args in (["migrate"], ["jobs", "stats"], ["jobs", "add", "x"]):
        result = vidpoll(env, *args)
        assert result.returncode == 3, (args, result.stderr)
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
