"""The fleet-wide rate budget against a real PostgreSQL and the fake Sume's own limits."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Sequence

import psycopg
import pytest

from vidpoll.policy import Budget
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore

from ..conftest import API_KEY, db_now
from .test_process import cli_env, spawn_worker

pytestmark = pytest.mark.slow

OTHER_KEY = "sk-test-other-account"


def window(fake: FakeSume, start: float, end: float, key: str = API_KEY) -> tuple[int, int]:
    """(answers other than 429, 429s) the fake gave `key` between two monotonic times."""
    calls = [status for t, k, status in fake.read_log if start <= t < end and k == key]
    limited = sum(1 for status in calls if status == 429)
    return len(calls) - limited, limited


async def backlog(store: PgStore, fake: FakeSume, n: int, account: str = "default") -> None:
    for i in range(n):
        job_id = f"{account}-{i:05d}"
        fake.add_job(job_id, render_s=3600)  # never finishes: the backlog stays
        await store.add_job(job_id, delay_s=0, account=account)


async def run_fleet(env: dict[str, str], n: int, args: Sequence[str], warmup_s: float,
                    measure_s: float) -> tuple[float, float]:
    """Run `n` worker processes; return the monotonic window after the warm-up."""
    procs = [await spawn_worker(env, "--poll-only", "--concurrency", "20", *args)
             for _ in range(n)]
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(warmup_s)
        start = loop.time()
        await asyncio.sleep(measure_s)
        end = loop.time()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err.decode()[-2000:]
    return start, end


def report(name: str, **figures: float) -> None:
    print(f"\n{name}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in figures.items()))


async def test_three_processes_share_one_budget(store, fake, fake_url, db_url):
    rate = 20.0  # reads a second: the server's limit and the fleet's budget
    fake.config.read_rate_per_s = rate
    fake.config.read_burst = 2 * rate
    fake.config.next_poll_after_s = 0.05  # every row is due again at once: demand >> budget
    await backlog(store, fake, 600)
    env = cli_env(db_url, fake_url)
    start, end = await run_fleet(env, 3, ["--status-rate-per-min", str(rate * 60)],
                                 warmup_s=3.0, measure_s=8.0)
    ok, limited = window(fake, start, end)
    throughput = ok / (end - start)
    share_429 = limited / max(1, ok + limited)
    report("three processes, one budget", budget_per_s=rate, reads_per_s=throughput,
           ratio=throughput / rate, share_429=share_429, calls=ok + limited)
    # never above the limit, as the server itself judges it: its own bucket (same rate, same
    # burst) refuses every read beyond it, so the refused share is the overspend (a budget
    # kept per process would send three times the limit: two thirds refused)
    assert share_429 < 0.01
    # and the budget is used. How close to all of it is the benchmark's figure
    # (bench/rate_budget.py: 0.94-1.00 on a quiet machine); this floor only a broken budget
    # misses (split per process: 1/3), not a machine whose CPU is taken by other work
    # (measured 0.906 beside two busy loops on 2 cores). Pausing on "RateLimit-Remaining: 0"
    # (0.75 of the limit once) has its own test: test_a_budgeted_account_ignores_remaining_zero
    assert throughput >= 0.6 * rate


async def test_workers_converge_to_a_lower_server_limit(store, fake, fake_url, db_url):
    server_rate, configured = 10.0, 25.0
    fake.config.read_rate_per_s = server_rate
    fake.config.read_burst = 2 * server_rate
    fake.config.next_poll_after_s = 0.05
    await backlog(store, fake, 600)
    env = cli_env(db_url, fake_url)
    start, end = await run_fleet(env, 3, ["--status-rate-per-min", str(configured * 60)],
                                 warmup_s=4.0, measure_s=8.0)
    ok, limited = window(fake, start, end)
    first_ok, first_limited = window(fake, 0.0, start)
    throughput = ok / (end - start)
    share_429 = limited / max(1, ok + limited)
    report("server limit below the budget", server_per_s=server_rate, budget_per_s=configured,
           reads_per_s=throughput, ratio=throughput / server_rate, share_429=share_429,
           warmup_429s=first_limited, warmup_ok=first_ok)
    # the server had to say so at least once (in the warm-up on a quiet machine; a loaded
    # one may take longer to reach the limit at all)
    assert first_limited + limited > 0
    # the fleet met the server's limit, not its own budget: had it kept sending 25/s, three
    # in five calls would be refused; measured 2-7 % on a quiet machine (AIMD keeps probing
    # above the limit), 10.3 % beside two busy loops on 2 cores. The benchmark reports how
    # close to the limit it runs (bench/rate_budget.py: 0.99); here a floor against a fleet
    # that stalls after the first 429s
    assert share_429 < 0.25
    assert throughput >= 0.6 * server_rate


async def test_two_accounts_do_not_slow_each_other(store, fake, fake_url, db_url):
    fake.config.extra_api_keys = [OTHER_KEY]
    fake.config.read_rate_by_key = {API_KEY: 8.0, OTHER_KEY: 24.0}
    fake.config.read_burst = 48.0
    fake.config.next_poll_after_s = 0.05
    await backlog(store, fake, 300, "default")
    await backlog(store, fake, 300, "acme")
    env = cli_env(db_url, fake_url, SUME_API_KEY_ACME=OTHER_KEY,
                  VIDPOLL_STATUS_RATE_PER_MIN=str(8 * 60),
                  VIDPOLL_STATUS_RATE_PER_MIN_ACME=str(24 * 60))
    start, end = await run_fleet(env, 2, [], warmup_s=3.0, measure_s=8.0)
    slow_ok, slow_limited = window(fake, start, end, API_KEY)
    fast_ok, fast_limited = window(fake, start, end, OTHER_KEY)
    seconds = end - start
    report("two accounts", default_reads_per_s=slow_ok / seconds,
           acme_reads_per_s=fast_ok / seconds, default_429=slow_limited,
           acme_429=fast_limited)
    # each account its own rate: one bucket for both would hold acme to 8/s (a third of its
    # 24) or let default overrun by three; how close to each rate they run is the
    # benchmark's figure (0.95-1.00), a loaded machine measured 0.93 here
    assert slow_ok / seconds >= 0.6 * 8.0
    assert fast_ok / seconds >= 0.6 * 24.0
    assert (slow_limited + fast_limited) / max(1, slow_ok + fast_ok) < 0.01


async def test_a_server_pause_stops_every_worker_of_that_account_only(store):
    await store.add_job("a", delay_s=0)
    await store.add_job("b", delay_s=0, account="acme")
    await store.pause_bucket("default", "status", 30)
    assert await store.claim(10, 5, "w", "default") == []
    claimed = await store.claim(10, 5, "w", "acme")
    assert [j.job_id for j in claimed] == ["b"]  # acme is not paused
    grant = await store.take_tokens("default", "status", 5, Budget(10, 10))
    assert grant.granted == 0 and 29 < grant.wait_s <= 30


async def test_tokens_are_never_overspent_by_concurrent_takers(db_url):
    budget = Budget(rate_per_s=50.0, burst=10.0)
    stores = [await PgStore.open(db_url, max_size=2) for _ in range(6)]
    want = 40  # about 0.8 s of the rate: six takers race for every token until then
    granted = 0
    try:
        started_at = await db_now(db_url)  # before the bucket exists

        async def taker(s: PgStore) -> None:
            nonlocal granted
            while granted < want:
                granted += (await s.take_tokens("default", "status", 3, budget)).granted

        # a deadline twelve times what the rate needs: a bucket that lost refills misses it
        await asyncio.wait_for(asyncio.gather(*(taker(s) for s in stores)), 10)
    finally:
        for s in stores:
            await s.close()
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT tokens, updated_at FROM vidpoll_rate_buckets")
        [(tokens_left, last_spend)] = await cur.fetchall()
    # a new bucket holds one token: at most that plus what the rate refilled between its
    # creation and its last spend, both by the database's clock (no wait in this process,
    # however long, can stretch it); and no take left it below empty
    elapsed = (last_spend - started_at).total_seconds()
    assert granted <= 1 + budget.rate_per_s * elapsed + 1e-6, (granted, elapsed)
    assert granted >= want and tokens_left >= 0


async def test_the_create_budget_holds_across_submitters(store, fake, fake_url, db_url):
    for i in range(40):
        await store.add_intent(f"k{i}", {"prompt": f"clip {i}"})
    env = cli_env(db_url, fake_url, VIDPOLL_SUBMIT_RATE_PER_MIN="600", VIDPOLL_RATE_BURST="2",
                  VIDPOLL_HTTP_TIMEOUT="2")
    procs = [await spawn_worker(env, "--submit-only", "--drain", "--max-active", "1000")
             for _ in range(2)]
    for proc in procs:
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]
    times = sorted(fake.create_times)
    assert len(times) == 40 and fake.billed == 40
    # 10 a second with a burst of 2: never more than 2 + 10 * w creates granted in any
    # window w. These are arrival times at the fake, each a little after its grant, and on a
    # loaded machine some much later than others: allow for half a second of that. Two
    # submitters with a bucket each (20 a second) would still put 24 in a second.
    for i, t in enumerate(times):
        in_window = sum(1 for u in times[i:] if u - t <= 1.0)
        assert in_window <= 2 + 10 * (1.0 + 0.5) + 1, (i, in_window)
    # and the rate really was the limit: 39 tokens to refill at 10 a second (the bucket
    # starts with one) take 3.9 s; the first arrival may be the latest (0.5 s again)
    span = times[-1] - times[0]
    assert span >= (40 - 1) / 10 - 0.5


async def test_a_worker_leaves_accounts_it_has_no_key_for(store, fake, make_worker):
    fake.add_job("mine", script=[{"sume_status": "completed", "terminal": True}])
    await store.add_job("mine", delay_s=0)
    await store.add_job("theirs", delay_s=0, account="acme")
    worker = make_worker(drain=True)
    await asyncio.wait_for(worker.run(), 10)
    assert await store.counts() == {"completed": 1, "pending": 1}
    assert fake.reads["theirs"] == 0


async def test_worker_needs_the_key_of_every_account_it_serves(db_url, fake_url):
    proc = await spawn_worker(cli_env(db_url, fake_url), "--account", "acme", "--drain")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"SUME_API_KEY_ACME is not set" in err


async def test_a_429_read_pauses_the_fleet_and_slows_it(store, fake, make_worker):
    fake.add_job("j1", script=[{"http": 429, "code": "rate_limit_exceeded",
                                "headers": {"Retry-After": "30"}}])
    await store.add_job("j1", delay_s=0)
    worker = make_worker(budgets={"default": Budget(10, 10)})
    await asyncio.wait_for(run_until_recorded(worker), 10)
    [bucket] = await store.buckets()
    assert bucket["kind"] == "status" and 28 < bucket["paused_s"] <= 30
    assert bucket["rate_factor"] < 1 and bucket["server_pauses"] == 1
    # every other worker's claim of this account now waits, budget or not
    await store.add_job("j2", delay_s=0)
    assert await store.claim(10, 5, "other") == []


async def test_remaining_zero_pauses_without_slowing(store, fake, make_worker):
    fake.add_job("j1", script=[{"sume_status": "running", "terminal": False,
                                "next_poll_after_seconds": 60,
                                "headers": {"RateLimit-Remaining": "0",
                                            "RateLimit-Reset": "20"}}])
    await store.add_job("j1", delay_s=0)
    worker = make_worker()  # no budget configured: the server's word still reaches the fleet
    await asyncio.wait_for(run_until_recorded(worker), 10)
    [bucket] = await store.buckets()
    assert 18 < bucket["paused_s"] <= 20 and bucket["rate_factor"] == 1


async def test_a_budgeted_account_ignores_remaining_zero(store, fake, make_worker):
    # a budgeted fleet paces itself, and a server at its limit says "Remaining: 0" on nearly
    # every answer: pausing on each held the fleet to 0.75 of the limit. Only a 429 pauses it.
    fake.add_job("j1", script=[{"sume_status": "running", "terminal": False,
                                "next_poll_after_seconds": 60,
                                "headers": {"RateLimit-Remaining": "0",
                                            "RateLimit-Reset": "20"}}])
    await store.add_job("j1", delay_s=0)
    worker = make_worker(budgets={"default": Budget(10, 10)})
    from ..conftest import run_until

    await run_until(worker, lambda: worker.stats.recorded >= 1)  # pauses go out first
    assert worker.stats.server_pauses == 0
    assert all(b["paused_s"] == 0 and b["server_pauses"] == 0 for b in await store.buckets())


async def run_until_recorded(worker) -> None:
    from ..conftest import run_until

    await run_until(worker, lambda: worker.stats.recorded >= 1 and worker.stats.server_pauses)


async def test_accounts_from_the_command_line(store, fake, fake_url, db_url):
    from .test_submit_process import run_cli

    fake.config.extra_api_keys = [OTHER_KEY]
    env = cli_env(db_url, fake_url, SUME_API_KEY_ACME=OTHER_KEY,
                  VIDPOLL_STATUS_RATE_PER_MIN="600", VIDPOLL_FIRST_POLL_S="0")
    code, out, err = await run_cli(env, "submit", "--prompt", "x", "--account", "acme",
                                   "--key", "acme-1")
    assert code == 0, err
    job = await store.get_job(out.strip())
    assert job is not None and job["account"] == "acme"
    code, _, err = await run_cli(env, "jobs", "add", "--account", "Bad Name", "j")
    assert code == 6 and "account name" in err
    code, _, err = await run_cli(env, "worker", "--drain")
    assert code == 0, err
    code, out, _ = await run_cli(env, "jobs", "stats")
    assert "budget acme/status: 600/min" in out and "server pauses" in out
    code, out, _ = await run_cli(env, "jobs", "stats", "--json")
    stats = json.loads(out)
    assert stats["states"] == {"completed": 1}
    assert {b["account"] for b in stats["rate_buckets"]} == {"acme", "default"}


async def test_a_refund_does_not_refill_a_paused_bucket(store, db_url):
    budget = Budget(rate_per_s=100.0, burst=10.0)
    await store.take_tokens("default", "status", 1, budget)
    async with asyncio.timeout(10):  # the bucket fills up to its burst (0.1 s at 100/s)
        while (await store.buckets())[0]["tokens"] < 10:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert (await store.take_tokens("default", "status", 10, budget)).granted == 10
    await store.pause_bucket("default", "status", 30, refused=True)
    await store.refund_tokens("default", "status", 10)  # rows that were not there after all
    assert (await store.take_tokens("default", "status", 10, budget)).granted == 0  # paused
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT tokens, updated_at, paused_until "
                                 "FROM vidpoll_rate_buckets")
        [(tokens, refill_from, reset)] = await cur.fetchall()
    # the refund did not land, and the bucket refills from the reset on: it starts empty
    # then (at 100/s, ~5 tokens 50 ms after it, never a burst of 10 at once). Read from the
    # bucket's row rather than by sleeping past the reset, which a slow machine overshoots.
    assert tokens <= 0 and refill_from >= reset
async def test_an_unbudgeted_account_does_not_starve_a_budgeted_one(store, fake, fake_url,
                                                                   make_worker):
    fake.config.extra_api_keys = [OTHER_KEY]
    fake.config.next_poll_after_s = 0.05
    await backlog(store, fake, 200, "default")  # unlimited: always a full batch due
    await backlog(store, fake, 20, "acme")
    async with SumeClient(fake_url, OTHER_KEY, timeout_s=1.0) as other:
        worker = make_worker(concurrency=10, batch_size=10,
                             accounts=("default", "acme"), budgets={"acme": Budget(20, 5)})
        worker.readers = {**worker.readers, "acme": other}
        from ..conftest import run_until

        await run_until(worker, lambda: sum(n for k, n in fake.reads.items()
                                            if k.startswith("acme")) >= 20, within_s=10)


@pytest.mark.parametrize("mode", ["lease", "lock"])
async def test_both_claim_modes_stay_inside_the_budget(store, fake, make_worker, mode):
    from vidpoll.models import ClaimMode

    from .test_process import wait_for

    fake.config.latency_s = 0.3  # reads outlast a lane: lock mode must not hoard tokens
    fake.config.next_poll_after_s = 0.05
    await backlog(store, fake, 100)
    worker = make_worker(concurrency=30, claim_mode=ClaimMode(mode), lock_lanes=2,
                         budgets={"default": Budget(10, 2)})
    loop = asyncio.get_running_loop()
    start = loop.time()  # before the bucket exists
    task = asyncio.create_task(worker.run())
    try:  # until 25 reads answered (2.4 s at the rate), not for a fixed time
        await wait_for(lambda: len(fake.read_log) >= 25, 30, "25 reads")
    finally:
        worker.stop()
        await task
    elapsed = loop.time() - start  # every read was answered before this
    reads = len(fake.read_log)
    report(f"{mode} mode in a budget of 10/s", reads=reads, elapsed=elapsed,
           reads_per_s=reads / elapsed)
    assert reads <= 1 + 10 * elapsed + 1  # one starting token + the rate, never more
    # the tokens are spent on reads, not hoarded by claims waiting for a lane: at least half
    # the rate over the run (a quiet machine: about 0.9; a busy one stretches the start-up
    # and the stop, which is what the second of slack is for)
    assert reads >= 0.5 * 10 * (elapsed - 1)
