"""Luma end to end: vidpoll's Luma client, submitter, worker, deliverer and downloader against
the fake Luma (vidpoll.providers.luma.fake), real HTTP over loopback, real PostgreSQL.

What is checked: intents become generations of `--model` polled to `completed` (their video
downloaded byte for byte from the CDN, which never gets the key) or `failed` (with Luma's
reason); a video link that stopped working is read again and downloaded once it works; an
unsigned callback to `POST /webhooks/luma` makes its job due now, and a body without a
generation id is refused; and under create faults (lost replies, 5xx after the generation was
made, hangs past the client's timeout, a server that creates after its client gave up), a
killed submitter, a flaky list (5xx, 429, garbled pages) and pages that shift as other tools'
generations arrive, no input is billed twice, nothing is parked and every intent ends
submitted (adopted from the list, or sent once more when the list proves nothing was made).

Tests wait on observed state (the store, the fake) with generous overall timeouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.fetch_guard import AccountRules, FetchPolicy
from vidpoll.policy import PollPolicy
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.luma.client import LumaClient
from vidpoll.providers.luma.fake import (
    DEFAULT_KEY,
    FakeLuma,
    LumaFakeConfig,
    start_fake_luma,
)
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.web import make_app, start_server
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import FAST_POLICY

ACCOUNT = "luma"
PROVIDER = "luma"
MODEL = "ray-2"
HTTP_TIMEOUT_S = 1.0
POLICY = dataclasses.replace(FAST_POLICY, reconcile_settle_s=2.5, reconcile_deadline_s=45.0,
                             reconcile_skew_s=30.0)
WORKER_POLICY = dataclasses.replace(FAST_POLICY, default_poll_s=0.3)
"""Luma sends no poll hint: without one the worker waits default_poll_s between reads."""
WAIT_S = 30.0
FINAL_INTENT_STATES = ("submitted", "unknown", "rejected")


def quick(**overrides: Any) -> LumaFakeConfig:
    """Short lives, small files, seeded."""
    base: dict[str, Any] = {"queued_s": 0.05, "processing_s": 0.2, "media_bytes": 16 * 1024,
                            "seed": 11}
    return LumaFakeConfig(**{**base, **overrides})


@asynccontextmanager
async def serving(config: LumaFakeConfig) -> AsyncIterator[tuple[FakeLuma, str]]:
    fake = FakeLuma(config)
    runner, url = await start_fake_luma(fake)
    try:
        yield fake, url
    finally:
        await runner.cleanup()


def luma_client(url: str, **options: Any) -> LumaClient:
    return LumaClient(url, DEFAULT_KEY, timeout_s=HTTP_TIMEOUT_S,
                      options=ProviderOptions(**options))


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


def submitter(store: PgStore, client: LumaClient, *, concurrency: int = 16,
              policy: PollPolicy = POLICY) -> Submitter:
    return Submitter(store, {ACCOUNT: client}, SubmitterConfig(
        policy=policy, lease_s=HTTP_TIMEOUT_S + 4.0, http_timeout_s=HTTP_TIMEOUT_S,
        first_poll_s=0.0, max_active=None, concurrency=concurrency, accounts=(ACCOUNT,),
        shutdown_timeout_s=3.0))


def worker(store: PgStore, client: LumaClient, *, drain: bool = True) -> Worker:
    return Worker(store, {ACCOUNT: client}, WorkerConfig(
        policy=WORKER_POLICY, lease_s=5.0, concurrency=20, drain=drain, fetch_results=True,
        accounts=(ACCOUNT,)))


def media_policy(client: LumaClient, url: str) -> FetchPolicy:
    return FetchPolicy(AccountRules(), {ACCOUNT: AccountRules(
        url, api_headers=client.media_headers(), header_hosts=client.media_auth_hosts())})


def deliverer(store: PgStore, downloader: Downloader, *, drain: bool = True) -> Deliverer:
    return Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0, drain=drain,
                                           concurrency=8), downloader)


async def counts(store: PgStore) -> dict[str, int]:
    return await store.intent_counts()


async def settled(store: PgStore, total: int) -> bool:
    found = await counts(store)
    return sum(found.get(s, 0) for s in FINAL_INTENT_STATES) == total


async def submitted_at_least(store: PgStore, n: int) -> bool:
    return (await counts(store)).get("submitted", 0) >= n


async def run_until(loop: Submitter, check: Callable[[], Awaitable[bool]],
                    timeout_s: float = WAIT_S, *, kill: bool = False) -> dict[str, int]:
    """Run `loop` until `check()` holds; then stop it (or, `kill`, cancel its task: a process
    killed mid-way, its leases and its POSTs in flight left as they were)."""
    task = asyncio.create_task(loop.run())
    try:
        await eventually(lambda: _done_or(task, check), timeout_s, "the submitter")
    finally:
        if kill:
            task.cancel()
            for _ in range(3):
                done, _ = await asyncio.wait([task], timeout=6)
                if done:
                    break
                # seen about once in 15 runs on Python 3.11: the cancellation was lost
                # somewhere (reported to the core); said with where every task waits, then
                # cancelled again, so this test stays about billing
                print(f"\nthe cancelled submitter went on; cancelled again. Tasks:\n"
                      f"{pending_stacks()}")
                task.cancel()
            assert task.done(), "the cancelled submitter went on"  # never a hung test
        else:
            loop.stop()
            await asyncio.wait_for(task, 15)
    return dataclasses.asdict(loop.stats)


def pending_stacks() -> str:
    """Where each unfinished task waits (the innermost calls of its await chain): what a lost
    cancellation leaves behind."""
    lines = []
    for pending in asyncio.all_tasks():
        chain: list[str] = []
        node: Any = pending.get_coro()
        while node is not None and len(chain) < 50:
            frame = getattr(node, "cr_frame", None) or getattr(node, "gi_frame", None)
            if frame is not None:
                chain.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} "
                             f"{frame.f_code.co_name}")
            node = getattr(node, "cr_await", None) or getattr(node, "gi_yieldfrom", None)
        lines.append(f"  {pending.get_name()}: {' -> '.join(chain[-5:])}")
    return "\n".join(sorted(lines))


async def _done_or(task: asyncio.Task[None], check: Callable[[], Awaitable[bool]]) -> bool:
    if task.done():
        task.result()  # re-raise what ended it
        return True
    return await check()


async def poll_and_deliver(store: PgStore, client: LumaClient, url: str, media: Path) -> None:
    """Poll every job to its end (a draining worker), then deliver every download."""
    async with Downloader(media, policy=media_policy(client, url)) as downloader:
        delivering = deliverer(store, downloader)
        await delivering.prepare()
        await asyncio.wait_for(worker(store, client).run(), WAIT_S)
        delivering.producers_finished()
        await asyncio.wait_for(delivering.run(), WAIT_S)


def on_disk(media: Path, path: str) -> Path:
    found = Path(path)
    return found if found.is_absolute() else media / found


async def check_ends(store: PgStore, fake: FakeLuma, media: Path,
                     job_ids: list[str]) -> dict[str, int]:
    """Every job ended as its generation did; each completed one's video is on disk, byte for
    byte; a failed one has Luma's reason and no file. Returns the count of each end."""
    ends: Counter[str] = Counter()
    for job_id in job_ids:
        row = await store.get_job(job_id)
        job = await store.job(job_id)
        assert row is not None and job is not None
        end = fake.state(job_id)
        ends[end] += 1
        assert row["provider"] == PROVIDER and row["state"] == end, (job_id, row["state"])
        if end == "completed":
            assert row["outcome"] == "succeeded" and row["result_state"] == "fetched"
            assert len(job.files) == 1, (job_id, await store.job_deliveries(job_id))
            assert on_disk(media, job.files[0].path).read_bytes() == fake.expected_media(
                job_id)
        else:
            assert end == "failed" and row["outcome"] == "failed"
            assert row["last_error"] == fake.generations[job_id].failure_reason
            assert job.files == ()
    assert not [p for p in media.rglob("*") if p.name.endswith(".part")]
    return dict(ends)


