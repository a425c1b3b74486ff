"""`vidpoll worker --processes N`: real child processes against the fake Sume, a crashed
child started again, SIGTERM sent on to every child, one metrics endpoint for all, a child
that cannot help failing (the schema) ending the supervisor, children of a dead supervisor
stopping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from pathlib import Path

import aiohttp
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vidpoll.procs import exit_code_of, processes_wanted, restart_delay

from ..conftest import API_KEY, free_port
from .test_process import cli_env, seed_jobs, spawn_worker, wait_for

pytestmark = pytest.mark.slow


def children_of(pid: int) -> set[int]:
    """The live (not zombie) processes whose parent is `pid`, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def scrape(port: int) -> str:
    async with aiohttp.ClientSession() as http, http.get(
            f"http://127.0.0.1:{port}/metrics") as resp:
        return await resp.text()


def test_processes_wanted_and_backoff() -> None:
    assert processes_wanted("3") == 3
    assert processes_wanted("auto", lambda: 6) == 6
    assert processes_wanted("AUTO", lambda: None) == 1
    for bad in ("0", "-1", "two", "257"):
        with pytest.raises(ValueError):
            processes_wanted(bad)
    assert [restart_delay(n) for n in (1, 2, 3, 6, 7, 20)] == [1, 2, 4, 30, 30, 30]
    assert exit_code_of(-9) == 137 and exit_code_of(3) == 3


async def test_children_share_the_rows_and_one_metrics_endpoint(store, fake, fake_url,
                                                                 db_url):
    ids = await seed_jobs(store, fake, 60)
    fake.config.latency_s = 0.25  # one child alone would need 7.5 s: both get rows
    port = free_port()
    proc = await spawn_worker(cli_env(db_url, fake_url), "--processes", "2", "--poll-only",
                              "--no-fetch-results", "--concurrency", "2", "--batch-size", "2",
                              "--metrics-port", str(port))
    try:
        await wait_for(lambda: len(children_of(proc.pid)) == 2, 90, "two children")
        children = children_of(proc.pid)
        await wait_for(lambda: sum(fake.reads[i] for i in ids) >= len(ids), 90,
                       "every row read")
        async with asyncio.timeout(90):
            while (await store.counts()).get("completed") != len(ids):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the children write within 20 ms of a read
        with psycopg.connect(db_url) as conn:
            claimers = {r[0] for r in conn.execute("SELECT DISTINCT claimed_by FROM video_jobs")}
        pids = {int(c.split(":")[1]) for c in claimers}
        assert pids == children, (pids, children)  # both polled; the supervisor never did
        text = ""
        async with asyncio.timeout(90):
            # the last counts reach the shared files as they happen: scrape until they show
            while f'outcome="final"}} {float(len(ids))}' not in text:
                with contextlib.suppress(aiohttp.ClientError):
                    text = await scrape(port)
                await asyncio.sleep(0.1)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        polls = [s for s in families["vidpoll_polls"].samples
                 if s.name == "vidpoll_polls_total"]
        # one series per label set, summed over the two children (no pid label)
        assert [(s.labels, s.value) for s in polls] == [
            ({"account": "default", "outcome": "final"}, float(len(ids)))]
        assert "vidpoll_reads_in_flight" in families
        assert "vidpoll_jobs" not in families  # the table's figures are `serve`'s alone
        assert API_KEY not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    assert proc.returncode == 0, proc.err().decode()[-2000:]


async def test_a_crashed_child_is_started_again_and_sigterm_reaches_every_child(
        store, fake, fake_url, db_url):
    ids = await seed_jobs(store, fake, 4)
    proc = await spawn_worker(cli_env(db_url, fake_url), "--processes", "2", "--poll-only",
                              "--no-fetch-results", "--shutdown-timeout", "20")
    try:
        await wait_for(lambda: len(children_of(proc.pid)) == 2, 90, "two children")
        await wait_for(lambda: all(fake.reads[i] for i in ids), 90, "the rows read")
        first = children_of(proc.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        await wait_for(lambda: b"ended with 137" in proc.err(), 90, "the kill noticed")
        await wait_for(lambda: len(children_of(proc.pid) - first) == 1, 90,
                       "the killed child started again")
        assert len(children_of(proc.pid)) == 2, proc.err().decode()[-3000:]
        # both live children running (each logs its pid when it has its handlers): the new
        # one and the survivor (the victim may have died before it said so itself)
        live = children_of(proc.pid)

        def running(pid: int) -> bool:
            return re.search(rb":%d:[0-9a-f]+ started: claim=" % pid, proc.err()) is not None

        await wait_for(lambda: all(running(pid) for pid in live), 90, "both children running")
        # reads in flight when the stop comes: each child finishes its own and records it
        fake.config.latency_s = 1.0
        more = await seed_jobs(store, fake, 6, prefix="m")
        await wait_for(lambda: sum(fake.in_flight.values()) >= 2, 90, "reads in flight")
        children = children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 90)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = proc.err().decode()
    assert proc.returncode == 0, err[-2000:]
    # the child's own first-signal line, once per child: each got SIGTERM exactly once
    assert err.count("stopping: what is in flight may finish") == 2, err[-3000:]
    assert not any(alive(pid) for pid in children)
    for job_id in more:
        row = await store.get_job(job_id)
        assert row is not None
        # read and recorded, or never claimed: never left holding a claim
        assert row["claim_token"] is None


async def test_a_child_that_cannot_help_failing_ends_the_supervisor(empty_db, fake_url):
    # no schema: every child exits 4; starting them again cannot help
    proc = await spawn_worker(cli_env(empty_db, fake_url), "--processes", "2", "--poll-only")
    try:
        await asyncio.wait_for(proc.wait(), 90)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 4, proc.err().decode()[-2000:]
    assert b"starting it again cannot help" in proc.err()


async def test_children_stop_when_their_supervisor_dies(store, fake, fake_url, db_url):
    proc = await spawn_worker(cli_env(db_url, fake_url), "--processes", "2", "--poll-only")
    try:
        await wait_for(lambda: len(children_of(proc.pid)) == 2, 90, "two children")
        children = children_of(proc.pid)
        proc.kill()  # SIGKILL: nothing is sent on
        await proc.wait()
        await wait_for(lambda: not any(alive(pid) for pid in children), 90,
                       "the orphaned children stopped")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
