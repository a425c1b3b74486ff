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

from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import POLLS, SUBMITS, PgStore, Serves, names_serve
from vidpoll.submitter import Submitter, SubmitterConfig

from ..conftest import FAST_POLICY
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
    # the same key again with the key still wrong: sent again now, refused again (exit 9,
    # not "queued (this key was already recorded)" and 0); fixed: sent, billed once
    code, out, err = await vidpoll(wrong_key, "submit", "--prompt", "a heron", "--key", "k-key")
    assert code == 9 and "refused the API key" in out, (out, err)
    assert fake.billed == 0
    code, out, err = await vidpoll(cli_env(db_url, fake_url), "submit", "--prompt", "a heron",
                                   "--key", "k-key")
    assert code == 0 and out.strip() == fake.by_key["k-key"], (out, err)
    assert "already recorded" in err
    code, out, err = await vidpoll(cli_env(db_url, fake_url), "submit", "--prompt", "a heron",
                                   "--key", "k-key")  # submitted: nothing sent again
    assert code == 0 and out.strip() == fake.by_key["k-key"], (out, err)
    assert fake.billed == 1 and (await store.get_intent("k-key")).state == "submitted"  # type: ignore[union-attr]
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
        waiter = asyncio.create_task(vp.wait("j1", timeout=120, on_no_worker=told.append))
        await wait_for(lambda: vp.worker_checks >= 1, 30, "wait() looked for a worker")
        assert len(told) == 1 and "account 'default'" in told[0]  # acme's worker is no help
        waiter.cancel()
        with pytest.raises(TimeoutError) as info:  # a timeout names the job
            await vp.wait("j1", timeout=0.2, on_no_worker=told.append)
        assert "job j1" in str(info.value) and "not final after 0.2s" in str(info.value)
    finally:
        task.cancel()
        await other.close()
    mine, task = await serving_store(db_url, Serves(POLLS, ("acme", "default")))
    try:
        told = []
        checks = vp.worker_checks
        waiter = asyncio.create_task(vp.wait("j1", timeout=120, on_no_worker=told.append))
        await wait_for(lambda: vp.worker_checks > checks, 30, "wait() looked for a worker")
        waiter.cancel()
        assert told == []  # a worker polls 'default': nothing to say
    finally:
        task.cancel()
        await mine.close()


async def test_a_worker_whose_url_names_its_application_is_seen(store, db_url):
    """DATABASE_URL=...?application_name=myapp: the pool's connections keep the user's name,
    the LISTEN connection still says what the worker serves (no false "no worker")."""
    named = psycopg.conninfo.make_conninfo(db_url, application_name="myapp")
    other, task = await serving_store(named, Serves(POLLS, ("default",)))
    try:
        assert await store.serving("default", POLLS) is True
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            names = {r[0] for r in await (await conn.execute(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database()")).fetchall()}
        assert "myapp" in names, names  # the user's own name stays on the pool's
    finally:
        task.cancel()
        await other.close()


def test_names_serve_reads_what_each_worker_serves():
    names = ["vidpoll h:1:aaaaaa", "vidpoll h:1:aaaaaa serves p:acme,default;",
             "vidpoll h:2:bbbbbb serves s:default;", "vidpoll migrate 0001 1/2", "vidpoll"]
    assert names_serve(names, "default", POLLS) and names_serve(names, "acme", POLLS)
    assert names_serve(names, "default", SUBMITS) and not names_serve(names, "acme", SUBMITS)
    assert not names_serve(names, "other", POLLS)
    # a worker without a LISTEN connection (--no-listen, an older vidpoll) may serve anything
    assert names_serve(["vidpoll h:3:cccccc"], "other", SUBMITS)
    assert not names_serve(["vidpoll", "vidpoll migrate", "mine"], "default", POLLS)


async def notice_from(env: dict[str, str], *args: str, within_s: float = 60) -> str:
    """Run the command until it gives the no-worker notice (it waits on: then it is stopped);
    the notice's line."""
    proc = await asyncio.create_subprocess_exec(
        VIDPOLL, *args, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(within_s):
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, f"{args} ended without the notice: {seen}"
                seen.append(line)
                if line.startswith("warning: no `vidpoll worker`"):
                    return line
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_submit_wait_and_jobs_watch_say_no_worker_and_name_job_and_key(
        store, fake: FakeSume, fake_url, db_url):
    env = cli_env(db_url, fake_url)
    notice = await notice_from(env, "submit", "--prompt", "a fox", "--key", "k-wait",
                               "--wait", "--timeout", "600")
    assert "polls jobs for account 'default'" in notice, notice
    job_id = fake.by_key["k-wait"]
    watched, timed, watch_timed = await asyncio.gather(
        notice_from(env, "jobs", "watch", job_id, "--timeout", "600"),
        vidpoll(env, "submit", "--prompt", "a fox", "--key", "k-wait", "--wait",
                "--timeout", "0.5"),
        vidpoll(env, "jobs", "watch", job_id, "--timeout", "0.5"))
    assert "polls jobs for account 'default'" in watched, watched
    code, _, err = timed
    last = err.splitlines()[-1]
    assert code == 8 and job_id in last and "'k-wait'" in last and "0.5s" in last, err
    code, _, err = watch_timed
    last = err.splitlines()[-1]
    assert code == 8 and last.startswith("error: "), err
    assert job_id in last and "'k-wait'" in last, err
    assert fake.billed == 1


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