# ---- 1. end to end ----

async def test_intents_are_polled_to_their_end_and_videos_downloaded_byte_for_byte(
        store: PgStore, tmp_path: Path) -> None:
    total = 8
    payloads = {f"e2e-{i:02d}": {"prompt": f"a heron, take {i}", "aspect_ratio": "16:9"}
                for i in range(total)}
    config = quick(outcome_mix={"completed": 0.6, "failed": 0.4}, seed=5)
    async with serving(config) as (fake, url), luma_client(url) as client:
        for key, payload in payloads.items():
            await store.add_intent(key, payload, account=ACCOUNT, provider=PROVIDER,
                                   model=MODEL)
        stats = await run_until(submitter(store, client),
                                lambda: submitted_at_least(store, total))
        assert stats["posts"] == total and stats["lookups"] == 0
        intents = {key: await store.get_intent(key) for key in payloads}
        job_ids = [i.job_id for i in intents.values() if i is not None and i.job_id]
        assert len(set(job_ids)) == total
        for key, intent in intents.items():
            assert intent is not None and intent.job_id is not None
            assert fake.generations[intent.job_id].request == {**payloads[key], "model": MODEL}

        media = tmp_path / "media"
        media.mkdir()
        await poll_and_deliver(store, client, url, media)
        ends = await check_ends(store, fake, media, job_ids)
        print(f"\nend to end: {ends}; status reads {fake.status_reads} "
              f"({fake.status_reads / total:.1f} a job); media reads {len(fake.media_reads)}")
        assert ends.get("completed", 0) > 0 and ends.get("failed", 0) > 0
        # one read of each completed video; none of a failed one's
        assert sorted(r.path.split("/")[2] for r in fake.media_reads if r.status == 200) == (
            sorted(j for j in job_ids if fake.state(j) == "completed"))


