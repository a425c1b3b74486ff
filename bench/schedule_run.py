"""Part 2 of bench/schedule.py: the learned schedule in real workers, side by side with fixed
intervals, against the fake Replicate over HTTP and a real PostgreSQL.

- The fake Replicate runs in this process (its `render_log()` gives each prediction's end and
  the status reads it answered); every model draws its render times from its log-normal
  (`RenderTimes`), scaled down by SCALE to keep the run short.
- The workers run in one child process (`--child`): for each fixed interval, a `Worker` and a
  `Submitter` of the accounts that poll at it (`PollPolicy.default_poll_s` is per worker), all
  on one store (one LISTEN connection): `fixed15` (today: a read every 15 s, the first at
  15 s), `learned5` and `learned14` (`poll_schedule = "learned"`, `detect_p95_s` 5 and 14),
  and per model and target `eq<T>-<model>`: the fixed interval whose reads per job equal the
  learned schedule's in the model (part 1's (b)). Times are all divided by SCALE (floor 1 s ->
  0.2 s, 15 s -> 3 s); every figure printed is multiplied back.
- Warm-up: >= 100 jobs per model on each learned account (read at the fixed interval, as any
  account is until its history has LEARN_AFTER_JOBS render times), so the learned accounts'
  history is real jobs' render times, recorded by migration 0018's trigger. Then a few
  primer jobs keep the learned accounts' reads asking for the summary until it is read again
  (Schedules.REFRESH_S), and the measured jobs arrive, spread evenly over a window.
- Measured per job: detection delay = the row's `finished_at` (the database's clock) - the
  fake's end (this machine's clock); reads = the status reads the fake answered for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from schedule import (
    MODELS,
    TARGETS,
    TODAY_S,
    Model,
    emit,
    fixed_at_reads,
    lognormal,
    measure,
)
from scratch_db import scratch_database

from vidpoll.learned import REFRESH_S
from vidpoll.providers.replicate.fake import (
    FakeReplicate,
    RenderTimes,
    ReplicateFakeConfig,
    start_fake_replicate,
)
from vidpoll.schedule import LEARN_AFTER_JOBS, durations_from_samples, plan
from vidpoll.store import PgStore, migrate

SCALE = 5.0
"""Every time of the run is the real one divided by this (renders, targets, intervals)."""
TOKEN = "r8_bench_schedule_token"
TOKEN_VARIABLE = "BENCH_SCHEDULE_REPLICATE_TOKEN"
OWNER = "bench"
HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class RunSize:
    models: tuple[Model, ...]
    warmup: int
    """Jobs per model on each learned account before measuring (>= LEARN_AFTER_JOBS)."""
    measured: int
    """Measured jobs per model on each account."""
    arrive_s: float
    """The measured jobs arrive evenly over this window (scaled seconds)."""


FULL = RunSize(MODELS, warmup=130, measured=120, arrive_s=90.0)
QUICK = RunSize(MODELS[:2], warmup=LEARN_AFTER_JOBS + 8, measured=40, arrive_s=20.0)


def model_path(model: Model) -> str:
    return f"{OWNER}/{model.name}"


def equal_reads_interval(model: Model, target_s: float, seed: int) -> float:
    """Part 1's (b): the fixed interval whose reads per job equal the learned schedule's, on
    the model's own renders (full time scale)."""
    history = durations_from_samples(lognormal(model, 1000, seed))
    ends = lognormal(model, 20_000, seed + 1)
    reads = measure(plan(history, target_s=target_s, floor_s=1.0, fallback_s=TODAY_S,
                         first_read_s=TODAY_S).reads, ends, TODAY_S).reads
    f = fixed_at_reads(reads, ends)
    assert f.interval_s is not None
    return f.interval_s


@dataclasses.dataclass(frozen=True)
class Account:
    name: str
    poll_s: float
    """The worker's fixed interval (scaled): also the first read and the learned fallback."""
    learned_target_s: float | None
    """Real seconds; None: `poll_schedule = "fixed"`."""
    models: tuple[str, ...]
    label: str


