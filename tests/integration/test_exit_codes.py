"""Exit codes and waits a script can trust: `submit` when Sume refuses the configuration,
`submit --wait` / `jobs watch` / wait() with no worker, timeouts that name the job and key,
and a second Ctrl-C that stops a draining worker at once."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import psycopg
import pytest

from vidpoll import Vidpoll
from vidpoll.config import Settings
from vidpoll.fake_sume import FakeSume
from vidpoll.store import POLLS, SUBMITS, PgStore, Serves, names_serve
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.sume import SumeClient

from ..conftest import API_KEY, FAST_POLICY
from .test_process import cli_env, seed_jobs, wait_for

pytestmark = pytest.mark.slow

VIDPOLL = str(Path(sys.executable).with_name("vidpoll"))


async def vidpoll(env: dict[str, str], *args: str, within_s: float = 60
                  ) -> tuple[int, str, str]:
    """The installed command as a subprocess, without blocking the fake served here."""
    proc = await asyncio.create_subprocess_exec(
        VIDPOLL, *args, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), within_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_exits_9_when_sume_refuses_the_key_or_the_url(store, fake: FakeSume,
                                                                    fake_url, db_url):
    wrong_key = cli_env(db_url, fake_url, SUME_API_KEY="sk-wrong-key-0000")
    wrong_url = cli_env(db_url, fake_url + "/not-the-api")
    (key_code, key_out, key_err), (url_code, url_out, url_err) = await asyncio.gather(
        vidpoll(wrong_key, "submit", "--prompt", "a heron", "--key", "k-key"),
        vidpoll(wrong_url, "submit", "--prompt", "a crane", "--key", "k-url", "--wait"))
    assert key_code == 9, key_err
    assert "refused the API key" in key_out and "SUME_API_KEY" in key_out
    assert "HTTP 401: HTTP 401" not in key_out + key_err  # one prefix, not two
    assert "kept" in key_out and "`vidpoll worker` sends it with the same key" in key_out
    assert key_err.splitlines()[-1].startswith("error: Sume refused the API key")
    assert url_code == 9, url_err  # --wait does not wait for what cannot be sent
    assert "SUME_BASE_URL looks wrong" in url_out and "/not-the-api/v1/videos" in url_out
    assert "HTTP 404" in url_out and "waiting" not in url_err
    # nothing billed, both kept for a worker to send once the setting is fixed
    assert fake.billed == 0
    assert {k: (await store.get_intent(k)).state for k in ("k-key", "k-url")} == {  # type: ignore[union-attr]
        "k-key": "queued", "k-url": "queued"}
    # the refusal is the configuration's: Sume's own rejection keeps its own code (5)
    code, _, err = await vidpoll(cli_env(db_url, fake_url), "submit", "--prompt", " ")
    assert code == 5 and "invalid_request" in err


async def test_a_refused_key_is_logged_with_one_http_prefix(store, fake_url, caplog):
    await store.add_intent("k1", {"prompt": "x"})
    async with SumeClient(fake_url, "sk-wrong-key-0000", timeout_s=1.0) as client:
        submitter = Submitter(store, client, SubmitterConfig(policy=FAST_POLICY, lease_s=5.0,
                                                             http_timeout_s=1.0))
        with caplog.at_level(logging.ERROR):
            task = asyncio.create_task(submitter.run())
            try:
                await submitter.signals.wait_for(lambda: "rejected the API key" in caplog.text,
                                                 10)
            finally:
                submitter.stop()
                await task
    assert "(HTTP 401: unauthorized)" in caplog.text, caplog.text
    assert "HTTP 401: HTTP 401" not in caplog.text


@pytest.fixture
async def vp(db_url, fake_url):
    settings = Settings.from_env({"DATABASE_URL": db_url, "SUME_BASE_URL": fake_url,
                                  "SUME_API_KEY": API_KEY})
    async with await Vidpoll.open(settings=settings) as handle:
        yield handle


async def serving_store(db_url: str, serves: Serves) -> tuple[PgStore, asyncio.Task[None]]:
    """A store named as a worker's, listening (so its LISTEN connection says what it serves)."""
    other = await PgStore.open(db_url, application_name="vidpoll testhost:1:abcdef",
                               serves=serves)
    listening = asyncio.Event()

    async def listen() -> None:
        async for _ in other.notifications():
            listening.set()

    task = asyncio.create_task(listen())
    await asyncio.wait_for(listening.wait(), 10)
    return other, task