# ---- 2. a video link that stopped working ----

async def test_a_video_link_that_stopped_working_is_read_again_and_downloaded_once_it_works(
        store: PgStore, tmp_path: Path) -> None:
    async with serving(quick()) as (fake, url), luma_client(url) as client:
        answer = await client.create_video({"prompt": "a fox in snow"}, "k-expire", MODEL)
        assert answer.status == 201
        job_id = client.rules.created_job_id(json.loads(answer.body))
        assert job_id is not None
        assert await store.add_job(job_id, delay_s=0, account=ACCOUNT, provider=PROVIDER)
        media = tmp_path / "media"
        media.mkdir()
        async with Downloader(media, policy=media_policy(client, url)) as downloader:
            delivering = deliverer(store, downloader, drain=False)
            await delivering.prepare()
            await asyncio.wait_for(worker(store, client).run(), WAIT_S)  # polled to its end
            row = await store.get_job(job_id)
            assert row is not None and row["state"] == "completed"
            fake.expire_media(job_id)  # the link stops working before the download
            reads_before = fake.status_reads
            polling = worker(store, client, drain=False)  # there to read the result again
            tasks = [asyncio.create_task(delivering.run()), asyncio.create_task(polling.run())]
            try:
                async def refused_and_read_again() -> bool:
                    [found] = await store.job_deliveries(job_id)
                    return (found["state"] == "pending" and bool(found["last_error"])
                            and fake.status_reads > reads_before)

                await eventually(refused_and_read_again, what="the result read again")
                [refused] = await store.job_deliveries(job_id)
                fake.generations[job_id].media_expired = False  # the CDN serves it again

                async def delivered() -> dict[str, Any] | None:
                    [found] = await store.job_deliveries(job_id)
                    return found if found["state"] == "done" else None

                done = await eventually(delivered, what="the download")
            finally:
                delivering.stop()
                polling.stop()
                await asyncio.wait_for(asyncio.gather(*tasks), 15)
        print(f"\nexpired link: refused {refused}; then {done}; media reads "
              f"{[r.status for r in fake.media_reads]}")
        assert "403" in (refused["last_error"] or "")
        assert next(r.status for r in fake.media_reads if r.method == "GET") == 403
        assert fake.media_reads[-1].status in (200, 206)
        job = await store.job(job_id)
        assert job is not None and len(job.files) == 1
        assert on_disk(media, job.files[0].path).read_bytes() == fake.expected_media(job_id)