def accounts_for(size: RunSize) -> list[Account]:
    names = tuple(m.name for m in size.models)
    out = [Account("fixed15", TODAY_S / SCALE, None, names, "(a) fixed 15 s (today)")]
    for t in TARGETS:
        out.append(Account(f"learned{t:g}", TODAY_S / SCALE, t, names, f"(d) learned, {t:g} s"))
    for n, m in enumerate(MODELS):
        if m not in size.models:
            continue
        for t in TARGETS:
            interval = equal_reads_interval(m, t, seed=1000 * (n + 1))
            out.append(Account(f"eq{t:g}_{m.name}", interval / SCALE, None, (m.name,),
                               f"(b) fixed {interval:.1f} s (reads of learned {t:g} s)"))
    return out


def accounts_file(accounts: list[Account], base_url: str) -> str:
    lines = []
    for a in accounts:
        lines += [f"[accounts.{account_name(a)}]", 'provider = "replicate"',
                  f'base_url = "{base_url}"', f'api_key_env = "{TOKEN_VARIABLE}"',
                  f"min_poll_s = {1.0 / SCALE:g}",
                  # the fake's limits are not what is measured: no pacing below them
                  "status_rate_per_min = 60000", "submit_rate_per_min = 60000"]
        if a.learned_target_s is None:
            lines.append('poll_schedule = "fixed"')
        else:
            lines += ['poll_schedule = "learned"',
                      f"detect_p95_s = {a.learned_target_s / SCALE:g}"]
        lines.append("")
    return "\n".join(lines)


def account_name(a: Account) -> str:
    """The account's name as the accounts file allows it ([a-z0-9_])."""
    return a.name.replace(".", "_").replace("-", "_")


# -- the child: the workers -------------------------------------------------------------------

async def child_main(groups: list[dict[str, Any]]) -> None:
    """One Worker and one Submitter per fixed interval, on one store, until SIGTERM."""
    from vidpoll.accounts import client_for
    from vidpoll.config import Settings
    from vidpoll.submitter import Submitter, SubmitterConfig
    from vidpoll.worker import Worker, WorkerConfig

    settings = Settings.from_env()
    assert settings.database_url
    store = await PgStore.open(settings.database_url, max_size=6,
                               application_name="bench-schedule")
    runners: list[Worker | Submitter] = []
    async with contextlib.AsyncExitStack() as stack:
        names = [a for g in groups for a in g["accounts"]]
        clients = {a: await stack.enter_async_context(client_for(settings, a,
                                                                 max_connections=200))
                   for a in names}
        for g in groups:
            served = tuple(g["accounts"])
            policy = dataclasses.replace(settings.policy, default_poll_s=g["poll_s"])
            mine = {a: clients[a] for a in served}
            timings, providers = settings.timings(served)
            # as `vidpoll worker` wires them: the poller's schedules give the submitter each
            # new job's first read
            poller = Worker(store, mine, WorkerConfig(
                concurrency=200, policy=policy, accounts=served, herd_stagger_s=0.0,
                budgets=settings.budgets("status", served),
                poll_floors={a: settings.accounts[a].min_poll_s or policy.min_poll_s
                             for a in served},
                read_timeout_s=settings.http_timeout_s, timings=timings,
                providers=providers))
            runners.append(poller)
            runners.append(Submitter(store, mine, SubmitterConfig(
                concurrency=16, max_active=None, first_poll_s=g["poll_s"], policy=policy,
                accounts=served, budgets=settings.budgets("create", served),
                http_timeout_s=settings.http_timeout_s), schedules=poller.schedules))
        def stop() -> None:
            for r in runners:
                r.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        await asyncio.gather(*(r.run() for r in runners))
    await store.close()


# -- the parent: the fake, the arrivals, the figures ------------------------------------------

