"""Submission across real processes: kill -9 between the POST and the commit, the bulk file
interrupted half way, and `vidpoll submit` as a user runs it."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
from pathlib import Path

import pytest

from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore

from ..conftest import API_KEY
from .test_process import cli_env, spawn_worker, wait_for

pytestmark = pytest.mark.slow


async def run_cli(env: dict[str, str], *args: str, stdin: bytes | None = None,
                  within_s: float = 60) -> tuple[int, str, str]:
    """Run the CLI as a subprocess without blocking the fake Sume served by this process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidpoll.cli", *args, env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), within_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def intents_recorded(store: PgStore) -> int:
    return sum((await store.intent_counts()).values())


async def test_kill_9_between_the_post_and_the_commit_bills_once(store, fake, fake_url, db_url):
    n = 30
    keys = [f"crash-{i:03d}" for i in range(n)]
    for key in keys:
        await store.add_intent(key, {"prompt": f"clip {key}"})
    env = cli_env(db_url, fake_url, VIDPOLL_HTTP_TIMEOUT="1", VIDPOLL_FIRST_POLL_S="0.1")
    args = ("--submit-only", "--lease-seconds", "2", "--submit-concurrency", "4",
            "--max-active", "1000")

    # 1. every reply is lost: Sume bills, the worker waits, and dies before any commit
    fake.config.create_lose_reply = 1.0
    fake.config.hang_s = 60.0
    proc = await spawn_worker(env, *args)
    try:
        await wait_for(lambda: fake.billed >= 4, 20, "four renders billed, no reply yet")
    finally:
        proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    in_doubt = [k for k in keys if fake.billed_by_key[k]]
    assert len(in_doubt) >= 4
    assert await store.counts() == {}  # no job row: the crash came before the commit
    for key in in_doubt:
        intent = await store.get_intent(key)
        assert intent is not None and intent.state == "queued" and intent.attempts == 1

    # 2. two processes at a time, killed -9 at random moments, while every kind of create
    # fault happens
    fake.config.create_lose_reply = 0.15
    fake.config.hang_s = 3.0
    fake.config.create_5xx_billed = 0.15
    fake.config.create_fail_5xx = 0.1
    fake.config.create_rate_429 = 0.1
    fake.config.retry_after_s = 0.2
    rng = random.Random(3)
    for _ in range(3):
        procs = [await spawn_worker(env, *args) for _ in range(2)]
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        for proc in procs:
            proc.kill()
            await proc.wait()

    # 3. two last workers drain the queue
    procs = [await spawn_worker(env, *args, "--drain") for _ in range(2)]
    for proc in procs:
        _, err = await asyncio.wait_for(proc.communicate(), 90)
        assert proc.returncode == 0, err.decode()[-2000:]
    figures = {"intents": n, "clips_billed": fake.billed,
               "posts": sum(fake.posts_by_key.values()),
               "keys_billed_twice": sum(1 for k in keys if fake.billed_by_key[k] > 1),
               "job_rows": sum((await store.counts()).values()),
               "overlapping_posts_of_one_key": fake.create_overlaps}
    print(f"\ncrash test figures: {json.dumps(figures)}")
    assert fake.billed == n and all(fake.billed_by_key[k] == 1 for k in keys)
    assert figures["job_rows"] == n
    assert fake.create_overlaps == 0
    for key in keys:
        intent = await store.get_intent(key)
        assert intent is not None and intent.state == "submitted"
        assert intent.job_id == fake.by_key[key]
        job = await store.get_job(intent.job_id)
        assert job is not None and job["idempotency_key"] == key


