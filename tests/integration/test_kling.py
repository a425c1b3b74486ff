"""Kling end to end: vidpoll's Kling client, submitter, worker, deliverer and downloader against
the fake Kling (vidpoll.providers.kling.fake), real HTTP over loopback, real PostgreSQL.

What is checked: intents become tasks (each create carrying the external id derived from its
key) polled under the endpoint kept as the job's handle to `succeed` or `failed` (its
`task_status_msg` kept), every succeeded task's video downloaded byte for byte from the public
CDN (no token goes there); a token Kling calls expired mid-run is replaced with no job or
intent lost; and under create faults (lost replies, 5xx after the task was made, hangs past
the client's timeout, a server that creates after its client gave up, a code other than 0
under HTTP 200, 5xx before, 429) and killed submitters re-run with the same keys, on a fake
that BILLS a repeated external id again (the worst case: only vidpoll's look-up by the
external id stands between an unknown create and a second bill), no input is billed twice,
nothing is parked and every intent ends submitted.

Run with -s for the chaos figures. Tests wait on observed state (the store, the fake).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.fetch_guard import AccountRules, FetchPolicy
from vidpoll.policy import PollPolicy
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.kling.client import KlingClient
from vidpoll.providers.kling.fake import (
    DEFAULT_ACCESS_KEY,
    DEFAULT_SECRET_KEY,
    FakeKling,
    KlingFakeConfig,
    start_fake_kling,
)
from vidpoll.providers.kling.rules import external_task_id
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import FAST_POLICY

ACCOUNT = "kling"
PROVIDER = "kling"
ENDPOINT = "text2video"
HTTP_TIMEOUT_S = 1.0
POLICY = dataclasses.replace(FAST_POLICY, reconcile_settle_s=1.0, reconcile_deadline_s=45.0)
"""An unknown create is looked up 1 s after its attempt ended (Kling's query answers at once;
the fake's late create lands within it)."""
WORKER_POLICY = dataclasses.replace(FAST_POLICY, default_poll_s=0.2)
"""Kling sends no poll hint: without one the worker waits default_poll_s between reads."""
FLOOR_S = 0.05
"""The account's own `min_poll_s` here (Kling's default floor is 5 s)."""
WAIT_S = 30.0
FINAL_INTENT_STATES = ("submitted", "unknown", "rejected")
MARKER = re.compile(r"\[m-(\d{3})\]")


def quick(**overrides: Any) -> KlingFakeConfig:
    """Short lives, small files, seeded."""
    base: dict[str, Any] = {"queue_s": 0.02, "processing_s": 0.2, "file_bytes": 16 * 1024,
                            "seed": 11}
    return KlingFakeConfig(**{**base, **overrides})


@asynccontextmanager
async def serving(config: KlingFakeConfig) -> AsyncIterator[tuple[FakeKling, str]]:
    fake = FakeKling(config)
    runner, url = await start_fake_kling(fake)
    try:
        yield fake, url
    finally:
        await runner.cleanup()


def kling_client(url: str) -> KlingClient:
    """The account's client: `api_key_env` gave the access key, `secret_key_env` the secret."""
    return KlingClient(url, DEFAULT_ACCESS_KEY, timeout_s=HTTP_TIMEOUT_S, options=ProviderOptions(
        extra={"secret_key_env": "KLING_SECRET_KEY"},
        secrets={"secret_key_env": DEFAULT_SECRET_KEY}))


def payload(i: int, tag: str = "") -> dict[str, Any]:
    """A text2video body whose prompt carries a unique marker (what billed it is counted by)."""
    return {"model_name": "kling-v2-6", "prompt": f"a heron, take {i} [m-{i:03d}]{tag}",
            "mode": "std", "duration": "5", "aspect_ratio": "16:9"}


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S,
                     what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def submitter(store: PgStore, client: KlingClient, *, concurrency: int = 16,
              policy: PollPolicy = POLICY) -> Submitter:
    return Submitter(store, {ACCOUNT: client}, SubmitterConfig(
        policy=policy, lease_s=HTTP_TIMEOUT_S + 2.0, http_timeout_s=HTTP_TIMEOUT_S,
        first_poll_s=0.0, max_active=None, concurrency=concurrency, accounts=(ACCOUNT,),
        shutdown_timeout_s=3.0))


def worker(store: PgStore, client: KlingClient, *, drain: bool = True) -> Worker:
    return Worker(store, {ACCOUNT: client}, WorkerConfig(
        policy=WORKER_POLICY, lease_s=5.0, concurrency=20, drain=drain, fetch_results=True,
        accounts=(ACCOUNT,), poll_floors={ACCOUNT: FLOOR_S}))


def media_policy(client: KlingClient, url: str) -> FetchPolicy:
    return FetchPolicy(AccountRules(), {ACCOUNT: AccountRules(
        url, api_headers=client.media_headers(), header_hosts=client.media_auth_hosts())})


async def settled(store: PgStore, total: int) -> bool:
    found = await store.intent_counts()
    return sum(found.get(s, 0) for s in FINAL_INTENT_STATES) == total


async def submitted_at_least(store: PgStore, n: int) -> bool:
    return (await store.intent_counts()).get("submitted", 0) >= n


async def run_until(loop: Submitter, check: Callable[[], Awaitable[bool]],
                    timeout_s: float = WAIT_S, *, kill: bool = False) -> dict[str, int]:
    """Run `loop` until `check()` holds; then stop it (or, `kill`, cancel its task: a process
    killed mid-way, its leases and its POSTs in flight left as they were)."""
    task = asyncio.create_task(loop.run())

    async def done_or() -> bool:
        if task.done():
            task.result()  # re-raise what ended it
            return True
        return await check()

    try:
        await eventually(done_or, timeout_s, "the submitter")
    finally:
        if kill:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        else:
            loop.stop()
            await asyncio.wait_for(task, 15)
    return dataclasses.asdict(loop.stats)


async def poll_and_deliver(store: PgStore, client: KlingClient, url: str, media: Path,
                           while_polling: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Poll every job to its end (a draining worker), then deliver every download; with
    `while_polling`, that runs (to its end) while the worker polls."""
    async with Downloader(media, policy=media_policy(client, url)) as downloader:
        deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0,
                                                    drain=True, concurrency=8), downloader)
        await deliverer.prepare()
        polling = asyncio.create_task(worker(store, client).run())
        try:
            if while_polling is not None:
                await while_polling()
            await asyncio.wait_for(asyncio.shield(polling), WAIT_S)
        finally:
            if not polling.done():
                polling.cancel()
                await asyncio.gather(polling, return_exceptions=True)
        deliverer.producers_finished()
        await asyncio.wait_for(deliverer.run(), WAIT_S)


def on_disk(media: Path, path: str) -> Path:
    found = Path(path)
    return found if found.is_absolute() else media / found


async def check_ends(store: PgStore, fake: FakeKling, media: Path,
                     job_ids: dict[str, str], endpoints: dict[str, str]) -> dict[str, int]:
    """Every job completed as its task ended, under its endpoint; each succeeded one's video on
    disk byte for byte, each failed one's reason kept and no file. The count of each end."""
    ends: Counter[str] = Counter()
    for key, job_id in job_ids.items():
        row = await store.get_job(job_id)
        job = await store.job(job_id)
        task = fake.tasks[job_id]
        assert row is not None and job is not None
        assert row["provider"] == PROVIDER and row["handle"] == {"endpoint": endpoints[key]}
        assert task.endpoint == endpoints[key]
        assert task.external_task_id == external_task_id(key)
        ends[task.outcome] += 1
        assert row["state"] == task.outcome, (row["state"], task.outcome)
        if task.outcome == "succeed":
            assert row["outcome"] == "succeeded" and row["result_state"] == "fetched"
            assert len(job.files) == 1, (job_id, await store.job_deliveries(job_id))
            assert on_disk(media, job.files[0].path).read_bytes() == fake.video_bytes(job_id)
        else:
            assert row["outcome"] == "failed" and job.files == ()
            assert row["last_response"]["data"]["task_status_msg"] == task.status_msg
    assert not [p for p in media.rglob("*") if p.name.endswith(".part")]
    return dict(ends)


# ---- 1. end to end ----

async def test_intents_are_polled_under_their_endpoint_to_their_end_and_downloaded(
        store: PgStore, tmp_path: Path) -> None:
    total = 8
    keys = [f"e2e-{i:02d}" for i in range(total)]
    endpoints = {k: ("image2video" if i % 3 == 0 else ENDPOINT) for i, k in enumerate(keys)}
    async with serving(quick(processing_s=60.0)) as (fake, url), kling_client(url) as client:
        for i, key in enumerate(keys):
            body = payload(i) if endpoints[key] == ENDPOINT else {
                **payload(i), "image": "https://in.example/a.png"}
            await store.add_intent(key, body, account=ACCOUNT, provider=PROVIDER,
                                   model=endpoints[key])
        stats = await run_until(submitter(store, client),
                                lambda: submitted_at_least(store, total))
        assert stats["posts"] == total and stats["lookups"] == 0
        intents = {key: await store.get_intent(key) for key in keys}
        job_ids = {k: i.job_id for k, i in intents.items() if i is not None and i.job_id}
        assert len(set(job_ids.values())) == total == len(fake.billed())

        async def read_then_end() -> None:
            # every task read while it runs, then ended: two fail, the rest succeed
            await eventually(lambda: _read_all(store, job_ids.values()), what="first reads")
            for n, job_id in enumerate(job_ids.values()):
                fake.finish(job_id, "failed" if n in (1, 4) else "succeed",
                            "Failure to pass the risk control system" if n in (1, 4) else None)

        media = tmp_path / "media"
        media.mkdir()
        await poll_and_deliver(store, client, url, media, read_then_end)
        ends = await check_ends(store, fake, media, job_ids, endpoints)
        assert ends == {"succeed": 6, "failed": 2}
        assert fake.stats()["unauthorized"] == 0 and client.tokens_minted == 1


async def _read_all(store: PgStore, job_ids: Any) -> bool:
    for job_id in job_ids:
        row = await store.get_job(job_id)
        if row is None or row["provider_status"] not in ("submitted", "processing"):
            return False
    return True


async def test_a_token_kling_calls_expired_mid_run_is_replaced_and_no_job_is_lost(
        store: PgStore, tmp_path: Path) -> None:
    first, later = 4, 3
    async with serving(quick(processing_s=60.0)) as (fake, url), kling_client(url) as client:
        for i in range(first):
            await store.add_intent(f"t-{i}", payload(i), account=ACCOUNT, provider=PROVIDER,
                                   model=ENDPOINT)
        await run_until(submitter(store, client), lambda: submitted_at_least(store, first))

        async def expire_then_go_on() -> None:
            await eventually(lambda: _read_all(store, [t for t, _ in fake.billed()]),
                             what="first reads")
            # Kling's clock has passed every token it has seen: the next call of each loop
            # is refused (1004), and sent once more with a new token
            fake.expire_seen_tokens()
            for i in range(first, first + later):
                await store.add_intent(f"t-{i}", payload(i), account=ACCOUNT,
                                       provider=PROVIDER, model=ENDPOINT)
            stats = await run_until(submitter(store, client),
                                    lambda: submitted_at_least(store, first + later))
            assert stats["lookups"] == 0 and stats["unknown"] == 0
            for task_id, _ in fake.billed():
                fake.finish(task_id, "succeed")

        media = tmp_path / "media"
        media.mkdir()
        await poll_and_deliver(store, client, url, media, expire_then_go_on)
        intents = {f"t-{i}": await store.get_intent(f"t-{i}") for i in range(first + later)}
        job_ids = {k: i.job_id for k, i in intents.items() if i is not None and i.job_id}
        assert len(job_ids) == first + later == len(fake.billed())
        ends = await check_ends(store, fake, media, job_ids, dict.fromkeys(job_ids, ENDPOINT))
        assert ends == {"succeed": first + later}
        print(f"\nexpired token: unauthorized={fake.stats()['unauthorized']} "
              f"retries={client.token_retries} minted={client.tokens_minted}")
        assert fake.stats()["unauthorized"] >= 1 and client.token_retries >= 1
        # one new token replaced the refused one (the reads in flight shared it)
        assert client.tokens_minted == 2


# ---- 2. chaos ----

FAULTS = {"lose_reply": 0.07, "5xx_after": 0.07, "hang": 0.05, "hang_then_create": 0.05,
          "code_under_200": 0.05, "5xx_before": 0.03}
"""Create faults by share of the POSTs. No 429: a create 429 without Retry-After holds the
account's creates 30 s (the submitter's CREATE_429_PAUSE_S), nothing this test is about
(test_kling_client checks Kling's 1302 answer and the core's decision on it)."""


def fault_script(n: int, seed: int) -> list[str | None]:
    rng = random.Random(seed)
    kinds, weights = list(FAULTS), list(FAULTS.values())
    return [rng.choices([*kinds, None], weights=[*weights, 1 - sum(weights)])[0]
            for _ in range(n)]


async def test_chaos_a_hundred_intents_are_each_billed_once_polled_and_downloaded(
        store: PgStore, db_url: str, tmp_path: Path) -> None:
    # the worst case: the fake bills a repeated external_task_id again
    config = quick(repeated_external_id="accept", hang_s=1.4, processing_s=0.15,
                   jitter_s=0.3, outcome_mix={"succeed": 0.85, "failed": 0.15})
    assert HTTP_TIMEOUT_S < config.hang_s < HTTP_TIMEOUT_S + POLICY.reconcile_settle_s
    total = 100
    payloads = {f"chaos-{i:03d}": payload(i) for i in range(total)}
    started = time.monotonic()
    async with serving(config) as (fake, url), kling_client(url) as client:
        for key, body in payloads.items():
            await store.add_intent(key, body, account=ACCOUNT, provider=PROVIDER,
                                   model=ENDPOINT)
        # a submitter that died mid-POST: two intents claimed, one create sent (billed, its
        # answer never recorded), the other never sent at all
        dead = await store.claim_intents(2, 1.0, "dead-submitter", None, account=ACCOUNT)
        assert len(dead) == 2
        sent = await client.create_video(dead[0].payload, dead[0].key, dead[0].model)
        assert sent.status == 200
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                               "WHERE idempotency_key = ANY(%s)", ([c.key for c in dead],))
        script = fault_script(140, seed=29)
        fake.script_creates(script)

        runs: list[dict[str, int]] = []
        # killed: its task cancelled once a quarter are in, POSTs in flight and leases held
        runs.append(await run_until(submitter(store, client),
                                    lambda: submitted_at_least(store, 25), kill=True))
        # stopped (a graceful shutdown) once half are in, then re-run with the same keys
        runs.append(await run_until(submitter(store, client),
                                    lambda: submitted_at_least(store, 50)))
        runs.append(await run_until(submitter(store, client), lambda: settled(store, total)))
        submit_s = time.monotonic() - started

        states = await store.intent_counts()
        intents = {key: await store.get_intent(key) for key in payloads}
        billed = Counter(int(m.group(1)) for _, body in fake.billed()
                         if (m := MARKER.search(str(body.get("prompt", "")))))
        totals = {k: sum(r[k] for r in runs)
                  for k in ("posts", "lookups", "list_calls", "adopted", "resent", "parked",
                            "submitted", "unknown")}
        parked = [k for k, i in intents.items() if i is not None and i.state == "unknown"]
        duplicates = sum(n - 1 for n in billed.values() if n > 1)
        fstats = fake.stats()
        print(f"\nchaos: intent states {states} after {submit_s:.1f}s")
        print(f"chaos: fake create_posts={fstats['create_posts']} creates={fstats['creates']} "
              f"duplicates={duplicates} lookups (task reads before polling)="
              f"{fstats['status_reads']} faults="
              f"{ {k: v for k, v in fstats.items() if k.startswith('fault_')} }")
        print("chaos: submitters (killed, stopped, last)",
              [{k: r[k] for k in totals} for r in runs])
        print(f"chaos: submitter totals {totals} parked={len(parked)}")

        # never billed twice; every intent submitted, none parked
        assert len(billed) == total and duplicates == 0, billed.most_common(3)
        assert fstats["creates"] == total
        assert parked == [], [(k, i.last_error) for k, i in intents.items() if k in parked
                              and i is not None]
        assert all(i is not None and i.state == "submitted" for i in intents.values()), states
        job_ids = {k: i.job_id for k, i in intents.items() if i is not None and i.job_id}
        assert len(set(job_ids.values())) == total
        for key, job_id in job_ids.items():
            task = fake.tasks[job_id]
            assert task.body["prompt"] == payloads[key]["prompt"]
            assert task.external_task_id == external_task_id(key)
        # the faults happened, and the look-ups settled them
        assert totals["lookups"] >= 10 and totals["adopted"] >= 5 and totals["resent"] >= 1

        # poll every task to its end; download every succeeded one's video
        media = tmp_path / "media"
        media.mkdir()
        reads_before = fake.status_reads
        await poll_and_deliver(store, client, url, media)
        reads = fake.status_reads - reads_before
        ends = await check_ends(store, fake, media, job_ids, dict.fromkeys(job_ids, ENDPOINT))
        print(f"chaos: ends {ends}; status reads {reads} ({reads / total:.2f} per job); "
              f"media reads {fake.media_reads}; unauthorized {fake.stats()['unauthorized']}; "
              f"total {time.monotonic() - started:.1f}s")
        assert ends.get("succeed", 0) > 0 and ends.get("failed", 0) > 0
        assert fake.stats()["unauthorized"] == 0


async def test_an_external_id_another_system_used_is_never_adopted_nor_sent_for_ever(
        store: PgStore) -> None:
    """Kling's ids are per account: staging and production, another tool, or an older use of
    a key may hold this key's `external_task_id`. A task under it made before the intent was
    sent is never adopted as this intent's (its prompt is another's), and an id Kling refuses
    as taken that the look-up cannot find (a task at another endpoint) is parked, never sent
    again for ever."""
    async with serving(quick(processing_s=60.0)) as (fake, url), kling_client(url) as client:
        # made outside this database, on the same Kling account, before vidpoll's intents
        old = await client.create_video(payload(1, " OLD PROMPT"), "clip-1", "text2video")
        other = await client.create_video({**payload(2), "image": "https://in.example/a.png"},
                                          "clip-2", "image2video")
        assert old.status == 200 and other.status == 200, (old, other)
        await store.add_intent("clip-1", payload(3, " NEW PROMPT"), account=ACCOUNT,
                               provider=PROVIDER, model="text2video")
        await store.add_intent("clip-2", payload(4), account=ACCOUNT, provider=PROVIDER,
                               model="text2video")

        async def both_parked() -> bool:
            return (await store.intent_counts()).get("unknown", 0) == 2

        # no clock skew allowed for here: the outside tasks are milliseconds older (one clock)
        no_skew = dataclasses.replace(POLICY, reconcile_skew_s=0.0)
        stats = await run_until(submitter(store, client, policy=no_skew), both_parked)
        first, second = await store.get_intent("clip-1"), await store.get_intent("clip-2")
        assert first is not None and second is not None
        assert first.job_id is None and "made before this intent was first sent" in (
            first.last_error or ""), first.last_error
        assert second.job_id is None and "already used" in (second.last_error or ""), (
            second.last_error)
        assert len(fake.billed()) == 2  # the two outside creates; vidpoll billed nothing
        assert stats["posts"] <= 4, stats  # each intent sent once, refused once: no loop