async def submit(store: PgStore, account: str, model: str, key: str) -> None:
    await store.add_intent(key, {"prompt": f"bench {key}"}, account=account,
                           provider="replicate", model=model)


def check_alive(child: asyncio.subprocess.Process) -> None:
    """The workers' process must not have ended."""
    if child.returncode is not None:
        raise RuntimeError(f"the workers' process ended (exit {child.returncode})")


async def wait_finished(url: str, child: asyncio.subprocess.Process, prefix: str,
                        per_group: int, groups: list[tuple[str, str]], within_s: float) -> None:
    """Until every (account, model) has `per_group` finished jobs whose key starts with
    `prefix`."""
    deadline = time.monotonic() + within_s
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            rows = await (await conn.execute(
                "SELECT j.account, j.model, count(*) FROM video_intents i "
                "JOIN video_jobs j ON j.job_id = i.job_id "
                "WHERE i.idempotency_key LIKE %s AND j.state <> 'pending' "
                "GROUP BY 1, 2", (prefix + "%",))).fetchall()
            done = {(a, m): n for a, m, n in rows}
            short = [g for g in groups if done.get(g, 0) < per_group]
            if not short:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{prefix}: not finished in time: {short[:4]}")
            check_alive(child)
            await asyncio.sleep(1.0)


async def wait_learned(url: str, child: asyncio.subprocess.Process, accounts: list[str],
                       models: list[str], within_s: float) -> None:
    """Until a job of every learned account and model shows a learned `poll_reason`: the
    summary its worker loaded holds >= LEARN_AFTER_JOBS render times of each (a summary
    refreshed during the warm-up may not, and would leave a model on the fixed interval for
    another REFRESH_S)."""
    deadline = time.monotonic() + within_s
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            rows = await (await conn.execute(
                "SELECT DISTINCT account, model FROM video_jobs "
                "WHERE poll_reason LIKE 'learned%%' AND account = ANY(%s)",
                (accounts,))).fetchall()
            if {(a, m) for a, m in rows} >= {(a, m) for a in accounts for m in models}:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no learned poll_reason yet on {accounts}")
            check_alive(child)
            await asyncio.sleep(1.0)


def pct(values: list[float], p: float) -> float:
    """`schedule.evaluate`'s percentile: the value at index int(p * n) of the sorted list."""
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