async def test_bulk_file_interrupted_half_way_then_rerun(store, fake, fake_url, db_url,
                                                         tmp_path: Path):
    n = 2000
    lines = [json.dumps({"prompt": f"scene {i}", "duration": 4 + i % 3}) for i in range(n)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    env = cli_env(db_url, fake_url, VIDPOLL_FIRST_POLL_S="0.05")

    # 1. the first half arrives on stdin, then the process is killed while it waits for more
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidpoll.cli", "submit", "--file", "-", env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None
    proc.stdin.write(("\n".join(lines[: n // 2]) + "\n").encode())
    await proc.stdin.drain()
    async with asyncio.timeout(30):
        while await intents_recorded(store) < n // 2:  # noqa: ASYNC110 (bounded)
            await asyncio.sleep(0.05)
    proc.kill()
    await proc.wait()
    assert await intents_recorded(store) == n // 2

    # 2. the whole file again: only the missing half is new
    code, out, err = await run_cli(env, "submit", "--file", str(prompts))
    assert code == 0, err
    assert f"recorded {n // 2} new intents; {n // 2} were already recorded" in out

    # 3. a worker sends and polls them all
    fake.config.next_poll_after_s = 0.05
    code, _, err = await run_cli(env, "worker", "--drain", "--max-active", "5000",
                                 "--submit-concurrency", "50", "--concurrency", "100",
                                 within_s=240)
    assert code == 0, err[-2000:]
    assert await store.counts() == {"completed": n}
    assert await store.intent_counts() == {"submitted": n}
    assert fake.billed == n and fake.stats()["keys_billed_twice"] == 0

    # 4. and once more: nothing new, nothing sent
    code, out, _ = await run_cli(env, "submit", "--file", str(prompts))
    assert code == 0 and "recorded 0 new intents" in out
    assert fake.billed == n


async def test_bulk_file_reports_bad_lines_and_keeps_the_good_ones(store, db_url, fake_url,
                                                                   tmp_path: Path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"prompt": "a"}\nnot json\n{"key": "has space", "prompt": "b"}\n'
                    '\n{"prompt": "c", "priority": 2}\n')
    code, out, err = await run_cli(cli_env(db_url, fake_url), "submit", "--file", str(path))
    assert code == 6
    assert "recorded 2 new intents" in out and "2 bad lines" in out
    assert "line 2: not JSON" in err and "line 3:" in err and "idempotency key" in err
    assert await store.intent_counts() == {"queued": 2}


async def test_submit_command(store, fake: FakeSume, fake_url, db_url):
    env = cli_env(db_url, fake_url, VIDPOLL_FIRST_POLL_S="0.05")
    everything: list[str] = []

    async def vidpoll(env: dict[str, str], *args: str) -> tuple[int, str, str]:
        code, out, err = await run_cli(env, *args)
        everything.extend((out, err))
        return code, out, err

    fake.config.next_poll_after_s = 0.05

    code, out, err = await vidpoll(env, "submit", "--prompt", "a fox", "--param", "duration=8",
                                   "--key", "k1")
    assert code == 0, err
    assert out.strip() == fake.by_key["k1"] and fake.payloads["k1"] == {"prompt": "a fox",
                                                                         "duration": 8}
    assert "recorded intent k1" in err  # said before the POST, in case anything fails after
    # the same key again: the same job, nothing billed
    code, out, err = await vidpoll(env, "submit", "--prompt", "a fox", "--param", "duration=8",
                                   "--key", "k1")
    assert code == 0 and out.strip() == fake.by_key["k1"] and "already recorded" in err
    assert fake.billed == 1
    # the same key for another request: refused, nothing changed
    code, _, err = await vidpoll(env, "submit", "--prompt", "a cat", "--key", "k1")
    assert code == 6 and "different payload" in err
    # Sume refuses: exit 5 with its code and message
    code, _, err = await vidpoll(env, "submit", "--prompt", " ", "--key", "bad")
    assert code == 5 and "invalid_request" in err
    # at the cap (k1's job is pending): recorded, queued, exit 0, and why
    code, out, _ = await vidpoll(env, "submit", "--prompt", "a bird", "--key", "k2",
                                 "--max-active", "1")
    assert code == 0 and "queued" in out and "limit is 1" in out
    assert fake.posts_by_key["k2"] == 0
    # Sume unreachable: recorded and queued, exit 0, and why
    down = cli_env(db_url, "http://127.0.0.1:1")
    code, out, _ = await vidpoll(down, "submit", "--prompt", "a whale", "--key", "k3")
    assert code == 0 and "queued" in out and "did not confirm" in out
    # inspect and re-queue
    code, out, _ = await vidpoll(env, "intents", "show", "bad")
    shown = json.loads(out)
    assert shown["state"] == "rejected" and shown["error_code"] == "invalid_request"
    assert shown["last_request_id"].startswith("req_")
    code, out, _ = await vidpoll(env, "intents", "retry", "bad")
    assert code == 0 and "bad: queued" in out
    code, out, _ = await vidpoll(env, "intents", "stats", "--json")
    assert json.loads(out)["states"] == {"queued": 3, "submitted": 1}
    code, _, err = await vidpoll(env, "intents", "retry", "nope")
    assert code == 1 and "nope" in err

    # --wait: a worker sends the queued ones and polls; submit --wait returns the final state
    worker = await spawn_worker(env, "--max-active", "100")
    try:
        code, out, err = await vidpoll(env, "submit", "--prompt", "a hawk", "--key", "k4",
                                       "--wait", "--timeout", "30")
        assert code == 0, err
        assert out.strip().splitlines()[-1] == "completed"
        fake.config.terminal_mix = {"failed": 1.0}
        code, out, _ = await vidpoll(env, "submit", "--prompt", "a crow", "--wait",
                                     "--timeout", "30")
        assert code == 7 and out.strip().splitlines()[-1] == "failed"
    finally:
        worker.send_signal(signal.SIGTERM)
        _, worker_err = await worker.communicate()
    assert not any(API_KEY in text for text in [*everything, worker_err.decode()])


async def test_submit_command_bad_environments(store, db_url, fake_url):
    env = cli_env("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2", fake_url)
    code, _, err = await run_cli(env, "submit", "--prompt", "x")
    assert code == 3 and "cannot connect to PostgreSQL" in err and "Traceback" not in err
    env = cli_env(db_url, fake_url)
    env.pop("SUME_API_KEY")
    code, _, err = await run_cli(env, "submit", "--prompt", "x")
    assert code == 2 and "SUME_API_KEY" in err
    assert await store.intent_counts() == {}  # nothing recorded that no one could send
    code, out, _ = await run_cli(env, "submit", "--prompt", "x", "--queue-only", "--key", "q")
    assert code == 0 and "queued" in out
    for args, want, needle in [(("--key", "a b", "--prompt", "x"), 6, "idempotency key"),
                               (("--key", "k" * 300, "--prompt", "x"), 6, "limit is 255"),
                               (("--json", "-"), 2, "not JSON"),
                               (("--param", "novalue"), 2, "name=value"),
                               ((), 2, "nothing to submit"),
                               (("--file", "-", "--max-active", "3"), 2, "--file takes no")]:
        code, _, err = await run_cli(cli_env(db_url, fake_url), "submit", *args, stdin=b"{")
        assert code == want and needle in err, (args, err)
    assert await store.intent_counts() == {"queued": 1}