# ---- 3. the webhook route ----

async def test_an_unsigned_callback_makes_its_job_due_now_and_a_body_without_an_id_is_refused(
        store: PgStore) -> None:
    app = make_app(store, {PROVIDER: None})  # Luma signs nothing: no secret to give
    app_runner, app_url = await start_server(app, "127.0.0.1", 0)
    hook = f"{app_url}/webhooks/{PROVIDER}"

    async def due_in_s(job_id: str) -> float:
        row = await store.get_job(job_id)
        assert row is not None
        return float((row["next_poll_at"] - datetime.now(UTC)).total_seconds())

    try:
        async with serving(quick(queued_s=0.3, processing_s=60.0)) as (fake, url), \
                luma_client(url, webhook_url=hook) as client:
            answer = await client.create_video({"prompt": "hooked"}, "k-hook", MODEL)
            assert answer.status == 201
            job_id = client.rules.created_job_id(json.loads(answer.body))
            assert job_id is not None
            assert fake.generations[job_id].request["callback_url"] == hook
            assert await store.add_job(job_id, delay_s=3600, account=ACCOUNT,
                                       provider=PROVIDER)
            # a body that names no generation: refused, nothing touched
            async with aiohttp.ClientSession() as http, http.post(
                    hook, json={"state": "completed"}) as resp:
                assert resp.status == 400
            assert await due_in_s(job_id) > 3500

            # Luma's own callback when the generation starts dreaming: the job is due now
            async def dreaming_delivered() -> Any:
                return next((c for c in fake.callbacks if c.generation_id == job_id
                             and c.state == "dreaming" and c.status is not None), None)

            delivery = await eventually(dreaming_delivered, what="the fake's callback")
            print(f"\ncallback: {delivery.state} answered {delivery.status}")
            assert delivery.status == 200 and delivery.attempt == 1
            assert await due_in_s(job_id) <= 0.5
    finally:
        await app_runner.cleanup()


# ---- 4. chaos ----

def fault_script(rng: random.Random, n: int, faults: tuple[str, ...],
                 rate: float) -> list[str | None]:
    """`n` steps, each one of `faults` with probability `rate` (seeded), else None."""
    return [rng.choice(faults) if rng.random() < rate else None for _ in range(n)]


async def other_tools(fake: FakeLuma, every_s: float = 0.05, n: int = 4) -> None:
    """Generations made on the account by other tools, `n` every `every_s`, until
    cancelled."""
    while True:
        fake.add_foreign_generations(n)
        await asyncio.sleep(every_s)