async def run(url: str, size: RunSize, out: Path | None) -> list[dict[str, Any]]:
    await migrate(url)
    accounts = accounts_for(size)
    fake = FakeReplicate(ReplicateFakeConfig(
        api_token=TOKEN, starting_s=0.5 / SCALE, seed=31,
        other_rate_per_min=1e7, other_burst=1e6, create_rate_per_min=1e7, create_burst=1e6,
        render_times={model_path(m): RenderTimes(m.median_s / SCALE, m.sigma, 1.0 / SCALE)
                      for m in size.models}))
    for m in size.models:
        fake.add_model(model_path(m), [hashlib.sha256(m.name.encode()).hexdigest()])
    fake_runner, base = await start_fake_replicate(fake)
    home = tempfile.mkdtemp(prefix="bench-schedule-")
    config = Path(home) / "vidpoll.toml"
    config.write_text(accounts_file(accounts, base))
    env = {**os.environ, "DATABASE_URL": url, "VIDPOLL_CONFIG": str(config),
           TOKEN_VARIABLE: TOKEN, "VIDPOLL_ALLOW_INSECURE_HTTP": "1",
           "VIDPOLL_MIN_POLL_S": f"{1.0 / SCALE:g}", "VIDPOLL_HOME": home}
    by_poll: dict[float, list[str]] = {}
    for a in accounts:
        by_poll.setdefault(a.poll_s, []).append(account_name(a))
    groups = [{"poll_s": p, "accounts": names} for p, names in sorted(by_poll.items())]
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "schedule_run.py"), "--child", json.dumps(groups), env=env,
        cwd=home)
    store = await PgStore.open(url, max_size=2)
    records: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        learned = [a for a in accounts if a.learned_target_s is not None]
        # warm-up: real jobs on the learned accounts, read at the fixed interval until learned
        keys = [(account_name(a), model_path(m), f"w-{account_name(a)}-{m.name}-{i}")
                for i in range(size.warmup) for a in learned for m in size.models]
        random.Random(5).shuffle(keys)
        for a_name, model, key in keys:
            await submit(store, a_name, model, key)
        await wait_finished(url, child, "w-", LEARN_AFTER_JOBS,
                            [(account_name(a), model_path(m)) for a in learned
                             for m in size.models], within_s=600)
        warm_s = time.monotonic() - started
        print(f"warm-up: {len(keys)} jobs, {warm_s:.0f} s", file=sys.stderr)
        # primers: a job of each model every 2 s on each learned account keeps them asking
        # for the summary until their workers have read it again (Schedules.run reads it at
        # most every REFRESH_S, and only while reads want it)
        async def prime() -> None:
            for i in range(10_000):
                for a in learned:
                    for m in size.models:
                        await submit(store, account_name(a), model_path(m),
                                     f"p-{account_name(a)}-{m.name}-{i}")
                await asyncio.sleep(2.0)

        priming = asyncio.create_task(prime())
        try:
            await wait_learned(url, child, [account_name(a) for a in learned],
                               [model_path(m) for m in size.models], within_s=REFRESH_S * 4)
        finally:
            priming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await priming
        print(f"learned schedules in use after {time.monotonic() - started:.0f} s",
              file=sys.stderr)
        # the summary the workers plan from now (read as it is: no refresh)
        stats = await store.render_stats(max_age_s=1e9)
        # the measured jobs, arriving evenly
        plan_keys = [(account_name(a), model_path(m), f"m-{account_name(a)}-{m.name}-{i}")
                     for i in range(size.measured) for a in accounts for m in size.models
                     if m.name in a.models]
        random.Random(6).shuffle(plan_keys)
        gap = size.arrive_s / len(plan_keys)
        t0 = time.monotonic()
        for n, (a_name, model, key) in enumerate(plan_keys):
            await asyncio.sleep(max(0.0, t0 + n * gap - time.monotonic()))
            await submit(store, a_name, model, key)
        await wait_finished(url, child, "m-", size.measured,
                            [(account_name(a), model_path(m)) for a in accounts
                             for m in size.models if m.name in a.models], within_s=900)
        elapsed = time.monotonic() - started
        print(f"measured: {len(plan_keys)} jobs; run {elapsed:.0f} s", file=sys.stderr)
        records = await figures(url, fake, accounts, size)
        for r in records:
            r["run_s"] = round(elapsed, 1)
            r.update(predicted(r, stats, fake))
            emit(r, out)
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), 60)
        except TimeoutError:
            child.kill()
            await child.wait()
        await store.close()
        await fake_runner.cleanup()
        shutil.rmtree(home, ignore_errors=True)
    return records


