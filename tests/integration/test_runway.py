"""Runway end to end: vidpoll's Runway client, submitter, worker, deliverer and downloader
against the fake Runway (vidpoll.providers.runway.fake), real HTTP over loopback, real
PostgreSQL.

What is checked: intents become tasks polled to each of Runway's ends (SUCCEEDED, FAILED with
its code and reason, CANCELLED as `canceled`); a succeeded task's outputs are downloaded byte
for byte through a fresh read of the task (the URLs the worker saw expired first: Runway signs
its CloudFront URLs with a `_jwt` that lives a day or two), and a link that expires between
that read and the fetch is read once more; no `_jwt` is stored anywhere in the database; a
THROTTLED task is shown as waiting for capacity and a task is read no more often than every
5 s (Runway's documented rhythm); under create faults (lost replies, 5xx before and after
billing, hangs past the client's timeout, a server that creates after its client gave up,
429s) and killed submitters no input is billed twice, every create whose outcome is unknown
is parked as `unknown` (Runway has no idempotency key and no task list), none is lost;
`on_unknown_create = "resend"` sends a lost create again (and may bill twice); the daily
cap's 429 holds the account's creates until the reset it names instead of a retry storm.

Run with -s for the figures. Tests wait on observed state (the store, the fake, the loops).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader, media_refresher
from vidpoll.fetch_guard import AccountRules, FetchPolicy
from vidpoll.models import DOWNLOAD, HttpAnswer
from vidpoll.policy import PollPolicy
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.runway import DEFAULT_API_VERSION
from vidpoll.providers.runway.client import RunwayClient
from vidpoll.providers.runway.fake import (
    DEFAULT_KEY,
    FakeRunway,
    RunwayFakeConfig,
    start_fake_runway,
)
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import FAST_POLICY, observe_sleeps

ACCOUNT = "rw"
PROVIDER = "runway"
ENDPOINT = "text_to_video"
HTTP_TIMEOUT_S = 1.0
POLICY = dataclasses.replace(FAST_POLICY, reconcile_settle_s=0.3)
"""An unknown create is taken up again (and, with no records to look in, parked) soon."""
WORKER_POLICY = dataclasses.replace(FAST_POLICY, default_poll_s=0.3)
FAST_FLOOR = 0.1
"""The account's own `min_poll_s` in these tests (Runway's default floor is 5 s)."""
OPTIONS = ProviderOptions(extra={"api_version": DEFAULT_API_VERSION})
WAIT_S = 30.0
FAILURE = "INTERNAL.BAD_OUTPUT.CODE01: An unexpected error occurred."


def intent_payload(i: int, tag: str = "e2e") -> dict[str, Any]:
    """A text_to_video body whose `promptText` is unique: the marker billed bodies are
    counted by."""
    return {"model": "gen4.5", "promptText": f"a heron, take {i} [{tag}-{i:03d}]",
            "ratio": "1280:720", "duration": 5}


def marker(body: dict[str, Any]) -> str:
    """The unique text of a create body (generate/video keeps it under `input`)."""
    inner = body.get("input")
    source: dict[str, Any] = inner if isinstance(inner, dict) else body
    return str(source.get("promptText"))


@dataclasses.dataclass
class Served:
    fake: FakeRunway
    url: str
    client: RunwayClient


@asynccontextmanager
async def serving(**config: Any) -> AsyncIterator[Served]:
    base: dict[str, Any] = {"processing_s": 0.2, "pending_s": 0.0, "media_bytes": 16 * 1024,
                            "seed": 7, **config}
    fake = FakeRunway(RunwayFakeConfig(**base))
    runner, url = await start_fake_runway(fake)
    try:
        async with RunwayClient(url, DEFAULT_KEY, timeout_s=HTTP_TIMEOUT_S,
                                options=OPTIONS) as client:
            yield Served(fake, url, client)
    finally:
        await runner.cleanup()


class CountingCreator:
    """The account's client, noting every create sent per key and how it was answered (the
    status, the transport error, or None while it is in flight or was cut off)."""

    def __init__(self, client: RunwayClient) -> None:
        self.client = client
        self.sent: dict[str, list[Any]] = defaultdict(list)

    @property
    def rules(self) -> Any:
        return self.client.rules

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        answers = self.sent[idempotency_key]
        answers.append(None)
        at = len(answers) - 1
        answer = await self.client.create_video(payload, idempotency_key, model)
        answers[at] = answer.status or answer.transport_error
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S,
                     what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def submitter(store: PgStore, creator: Any, *, concurrency: int = 16,
              resend: bool = False) -> Submitter:
    return Submitter(store, {ACCOUNT: creator}, SubmitterConfig(
        policy=POLICY, lease_s=HTTP_TIMEOUT_S + 1.5, http_timeout_s=HTTP_TIMEOUT_S,
        first_poll_s=0.0, max_active=None, concurrency=concurrency, accounts=(ACCOUNT,),
        shutdown_timeout_s=3.0,
        resend_unknown=frozenset({ACCOUNT}) if resend else frozenset()))


def worker(store: PgStore, client: RunwayClient, *, floor: float | None = FAST_FLOOR,
           drain: bool = True, policy: PollPolicy = WORKER_POLICY) -> Worker:
    return Worker(store, {ACCOUNT: client}, WorkerConfig(
        policy=policy, lease_s=5.0, concurrency=20, drain=drain, fetch_results=True,
        accounts=(ACCOUNT,), poll_floors={} if floor is None else {ACCOUNT: floor}))


def downloader(media: Path, s: Served, refresher: Any = None) -> Downloader:
    """The loopback fake is both the API and the CDN; fresh links come from the client."""
    rules = AccountRules(s.url, api_headers=s.client.media_headers(),
                         header_hosts=s.client.media_auth_hosts())
    return Downloader(media, policy=FetchPolicy(AccountRules(), {ACCOUNT: rules}),
                      fresh_media=media_refresher({ACCOUNT: refresher or s.client}))


async def run_until(loop: Submitter, check: Callable[[], Awaitable[bool]],
                    timeout_s: float = WAIT_S, *, kill: bool = False) -> dict[str, int]:
    """Run `loop` until `check()` holds; then stop it (or, `kill`, cancel its task: a process
    killed mid-way, its leases and its POSTs in flight left as they were)."""
    task = asyncio.create_task(loop.run())

    async def done_or() -> bool:
        if task.done():
            task.result()
            return True
        return await check()

    try:
        await eventually(done_or, timeout_s, "the submitter")
    finally:
        if kill:
            # cancelled until it ends, as a killed process would be: on Python 3.11 one
            # cancel that lands with a wake-up is swallowed by `asyncio.wait_for` (in
            # runner._sleep), and the loop went on sending
            while not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=0.5)
            await asyncio.gather(task, return_exceptions=True)
        else:
            loop.stop()
            await asyncio.wait_for(task, 15)
    return dataclasses.asdict(loop.stats)


async def states(store: PgStore) -> dict[str, int]:
    return await store.intent_counts()


async def submit_all(store: PgStore, creator: Any, total: int) -> None:
    async def all_in() -> bool:
        return (await states(store)).get("submitted", 0) >= total

    await run_until(submitter(store, creator), all_in)


async def deliver(store: PgStore, s: Served, media: Path, refresher: Any = None) -> None:
    async with downloader(media, s, refresher) as fetcher:
        deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0, drain=True,
                                                    concurrency=8), fetcher)
        await deliverer.prepare()
        deliverer.producers_finished()
        await asyncio.wait_for(deliverer.run(), WAIT_S)


def on_disk(path: str, media: Path) -> bytes:
    found = Path(path)
    return (found if found.is_absolute() else media / found).read_bytes()


async def rows_holding(db_url: str, needle: str) -> list[str]:
    """Every row of every vidpoll table whose text holds `needle` (table: start of the row)."""
    found: list[str] = []
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [r[0] for r in await cur.fetchall()]
        assert {"video_jobs", "video_intents", "vidpoll_deliveries"} <= set(tables)
        for table in tables:
            cur = await conn.execute(sql.SQL("SELECT t::text FROM {} AS t WHERE t::text LIKE {}")
                                     .format(sql.Identifier(table),
                                             sql.Literal(f"%{needle}%")))
            found += [f"{table}: {r[0][:120]}" for r in await cur.fetchall()]
    return found


# ---- 1. every end, and the outputs through a fresh read ---------------------------------------

async def test_each_end_is_recorded_and_outputs_are_downloaded_through_a_fresh_read(
        store: PgStore, db_url: str, tmp_path: Path) -> None:
    plan: dict[str, tuple[str, dict[str, Any], str]] = {
        "ok-text": (ENDPOINT, intent_payload(1), "SUCCEEDED"),
        "ok-image": ("image_to_video", {"model": "gen4_turbo", "promptText": "[ok-image]",
                                        "promptImage": "https://example.com/heron.png"},
                     "SUCCEEDED"),
        "ok-generate": ("generate/video", {"configId": "cfg_1", "input": {
            "promptText": "[ok-generate]", "duration": 4}}, "SUCCEEDED"),
        "failed": (ENDPOINT, intent_payload(2), "FAILED"),
        "cancelled": (ENDPOINT, intent_payload(3), "CANCELLED")}
    async with serving(processing_s=3600.0, output_count=2) as s:  # each ends when told
        await store.register_consumer(DOWNLOAD)  # every job that ends from now gets one
        for key, (endpoint, payload, _) in plan.items():
            await store.add_intent(key, payload, account=ACCOUNT, provider=PROVIDER,
                                   model=endpoint)
        await submit_all(store, s.client, len(plan))
        jobs: dict[str, str] = {}
        for key, (endpoint, payload, _) in plan.items():
            intent = await store.get_intent(key)
            assert intent is not None and intent.job_id is not None
            jobs[key] = intent.job_id
            task = s.fake.tasks[intent.job_id]
            assert (task.endpoint, task.body) == (endpoint, payload)  # sent unchanged
        assert len(s.fake.billed()) == len(plan)

        poller = asyncio.create_task(worker(store, s.client).run())
        try:
            async def all_seen_running() -> bool:
                for job_id in jobs.values():
                    row = await store.get_job(job_id)
                    if row is None or row["polls"] < 1 or row["state"] != "pending":
                        return False
                    assert row["provider_status"].startswith("running (progress "), row
                return True

            await eventually(all_seen_running, what="every task read while it runs")
            for key, (_, _, outcome) in plan.items():
                s.fake.finish(jobs[key], outcome)
            await asyncio.wait_for(asyncio.shield(poller), WAIT_S)
        finally:
            if not poller.done():
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)

        rows = {key: await store.get_job(job_id) for key, job_id in jobs.items()}
        words = {key: (row["state"], row["outcome"]) for key, row in rows.items()
                 if row is not None}
        assert words == {"ok-text": ("succeeded", "succeeded"),
                         "ok-image": ("succeeded", "succeeded"),
                         "ok-generate": ("succeeded", "succeeded"),
                         "failed": ("failed", "failed"), "cancelled": ("cancelled", "canceled")}
        assert rows["failed"]["last_error"] == FAILURE  # type: ignore[index]
        assert rows["failed"]["last_response"]["failureCode"]  # type: ignore[index]
        reads = s.fake.status_reads
        print(f"\nend to end: {reads} status reads for {len(jobs)} jobs "
              f"({reads / len(jobs):.2f} per job)")

        # every URL the worker's reads handed out expires before the download; what is
        # stored never had a signature at all
        assert s.fake.expire_outputs() >= 6
        media = tmp_path / "media"
        await deliver(store, s, media)
        succeeded = [k for k in plan if k.startswith("ok-")]
        for key in succeeded:
            job = await store.job(jobs[key])
            assert job is not None and job.outcome == "succeeded"
            stored = job.result["output"]  # type: ignore[index]
            assert len(stored) == 2 and not any("?" in url for url in stored)
            assert len(job.files) == 2, await store.job_deliveries(jobs[key])
            for index, media_file in enumerate(job.files):
                data = s.fake.media_bytes(jobs[key], index)
                assert on_disk(media_file.path, media) == data
                assert media_file.sha256 == hashlib.sha256(data).hexdigest()
                assert "?" not in media_file.url and media_file.url == stored[index]
            [download] = await store.job_deliveries(jobs[key])
            assert download["state"] == "done" and download["attempts"] == 1
        for key in ("failed", "cancelled"):
            assert await store.job_deliveries(jobs[key]) == []
        # one fresh read of each succeeded task, and every fetch with a live signature,
        # none with the key
        assert s.fake.status_reads - reads == len(succeeded)
        assert [r.status for r in s.fake.media_reads] == [200] * 2 * len(succeeded)
        assert all(r.valid and not r.authorization for r in s.fake.media_reads)
        assert not [p for p in media.rglob("*") if p.name.endswith(".part")]
        # no signature, anywhere
        assert await rows_holding(db_url, "_jwt") == []
        assert await rows_holding(db_url, "/cdn/") != []  # the check can see stored URLs


async def test_a_link_that_expires_between_the_fresh_read_and_the_fetch_is_read_again(
        store: PgStore, db_url: str, tmp_path: Path) -> None:
    async with serving() as s:
        await store.register_consumer(DOWNLOAD)
        answer = await s.client.create_video(intent_payload(1), "k", ENDPOINT)
        job_id = s.client.rules.created_job_id(json.loads(answer.body))
        assert job_id is not None
        s.fake.finish(job_id, "SUCCEEDED")
        assert await store.add_job(job_id, delay_s=0, account=ACCOUNT, provider=PROVIDER)
        await asyncio.wait_for(worker(store, s.client).run(), WAIT_S)
        reads = s.fake.status_reads

        class ExpiringOnce:
            """The client, but the first fresh links expire as soon as they are handed out."""

            def __init__(self) -> None:
                self.calls = 0

            async def fresh_media(self, job: str, handle: Any = None) -> list[str] | HttpAnswer:
                got = await s.client.fresh_media(job, handle)
                self.calls += 1
                if self.calls == 1:
                    assert s.fake.expire_outputs(job) >= 1
                return got

        refresher = ExpiringOnce()
        await deliver(store, s, tmp_path / "media", refresher)
        job = await store.job(job_id)
        assert job is not None and len(job.files) == 1
        assert on_disk(job.files[0].path, tmp_path / "media") == s.fake.media_bytes(job_id)
        [download] = await store.job_deliveries(job_id)
        assert download["state"] == "done" and download["attempts"] == 1
        assert refresher.calls == 2 and s.fake.status_reads - reads == 2
        assert [(r.valid, r.status) for r in s.fake.media_reads] == [(False, 403), (True, 200)]
        assert await rows_holding(db_url, "_jwt") == []


# ---- 2. THROTTLED, and Runway's 5 s ----------------------------------------------------------

async def test_a_throttled_task_waits_for_capacity_and_reads_keep_runways_five_seconds(
        store: PgStore) -> None:
    async with serving(processing_s=3600.0, concurrency=1) as s:  # one runs, one waits
        keys = ("first", "second")
        for i, key in enumerate(keys):
            await store.add_intent(key, intent_payload(i), account=ACCOUNT,
                                   provider=PROVIDER, model=ENDPOINT)
        await submit_all(store, s.client, len(keys))
        job_ids = [(await store.get_intent(k)).job_id for k in keys]  # type: ignore[union-attr]

        # the worker's own default wait is 0.3 s: only Runway's floor makes it 5
        poller = worker(store, s.client, floor=None, drain=False)
        task = asyncio.create_task(poller.run())
        try:
            async def read_once() -> list[dict[str, Any]] | None:
                rows = [await store.get_job(j) for j in job_ids if j is not None]
                done = [r for r in rows if r is not None and r["polls"] >= 1]
                return done if len(done) == len(keys) else None

            rows = await eventually(read_once, what="one read of each task")
        finally:
            poller.stop()
            await asyncio.wait_for(task, 15)
        shown = sorted(r["provider_status"] for r in rows)
        print(f"\nthrottled: provider_status {shown}")
        assert shown == ["running (progress 0%)", "throttled (waiting for capacity)"]
        assert {r["last_response"]["status"] for r in rows} == {"RUNNING", "THROTTLED"}
        for row in rows:
            waits = (row["next_poll_at"] - row["last_polled_at"]).total_seconds()
            assert 4.5 <= waits <= 5.5, waits
        assert s.fake.status_reads == len(keys)  # nothing read twice within the 5 s


# ---- 3. chaos ---------------------------------------------------------------------------------

async def test_chaos_no_input_is_billed_twice_and_every_unknown_create_is_parked(
        store: PgStore, db_url: str, tmp_path: Path) -> None:
    total = 100
    faults = ("lose_reply", "5xx_after", "5xx_before", "hang", "hang_then_create", "429")
    rng = random.Random(29)
    script = [rng.choices((None, *faults), weights=(64, *[6] * len(faults)))[0]
              for _ in range(2 * total)]
    async with serving(processing_s=0.2, jitter_s=0.3, hang_s=1.5, media_bytes=4096,
                       daily_cap_retry_after_s=0.05,
                       outcome_mix={"SUCCEEDED": 0.8, "FAILED": 0.1, "CANCELLED": 0.1}) as s:
        assert s.fake.config.hang_s > HTTP_TIMEOUT_S
        await store.register_consumer(DOWNLOAD)
        creator = CountingCreator(s.client)
        payloads = {f"chaos-{i:03d}": intent_payload(i, "chaos") for i in range(total)}
        by_marker = {marker(p): k for k, p in payloads.items()}
        for key, payload in payloads.items():
            await store.add_intent(key, payload, account=ACCOUNT, provider=PROVIDER,
                                   model=ENDPOINT)

        # a submitter that died mid-POST: two intents claimed, one create sent (billed, its
        # answer never recorded), the other never sent at all; their leases then lapse
        dead = await store.claim_intents(2, 1.0, "dead-submitter", None, account=ACCOUNT)
        assert len(dead) == 2
        creator.sent[dead[0].key].append("dead")
        answer = await s.client.create_video(dead[0].payload, dead[0].key, dead[0].model)
        assert answer.status == 200
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                               "WHERE idempotency_key = ANY(%s)", ([c.key for c in dead],))
        s.fake.script_creates(script)

        async def at_least(n: int) -> bool:
            return (await states(store)).get("submitted", 0) >= n

        async def settled() -> bool:
            found = await states(store)
            return found.get("submitted", 0) + found.get("unknown", 0) == total

        started = time.monotonic()
        runs = [
            # killed once a quarter are in: POSTs in flight and leases held
            await run_until(submitter(store, creator), lambda: at_least(25), kill=True),
            # stopped (a graceful shutdown) once a half are in
            await run_until(submitter(store, creator), lambda: at_least(50)),
            # and a last one until every intent is submitted or parked
            await run_until(submitter(store, creator), settled, timeout_s=60)]
        submit_s = time.monotonic() - started

        intents = {key: await store.get_intent(key) for key in payloads}
        parked = {k: i for k, i in intents.items() if i is not None and i.state == "unknown"}
        submitted = {k: i for k, i in intents.items() if i is not None and i.state == "submitted"}
        job_ids = {k: i.job_id for k, i in submitted.items()}
        # none lost: every intent submitted with a tracked job of its own input, or parked
        assert len(parked) + len(submitted) == total
        assert len(set(job_ids.values())) == len(submitted)
        for key, job_id in job_ids.items():
            assert job_id is not None and await store.get_job(job_id) is not None, key
            assert s.fake.tasks[job_id].body == payloads[key]
        # every unknown create parked for an operator, never sent again: only a 429 (nothing
        # created) was ever followed by another send of the same key
        assert parked, "the faults should have left some creates unknown"
        for intent in parked.values():
            assert "vidpoll intents resolve" in (intent.last_error or ""), intent.last_error
        for key, answers in creator.sent.items():
            assert all(a == 429 for a in answers[:-1]), (key, answers)
        assert dead[0].key in parked, "a create lost mid-POST is parked, never sent again"

        # poll every submitted job to its end; download what succeeded (each through a fresh
        # read of its task)
        reads_before = s.fake.status_reads
        await asyncio.wait_for(worker(store, s.client).run(), WAIT_S)
        reads = s.fake.status_reads - reads_before
        media = tmp_path / "media"
        await deliver(store, s, media)
        outcomes: dict[str, int] = defaultdict(int)
        downloaded = 0
        for job_id in job_ids.values():
            assert job_id is not None
            job = await store.job(job_id)
            assert job is not None and job.state != "pending" and job.outcome is not None
            outcomes[job.outcome] += 1
            if job.outcome == "succeeded":
                assert [on_disk(f.path, media) for f in job.files] == [
                    s.fake.media_bytes(job_id, 0)]
                downloaded += len(job.files)
        refreshes = s.fake.status_reads - reads_before - reads

        # never billed twice (counted by each body's unique text, after the late creates of
        # `hang_then_create` have landed: the fake created them while the worker polled)
        billed = Counter(marker(body) for _, body in s.fake.billed())
        duplicates = sum(n - 1 for n in billed.values() if n > 1)
        held = set(job_ids.values())
        orphans = [(task_id, body) for task_id, body in s.fake.billed() if task_id not in held]
        print(f"\nchaos: intents {await states(store)}; submitting took {submit_s:.1f}s")
        print(f"chaos: create POSTs={s.fake.create_posts} billed={len(s.fake.billed())} "
              f"duplicates={duplicates} script={Counter(x for x in script if x)}")
        print(f"chaos: submitters (killed, stopped, last) "
              f"{[{k: r[k] for k in ('posts', 'submitted', 'unknown', 'parked')} for r in runs]}")
        print(f"chaos: parked={len(parked)} (billed anyway: {len(orphans)}), "
              f"submitted={len(submitted)}, sends per key max="
              f"{max(len(v) for v in creator.sent.values())}")
        print(f"chaos: outcomes {dict(outcomes)}; files downloaded {downloaded}; status reads "
              f"{reads} ({reads / max(1, len(job_ids)):.2f} per job), {refreshes} fresh reads "
              f"for the downloads")
        assert billed and duplicates == 0, billed.most_common(3)
        # each billed task is a job, or a parked intent's (the operator's to resolve)
        assert all(by_marker[marker(body)] in parked for _, body in orphans)
        assert downloaded == outcomes["succeeded"] > 0
        assert refreshes == outcomes["succeeded"]
        assert await rows_holding(db_url, "_jwt") == []


# ---- 4. on_unknown_create = "resend" ----------------------------------------------------------

async def test_resend_sends_a_lost_create_again_and_may_bill_twice(store: PgStore) -> None:
    async with serving() as s:
        creator = CountingCreator(s.client)
        payload = intent_payload(9)
        await store.add_intent("again", payload, account=ACCOUNT, provider=PROVIDER,
                               model=ENDPOINT)
        s.fake.script_creates(["lose_reply", None])  # billed, its answer lost; then answered

        async def sent() -> bool:
            found = await store.get_intent("again")
            return found is not None and found.state == "submitted"

        stats = await run_until(submitter(store, creator, resend=True), sent)
        intent = await store.get_intent("again")
        assert intent is not None and intent.job_id is not None
        billed = Counter(marker(body) for _, body in s.fake.billed())
        print(f"\nresend: sends {creator.sent['again']}; billed {billed[marker(payload)]}; "
              f"submitter {stats}")
        assert stats["resent"] == 1 and len(creator.sent["again"]) == 2
        assert billed == {marker(payload): 2}  # sent again: billed twice
        assert intent.job_id in s.fake.tasks and len(s.fake.tasks) == 2


# ---- 5. the daily cap -------------------------------------------------------------------------

async def test_the_daily_caps_429_holds_the_accounts_creates_until_its_reset(
        store: PgStore) -> None:
    reset_s = 3600
    async with serving(daily_cap=2, daily_cap_retry_after_s=reset_s) as s:
        creator = CountingCreator(s.client)
        for i in range(5):
            await store.add_intent(f"cap-{i}", intent_payload(i, "cap"), account=ACCOUNT,
                                   provider=PROVIDER, model=ENDPOINT)
        loop = submitter(store, creator, concurrency=1)  # one POST at a time: exact counts

        def refused() -> bool:
            return any(429 in answers for answers in creator.sent.values())

        sleeps = observe_sleeps(loop, note=refused)
        task = asyncio.create_task(loop.run())
        try:
            # idle after the refusal: asleep, nothing in flight, the sleep begun after it
            await loop.signals.wait_for(
                lambda: task.done() or (sleeps.asleep and bool(sleeps.notes[-1])
                                        and loop._inflight == 0), WAIT_S)
            posts = s.fake.create_posts
            counts = await states(store)
            buckets = [b for b in await store.buckets()
                       if b["account"] == ACCOUNT and b["kind"] == "create"]
        finally:
            loop.stop()
            await asyncio.wait_for(task, 15)
        print(f"\ndaily cap: create POSTs {posts}; intents {counts}; sleep asked "
              f"{sleeps.asked[-1]:.1f}s; buckets {buckets}")
        assert len(s.fake.billed()) == 2
        assert posts == 3, "a create refused for the daily cap holds the others (no storm)"
        assert counts == {"submitted": 2, "queued": 3}
        [bucket] = buckets
        assert bucket["paused_s"] > reset_s - 60  # until the reset the 429 named