async def test_chaos_a_hundred_intents_are_each_billed_once_polled_and_downloaded(
        store: PgStore, db_url: str, tmp_path: Path) -> None:
    config = quick(hang_s=1.5,  # > client timeout, < timeout + settle
                   processing_s=0.2, jitter_s=0.4, shift_on_list=3,
                   # a 429 names its wait (one that names none holds the account's creates
                   # 2 s, doubling for each in a row: too long for this test)
                   create_429_retry_after_s=0.2,
                   outcome_mix={"completed": 0.8, "failed": 0.2})
    assert config.hang_s > HTTP_TIMEOUT_S
    assert config.hang_s < HTTP_TIMEOUT_S + POLICY.reconcile_settle_s
    total = 100
    marker = "chaos-marker"
    payloads = {f"chaos-{i:03d}": {"prompt": f"a heron, take {i} [{marker}-{i:03d}]",
                                   "aspect_ratio": "16:9", "loop": i % 2 == 0}
                for i in range(total)}
    rng = random.Random(29)
    started = time.monotonic()
    async with serving(config) as (fake, url), luma_client(url) as client:
        fake.add_foreign_generations(150)  # the account's other generations: pages to walk
        for key, payload in payloads.items():
            await store.add_intent(key, payload, account=ACCOUNT, provider=PROVIDER,
                                   model=MODEL)

        # a submitter that died mid-POST: two intents claimed, one create sent (billed, its
        # answer never recorded), the other never sent at all
        dead = await store.claim_intents(2, 1.0, "dead-submitter", None, account=ACCOUNT)
        assert len(dead) == 2
        sent = await client.create_video(dead[0].payload, dead[0].key, dead[0].model)
        assert sent.status == 201
        # from here on, about one create in three and one list page in seven is a fault
        fake.script_creates(fault_script(rng, 3 * total, (
            "lose_reply", "5xx_after", "hang", "hang_then_create", "5xx_before", "429"), 0.3))
        fake.script_lists(fault_script(rng, 200, ("5xx", "garbled", "429"), 0.15))
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                               "WHERE idempotency_key = ANY(%s)", ([c.key for c in dead],))

        # the account is busy meanwhile (other tools' generations arrive all the time): an
        # unanswered create sinks pages deep in the list before it is looked up
        busy = asyncio.create_task(other_tools(fake))
        runs: list[dict[str, int]] = []
        try:
            # killed: its task cancelled once a quarter are in, POSTs in flight, leases held
            runs.append(await run_until(submitter(store, client),
                                        lambda: submitted_at_least(store, 25), kill=True))
            # stopped (a graceful shutdown) once half are in
            runs.append(await run_until(submitter(store, client),
                                        lambda: submitted_at_least(store, 50)))
            # and a last one, with the same keys, runs until every intent is submitted or
            # parked
            last = submitter(store, client)
            runs.append(await run_until(last, lambda: settled(store, total), timeout_s=60))
        finally:
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
        submit_s = time.monotonic() - started

        states = await counts(store)
        intents = {key: await store.get_intent(key) for key in payloads}
        # billed: by the unique marker in each prompt (foreign generations carry none)
        billed = Counter(str(req.get("prompt", "")).rsplit("[", 1)[-1]
                         for _, req in fake.billed() if marker in str(req.get("prompt", "")))
        duplicates = sum(n - 1 for n in billed.values() if n > 1)
        run_totals = {k: sum(r[k] for r in runs)
                      for k in ("posts", "lookups", "list_calls", "adopted", "resent",
                                "parked", "submitted", "unknown")}
        parked = [k for k, i in intents.items() if i is not None and i.state == "unknown"]
        print(f"\nchaos: intent states {states} after {submit_s:.1f}s")
        print(f"chaos: fake create_posts={fake.create_posts} billed={len(fake.billed())} "
              f"duplicates={duplicates} list_reads={fake.list_reads} "
              f"foreign={sum(g.foreign for g in fake.generations.values())} "
              f"generations listed={sum(not g.deleted for g in fake.generations.values())}")
        print("chaos: submitters (killed, stopped, last)",
              [{k: r[k] for k in run_totals} for r in runs])
        print(f"chaos: submitter totals {run_totals} parked={len(parked)} "
              f"lookups(walks={last.lookups.walks}, resumed={last.lookups.resumed}, "
              f"page_retries={last.lookups.page_retries}; last submitter only)")

        # never billed twice, every input billed once
        assert len(billed) == total and max(billed.values()) == 1, billed.most_common(3)
        assert len(fake.billed()) == total
        # every intent submitted, none parked; each job is a generation of its own input
        assert parked == [], [(k, i.last_error) for k, i in intents.items() if k in parked
                              and i is not None]
        assert all(i is not None and i.state == "submitted" for i in intents.values()), states
        job_ids = [i.job_id for i in intents.values() if i is not None and i.job_id]
        assert len(set(job_ids)) == total
        for key, intent in intents.items():
            assert intent is not None and intent.job_id in fake.generations, key
            g = fake.generations[intent.job_id]
            assert g.request == {**payloads[key], "model": MODEL} and not g.foreign
        assert run_totals["adopted"] > 0 and run_totals["lookups"] > 0

        # poll every generation to its end; download every completed one's video
        media = tmp_path / "media"
        media.mkdir()
        reads_before = fake.status_reads
        await poll_and_deliver(store, client, url, media)
        status_reads = fake.status_reads - reads_before
        ends = await check_ends(store, fake, media, job_ids)
        print(f"chaos: ends {ends}; status reads {status_reads} "
              f"({status_reads / total:.2f} a job); media reads {len(fake.media_reads)}; "
              f"total {time.monotonic() - started:.1f}s")
        assert ends.get("completed", 0) > 0