async def figures(url: str, fake: FakeReplicate, accounts: list[Account],
                  size: RunSize) -> list[dict[str, Any]]:
    """Per account and model: reads per job (the fake's counts) and detection delay
    (finished_at - the fake's end), both in real seconds (x SCALE)."""
    log = {row["id"]: row for row in fake.render_log()}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rows = await (await conn.execute(
            "SELECT j.job_id, j.account, j.model, extract(epoch FROM j.finished_at)::float8, "
            "j.outcome FROM video_intents i JOIN video_jobs j ON j.job_id = i.job_id "
            "WHERE i.idempotency_key LIKE 'm-%%'")).fetchall()
    out = []
    labels = {account_name(a): a for a in accounts}
    groups: dict[tuple[str, str], list[tuple[float, int, float]]] = {}
    for job_id, account, model, finished, outcome in rows:
        fake_row = log[job_id]
        assert outcome == "succeeded", (job_id, outcome)
        groups.setdefault((account, model), []).append(
            (finished - fake_row["ended"], fake_row["reads"],
             fake_row["ended"] - fake_row["created"]))
    for (account, model), jobs in sorted(groups.items()):
        delays = [d * SCALE for d, _, _ in jobs]
        a = labels[account]
        out.append({
            "part": "run", "scale": SCALE, "account": account, "label": a.label,
            "model": model.split("/", 1)[1], "jobs": len(jobs),
            "reads": round(sum(r for _, r, _ in jobs) / len(jobs), 3),
            "p50_s": round(pct(delays, 0.5), 3), "p95_s": round(pct(delays, 0.95), 3),
            "max_s": round(max(delays), 3), "min_s": round(min(delays), 3),
            "fixed_interval_s": None if a.learned_target_s is not None
            else round(a.poll_s * SCALE, 2),
            "learned_target_s": a.learned_target_s,
            "_ends": [e * SCALE for _, _, e in jobs],
        })
    return out


def predicted(record: dict[str, Any], stats: list[Any], fake: FakeReplicate
              ) -> dict[str, Any]:
    """What the model (part 1's arithmetic) predicts for these very renders under this
    schedule: the learned plan from the run's own summary, or the fixed interval; the
    difference from the measured figures is the worker's own share (queueing, the record's
    batching, the first read)."""
    ends = record.pop("_ends")
    if record["learned_target_s"] is None:
        interval = record["fixed_interval_s"]
        first = interval
        f = measure(tuple(first + k * interval for k in range(int(max(ends) / interval) + 3)),
                    ends, interval)
    else:
        group = [d for d in stats if d.account == record["account"]
                 and d.model == f"{OWNER}/{record['model']}" and d.duration_key == "*"]
        if not group:
            return {"predicted": None}
        real = dataclasses.replace(group[0], quantiles=tuple(q * SCALE
                                                            for q in group[0].quantiles))
        p = plan(real, target_s=record["learned_target_s"], floor_s=1.0, fallback_s=TODAY_S,
                 first_read_s=TODAY_S)
        f = measure(p.reads, ends, TODAY_S)
    return {"predicted": {"reads": round(f.reads, 3), "p50_s": round(f.p50_s, 3),
                          "p95_s": round(f.p95_s, 3)}}


def run_table(records: list[dict[str, Any]]) -> str:
    lines = ["| model | schedule | jobs | reads/job | p50 delay | p95 delay | model's "
             "prediction for these renders: reads, p95 |", "|---|---|---:|---:|---:|---:|---|"]
    order = {"fixed15": 0, "learned5": 2, "learned14": 4}

    def key(r: dict[str, Any]) -> tuple[str, int]:
        a = r["account"]
        return r["model"], order.get(a, 1 if a.startswith("eq5") else 3)
    model = ""
    for r in sorted(records, key=key):
        pred = r.get("predicted")
        shown = (f"{pred['reads']:.2f}, {pred['p95_s']:.2f} s" if pred else "")
        lines.append(f"| {r['model'] if r['model'] != model else ''} | {r['label']} | "
                     f"{r['jobs']} | {r['reads']:.2f} | {r['p50_s']:.2f} s | "
                     f"{r['p95_s']:.2f} s | {shown} |")
        model = r["model"]
    return "\n".join(lines)


def main(out: Path | None, quick: bool) -> None:
    """Part 2: the real run, in a scratch database."""
    size = QUICK if quick else FULL
    with scratch_database() as url:
        records = asyncio.run(run(url, size, out))
    print(f"## Real run (time / {SCALE:g}, figures x {SCALE:g}: real seconds)\n")
    print(run_table(records))
    print()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        asyncio.run(child_main(json.loads(sys.argv[2])))
    else:
        main(None, "--quick" in sys.argv)