async def test_wait_says_when_no_worker_serves_the_account_and_keeps_waiting(vp, store,
                                                                             db_url):
    await store.add_job("j1", account="default")
    told: list[str] = []
    waiter = asyncio.create_task(vp.wait("j1", timeout=30, on_no_worker=told.append))
    await wait_for(lambda: told, 5, "wait() should say within seconds that no worker serves")
    assert "no `vidpoll worker` that polls jobs for account 'default'" in told[0]
    assert "still waiting" in told[0] and not waiter.done()
    await finish(db_url, "j1")
    job = await asyncio.wait_for(waiter, 10)
    assert job.state == "completed" and len(told) == 1


async def finish(db_url: str, job_id: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id = %s",
                           (job_id,))


async def test_a_worker_of_the_account_is_seen_and_one_of_another_is_not(vp, store, db_url):
    await store.add_job("j1", account="default")
    other, task = await serving_store(db_url, Serves(POLLS + SUBMITS, ("acme",)))
    try:
        told: list[str] = []
        with pytest.raises(TimeoutError) as info:
            await vp.wait("j1", timeout=1.0, on_no_worker=told.append)
        assert len(told) == 1 and "account 'default'" in told[0]  # acme's worker is no help
        assert "job j1" in str(info.value) and "not final after 1s" in str(info.value)
    finally:
        task.cancel()
        await other.close()
    mine, task = await serving_store(db_url, Serves(POLLS, ("acme", "default")))
    try:
        told = []
        with pytest.raises(TimeoutError):
            await vp.wait("j1", timeout=1.0, on_no_worker=told.append)
        assert told == []  # a worker polls 'default': nothing to say
    finally:
        task.cancel()
        await mine.close()


def test_names_serve_reads_what_each_worker_serves():
    names = ["vidpoll h:1:aaaaaa", "vidpoll h:1:aaaaaa serves p:acme,default;",
             "vidpoll h:2:bbbbbb serves s:default;", "vidpoll migrate 0001 1/2", "vidpoll"]
    assert names_serve(names, "default", POLLS) and names_serve(names, "acme", POLLS)
    assert names_serve(names, "default", SUBMITS) and not names_serve(names, "acme", SUBMITS)
    assert not names_serve(names, "other", POLLS)
    # a worker without a LISTEN connection (--no-listen, an older vidpoll) may serve anything
    assert names_serve(["vidpoll h:3:cccccc"], "other", SUBMITS)
    assert not names_serve(["vidpoll", "vidpoll migrate", "mine"], "default", POLLS)


async def test_submit_wait_and_jobs_watch_say_no_worker_and_name_job_and_key(
        store, fake: FakeSume, fake_url, db_url):
    env = cli_env(db_url, fake_url)
    code, _, err = await vidpoll(env, "submit", "--prompt", "a fox", "--key", "k-wait",
                                   "--wait", "--timeout", "1.5")
    job_id = fake.by_key["k-wait"]
    assert code == 8, err
    lines = err.splitlines()
    notice = [line for line in lines if line.startswith("warning: no `vidpoll worker`")]
    assert len(notice) == 1 and "account 'default'" in notice[0], err
    assert job_id in lines[-1] and "'k-wait'" in lines[-1] and "1.5s" in lines[-1], err
    code, _, err = await vidpoll(env, "jobs", "watch", job_id, "--timeout", "1")
    assert code == 8 and "warning: no `vidpoll worker` that polls jobs" in err
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and job_id in last and "'k-wait'" in last, err


async def test_a_second_ctrl_c_stops_a_draining_worker_at_once(store, fake: FakeSume,
                                                               fake_url, db_url):
    await seed_jobs(store, fake, 2)
    fake.config.latency_s = 60.0  # every read hangs in flight
    proc = await asyncio.create_subprocess_exec(
        VIDPOLL, "--log-level", "INFO", "worker", "--poll-only", "--shutdown-timeout", "60",
        env=cli_env(db_url, fake_url, VIDPOLL_HTTP_TIMEOUT="90"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []

    async def line_with(text: str) -> None:
        assert proc.stderr is not None
        while not any(text in line for line in seen):
            line = (await proc.stderr.readline()).decode()
            assert line, f"the worker ended before saying {text!r}: {seen}"
            seen.append(line)

    try:
        await wait_for(lambda: sum(fake.in_flight.values()) == 2, 30, "two reads in flight")
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(line_with("stopping: finishing 2 in-flight reads"), 10)
        proc.send_signal(signal.SIGINT)  # the reads would hold it for a minute
        await asyncio.wait_for(line_with("stopped at once"), 5)
        await asyncio.wait_for(proc.wait(), 5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 128 + signal.SIGINT
    said = next(line for line in seen if "stopped at once" in line)
    assert "left to their leases: 2 reads" in said and "when its lease ends" in said, said
    # nothing recorded: the rows keep their leases and are read again when those end
    assert await store.counts() == {"pending": 2}
    rows = [await store.get_job(j) for j in ("k0", "k1")]
    assert all(r is not None and r["claim_token"] is not None for r in rows)
