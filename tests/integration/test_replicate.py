"""Replicate end to end: vidpoll's Replicate client, submitter, worker, deliverer and downloader
against the fake Replicate (vidpoll.providers.replicate.fake), real HTTP over loopback, real
PostgreSQL.

What is checked: under create faults (lost replies, 5xx before and after billing, hangs, a
server that creates after its client gave up, 429s) and killed submitters, no input is billed
twice and every intent ends submitted (adopted from Replicate's list, or sent once more when
the list proves nothing was created); every prediction is polled to Replicate's own terminal
word and every succeeded one's file downloaded intact; a prediction whose data Replicate
removed fails its download for good, naming the removal; `aborted` is a terminal state of its
own, outcome `canceled`; the token never goes to another host; and `POST /webhooks/replicate`
makes a tracked job due on a delivery the fake signed, refusing a forged one.

Tests wait on observed state (the store, the fake) with generous overall timeouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from aiohttp import web

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.fetch_guard import AccountRules, FetchPolicy
from vidpoll.policy import PollPolicy
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.replicate.client import ReplicateClient
from vidpoll.providers.replicate.fake import (
    DEFAULT_MODEL,
    DEFAULT_TOKEN,
    DEFAULT_VERSIONS,
    DEFAULT_WEBHOOK_SECRET,
    FakeReplicate,
    ReplicateFakeConfig,
    sign,
    start_fake_replicate,
)
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.web import make_app, start_server
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import FAST_POLICY

ACCOUNT = "rep"
PROVIDER = "replicate"
MODEL = f"{DEFAULT_MODEL}:{DEFAULT_VERSIONS[-1]}"
HTTP_TIMEOUT_S = 1.0
POLICY = dataclasses.replace(FAST_POLICY, reconcile_settle_s=2.5, reconcile_deadline_s=45.0,
                             reconcile_skew_s=30.0)
WORKER_POLICY = dataclasses.replace(FAST_POLICY, default_poll_s=1.0)
"""Replicate sends no poll hint: without one the worker waits default_poll_s between reads."""
WAIT_S = 60.0
FINAL_INTENT_STATES = ("submitted", "unknown", "rejected")


def quick(**overrides: Any) -> ReplicateFakeConfig:
    """Short lives, small files, seeded."""
    base: dict[str, Any] = {"starting_s": 0.2, "processing_s": 0.4, "file_bytes": 16 * 1024,
                            "seed": 11}
    return ReplicateFakeConfig(**{**base, **overrides})


@asynccontextmanager
async def serving(config: ReplicateFakeConfig) -> AsyncIterator[tuple[FakeReplicate, str]]:
    fake = FakeReplicate(config)
    runner, url = await start_fake_replicate(fake)
    try:
        yield fake, url
    finally:
        await runner.cleanup()


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S,
                     what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def submitter(store: PgStore, client: ReplicateClient, *, concurrency: int = 16,
              policy: PollPolicy = POLICY) -> Submitter:
    return Submitter(store, {ACCOUNT: client}, SubmitterConfig(
        policy=policy, lease_s=HTTP_TIMEOUT_S + 4.0, http_timeout_s=HTTP_TIMEOUT_S,
        first_poll_s=0.0, max_active=None, concurrency=concurrency, accounts=(ACCOUNT,),
        shutdown_timeout_s=3.0))


def worker(store: PgStore, clients: dict[str, ReplicateClient]) -> Worker:
    return Worker(store, clients, WorkerConfig(
        policy=WORKER_POLICY, lease_s=5.0, concurrency=20, drain=True, fetch_results=True,
        accounts=tuple(clients)))


def media_rules(client: ReplicateClient, url: str, **kwargs: Any) -> AccountRules:
    return AccountRules(url, api_headers=client.media_headers(),
                        header_hosts=client.media_auth_hosts(), **kwargs)


async def counts(store: PgStore) -> dict[str, int]:
    return await store.intent_counts()


async def settled(store: PgStore, total: int) -> bool:
    found = await counts(store)
    return sum(found.get(s, 0) for s in FINAL_INTENT_STATES) == total


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
            await asyncio.gather(task, return_exceptions=True)
        else:
            loop.stop()
            await asyncio.wait_for(task, 15)
    return dataclasses.asdict(loop.stats)


async def _done_or(task: asyncio.Task[None], check: Callable[[], Awaitable[bool]]) -> bool:
    if task.done():
        task.result()  # re-raise what ended it
        return True
    return await check()


async def submitted_at_least(store: PgStore, n: int) -> bool:
    return (await counts(store)).get("submitted", 0) >= n


def files_left(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


# ---- 1. chaos ----

async def test_chaos_a_hundred_intents_are_each_billed_once_polled_and_downloaded(
        store: PgStore, db_url: str, tmp_path: Path) -> None:
    faults = dict.fromkeys(("lose_reply", "5xx_after", "5xx_before", "hang",
                            "hang_then_create", "429"), 0.08)
    config = quick(create_fault_rates=faults, hang_s=1.5,  # > client timeout, < timeout+settle
                   processing_jitter_s=0.6,
                   outcome_mix={"succeeded": 0.7, "failed": 0.1, "canceled": 0.1,
                                "aborted": 0.1})
    assert config.hang_s > HTTP_TIMEOUT_S
    assert config.hang_s < HTTP_TIMEOUT_S + POLICY.reconcile_settle_s
    total = 100
    payloads = {f"chaos-{i:03d}": {"prompt": f"a heron, take {i}", "seed": i, "loop": i % 2 == 0}
                for i in range(total)}
    async with serving(config) as (fake, url), ReplicateClient(
            url, DEFAULT_TOKEN, timeout_s=HTTP_TIMEOUT_S) as client:
        for key, payload in payloads.items():
            await store.add_intent(key, payload, account=ACCOUNT, provider=PROVIDER,
                                   model=MODEL)

        # a submitter that died mid-POST: two intents claimed, one create sent (billed, its
        # answer never recorded), the other never sent at all
        dead = await store.claim_intents(2, 1.0, "dead-submitter", None, account=ACCOUNT)
        assert len(dead) == 2
        fake.script_creates(["ok"])
        sent = await client.create_video(dead[0].payload, dead[0].key, dead[0].model)
        assert sent.status == 201
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                               "WHERE idempotency_key = ANY(%s)", ([c.key for c in dead],))

        runs: list[dict[str, int]] = []
        # killed: its task cancelled once a quarter are in, POSTs in flight and leases held
        runs.append(await run_until(submitter(store, client),
                                    lambda: submitted_at_least(store, 25), kill=True))
        # stopped (a graceful shutdown) once half are in
        runs.append(await run_until(submitter(store, client),
                                    lambda: submitted_at_least(store, 50)))
        # and a last one runs until every intent is submitted or parked
        last = submitter(store, client)
        runs.append(await run_until(last, lambda: settled(store, total), timeout_s=90))

        states = await counts(store)
        intents = {key: await store.get_intent(key) for key in payloads}
        billed = fake.created_inputs()
        fstats = fake.stats()
        run_totals = {k: sum(r[k] for r in runs)
                      for k in ("posts", "lookups", "list_calls", "adopted", "resent",
                                "parked", "submitted", "unknown")}
        parked = [k for k, i in intents.items() if i is not None and i.state == "unknown"]
        print(f"\nchaos: intent states {states}")
        print(f"chaos: fake creates={fstats['creates']} create_requests="
              f"{fstats['create_requests']} duplicates="
              f"{sum(n - 1 for n in billed.values() if n > 1)} "
              f"faults={ {k: v for k, v in fstats.items() if k.startswith('fault_')} } "
              f"throttled={fstats['throttled']} lists={fstats['lists']} "
              f"list_pages={fstats['list_pages']}")
        print("chaos: submitters (killed, stopped, last)",
              [{k: r[k] for k in run_totals} for r in runs])
        print(f"chaos: submitter totals {run_totals} parked_keys={parked}")

        # never billed twice
        assert billed and max(billed.values()) == 1, billed.most_common(3)
        # every intent submitted or parked; each job is a prediction of its own input
        assert all(i is not None and i.state in ("submitted", "unknown")
                   for i in intents.values()), states
        assert parked == [], [(k, i.last_error) for k, i in intents.items() if k in parked
                              and i is not None]
        job_ids = [i.job_id for i in intents.values() if i is not None]
        assert len(set(job_ids)) == total
        for key, intent in intents.items():
            assert intent is not None and intent.job_id in fake.predictions, key
            prediction = fake.predictions[intent.job_id]
            assert prediction.input == payloads[key] and prediction.model == DEFAULT_MODEL
        # and nothing billed that no intent holds
        assert set(fake.predictions) == set(job_ids)

        # poll every prediction to its end; download every succeeded one's file
        media = tmp_path / "media"
        media.mkdir()
        policy = FetchPolicy(AccountRules(), {ACCOUNT: media_rules(client, url)})
        async with Downloader(media, policy=policy) as downloader:
            deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0,
                                                        drain=True, concurrency=8), downloader)
            await deliverer.prepare()
            await asyncio.wait_for(worker(store, {ACCOUNT: client}).run(), WAIT_S)
            deliverer.producers_finished()
            await asyncio.wait_for(deliverer.run(), WAIT_S)

        reads_before_download = fake.stats()["status_reads"]
        words: dict[str, int] = {}
        downloaded = 0
        for job_id in job_ids:
            assert job_id is not None
            row = await store.get_job(job_id)
            view = fake.view(job_id)
            assert row is not None and row["provider"] == PROVIDER
            assert row["state"] == view["status"], (job_id, row["state"], view["status"])
            words[row["state"]] = words.get(row["state"], 0) + 1
            expected_outcome = {"succeeded": "succeeded", "failed": "failed",
                                "canceled": "canceled", "aborted": "canceled"}[view["status"]]
            assert row["outcome"] == expected_outcome
            job = await store.job(job_id)
            assert job is not None
            if view["status"] == "succeeded":
                assert len(job.files) == 1, (job_id, await store.job_deliveries(job_id))
                on_disk = Path(job.files[0].path)
                if not on_disk.is_absolute():
                    on_disk = media / on_disk
                assert on_disk.read_bytes() == fake.expected_file(job_id, "output.mp4")
                downloaded += 1
            else:
                assert job.files == ()
        assert not [p for p in media.rglob("*") if p.name.endswith(".part")]
        print(f"chaos: terminal words {words}; downloaded {downloaded}; status reads "
              f"{reads_before_download} ({reads_before_download / total:.2f} per prediction); "
              f"file reads {fake.stats()['file_reads']}")
        assert downloaded == words.get("succeeded", 0) > 0


# ---- 2. data removed ----

async def test_a_prediction_whose_data_was_removed_fails_its_download_for_good(
        store: PgStore, tmp_path: Path) -> None:
    # removed the moment it ends: the first read that sees it succeeded sees no output
    async with serving(quick(data_retention_s=0.0)) as (fake, url), ReplicateClient(
            url, DEFAULT_TOKEN, timeout_s=2.0) as client:
        answer = await client.create_video({"prompt": "gone"}, "k-gone", MODEL)
        assert answer.status == 201
        job_id = json.loads(answer.body)["id"]
        assert await store.add_job(job_id, delay_s=0, account=ACCOUNT, provider=PROVIDER)
        media = tmp_path / "media"
        media.mkdir()
        policy = FetchPolicy(AccountRules(), {ACCOUNT: media_rules(client, url)})
        async with Downloader(media, policy=policy) as downloader:
            deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0,
                                                        drain=True), downloader)
            await deliverer.prepare()
            await asyncio.wait_for(worker(store, {ACCOUNT: client}).run(), WAIT_S)
            deliverer.producers_finished()
            await asyncio.wait_for(deliverer.run(), WAIT_S)
        row = await store.get_job(job_id)
        assert row is not None and row["state"] == "succeeded"
        assert row["result"]["data_removed"] is True and row["result"]["output"] is None
        [delivery] = await store.job_deliveries(job_id)
        print(f"\ndata removed: delivery {delivery}")
        assert delivery["state"] == "failed"
        assert "removed" in (delivery["last_error"] or "")
        assert delivery["attempts"] == 1  # failed for good: not retried
        assert fake.stats()["file_reads"] == 0
        assert files_left(media) == []


async def test_data_removed_after_the_result_was_fetched_fails_once_the_result_is_read_again(
        store: PgStore, tmp_path: Path) -> None:
    # the result is fetched with its URL; Replicate removes the data before the download: the
    # file answers 404, the result is read again, and that read says the data is gone
    async with serving(quick(data_retention_s=1.0)) as (fake, url), ReplicateClient(
            url, DEFAULT_TOKEN, timeout_s=2.0) as client:
        answer = await client.create_video({"prompt": "late"}, "k-late", MODEL)
        assert answer.status == 201
        job_id = json.loads(answer.body)["id"]
        assert await store.add_job(job_id, delay_s=0, account=ACCOUNT, provider=PROVIDER)
        media = tmp_path / "media"
        media.mkdir()
        policy = FetchPolicy(AccountRules(), {ACCOUNT: media_rules(client, url)})
        async with Downloader(media, policy=policy) as downloader:
            deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0,
                                                        drain=True), downloader)
            await deliverer.prepare()
            await asyncio.wait_for(worker(store, {ACCOUNT: client}).run(), WAIT_S)
            row = await store.get_job(job_id)
            assert row is not None and row["result_state"] == "fetched"
            assert row["result"]["output"] is not None  # fetched while it was there

            async def removed() -> bool:
                return bool(fake.view(job_id)["data_removed"])

            await eventually(removed, what="the fake to remove the data")
            poller = Worker(store, {ACCOUNT: client}, WorkerConfig(
                policy=WORKER_POLICY, lease_s=5.0, concurrency=4, fetch_results=True,
                accounts=(ACCOUNT,)))  # there to read the result again
            polling = asyncio.create_task(poller.run())
            delivering = asyncio.create_task(deliverer.run())
            try:
                async def delivery_failed() -> dict[str, Any] | None:
                    found = await store.job_deliveries(job_id)
                    return found[0] if found and found[0]["state"] == "failed" else None

                delivery = await eventually(delivery_failed, what="the download to fail")
            finally:
                poller.stop()
                deliverer.producers_finished()
                await asyncio.wait_for(polling, 15)
                await asyncio.wait_for(delivering, WAIT_S)
        print(f"\ndata removed later: delivery {delivery}")
        assert "removed" in (delivery["last_error"] or "")
        assert delivery["attempts"] <= 3  # the 404, then the fresh result's verdict
        row = await store.get_job(job_id)
        assert row is not None and row["result"]["data_removed"] is True
        # nothing at all: no file under its final name, and no partial file (an expired link
        # discards it, and the job's empty folder with it)
        assert files_left(media) == []


# ---- 3. aborted ----

async def test_aborted_is_a_terminal_state_of_its_own_with_outcome_canceled(
        store: PgStore) -> None:
    async with serving(quick(outcome_mix={"aborted": 1.0})) as (fake, url), ReplicateClient(
            url, DEFAULT_TOKEN, timeout_s=2.0) as client:
        answer = await client.create_video({"prompt": "never ran"}, "k-abort", MODEL)
        assert answer.status == 201
        job_id = json.loads(answer.body)["id"]
        assert await store.add_job(job_id, delay_s=0, account=ACCOUNT, provider=PROVIDER)
        await asyncio.wait_for(worker(store, {ACCOUNT: client}).run(), WAIT_S)
        assert fake.view(job_id)["status"] == "aborted"
        job = await store.job(job_id)
        assert job is not None and job.state == "aborted" and job.outcome == "canceled"
        assert job.is_final and not job.succeeded and job.provider == PROVIDER


# ---- 4. the token never goes to another host ----

class OtherHost:
    """Another loopback origin serving the fake's files (no token wanted), noting each
    request's headers."""

    def __init__(self, fake: FakeReplicate) -> None:
        self.fake = fake
        self.seen: list[dict[str, str]] = []

    async def file(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        return web.Response(body=self.fake.expected_file(request.match_info["id"],
                                                         request.match_info["name"]),
                            content_type="video/mp4")


async def test_files_on_another_origin_are_fetched_only_if_allowed_and_never_with_the_token(
        store: PgStore, tmp_path: Path) -> None:
    fake = FakeReplicate(quick())
    other = OtherHost(fake)
    app = web.Application()
    app.router.add_get("/files/{id}/{name}", other.file)
    other_runner = web.AppRunner(app)
    await other_runner.setup()
    site = web.TCPSite(other_runner, "127.0.0.1", 0)
    await site.start()
    port = other_runner.addresses[0][1]
    fake.config.files_base_url = f"http://127.0.0.1:{port}"
    runner, url = await start_fake_replicate(fake)
    try:
        async with ReplicateClient(url, DEFAULT_TOKEN, timeout_s=2.0) as client:
            # two accounts of one token: "rep" allows no other host, "rep2" allows this one
            jobs = {}
            for account in (ACCOUNT, "rep2"):
                answer = await client.create_video({"prompt": account}, f"k-{account}", MODEL)
                assert answer.status == 201
                jobs[account] = json.loads(answer.body)["id"]
                assert await store.add_job(jobs[account], delay_s=0, account=account,
                                           provider=PROVIDER)
            media = tmp_path / "media"
            media.mkdir()
            policy = FetchPolicy(AccountRules(), {
                ACCOUNT: media_rules(client, url),
                "rep2": media_rules(client, url,
                                    allow_hosts=frozenset({("127.0.0.1", port)}))})
            async with Downloader(media, policy=policy) as downloader:
                deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0,
                                                            drain=True), downloader)
                await deliverer.prepare()
                await asyncio.wait_for(
                    worker(store, {ACCOUNT: client, "rep2": client}).run(), WAIT_S)
                deliverer.producers_finished()
                await asyncio.wait_for(deliverer.run(), WAIT_S)

            [refused] = await store.job_deliveries(jobs[ACCOUNT])
            [allowed] = await store.job_deliveries(jobs["rep2"])
            print(f"\nother host: refused {refused}\nallowed {allowed}")
            assert refused["state"] == "failed" and refused["attempts"] == 1
            assert allowed["state"] == "done"
            job = await store.job(jobs["rep2"])
            assert job is not None and len(job.files) == 1
            path = Path(job.files[0].path)
            path = path if path.is_absolute() else media / path
            assert path.read_bytes() == fake.expected_file(jobs["rep2"], "output.mp4")
            # only the allowed account's file was fetched there, and without the token
            assert len(other.seen) >= 1
            assert all(h.get("Authorization") is None for h in other.seen), other.seen
            assert all(DEFAULT_TOKEN not in json.dumps(h) for h in other.seen)
            assert fake.stats()["file_reads"] == 0  # nothing went to the API's own file route
            assert (await store.job(jobs[ACCOUNT])).files == ()  # type: ignore[union-attr]
    finally:
        await runner.cleanup()
        await other_runner.cleanup()


# ---- 5. the webhook route ----

async def test_a_delivery_the_fake_signed_makes_the_job_due_and_a_forged_one_is_refused(
        store: PgStore) -> None:
    app = make_app(store, {PROVIDER: DEFAULT_WEBHOOK_SECRET})
    app_runner, app_url = await start_server(app, "127.0.0.1", 0)
    hook = f"{app_url}/webhooks/{PROVIDER}"

    async def due_in_s(job_id: str) -> float:
        row = await store.get_job(job_id)
        assert row is not None
        return float((row["next_poll_at"] - datetime.now(UTC)).total_seconds())

    try:
        async with serving(quick()) as (fake, url), ReplicateClient(
                url, DEFAULT_TOKEN, timeout_s=2.0,
                options=ProviderOptions(webhook_url=hook)) as client:
            # a forged delivery about a tracked job: refused, the job untouched
            answer = await client.create_video({"prompt": "hooked"}, "k-hook", MODEL)
            assert answer.status == 201
            job_id = json.loads(answer.body)["id"]
            assert await store.add_job(job_id, delay_s=3600, account=ACCOUNT,
                                       provider=PROVIDER)
            body = json.dumps(fake.view(job_id)).encode()
            stamp = str(int(time.time()))
            forged = sign("whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
                          "msg_forged", stamp, body)
            async with aiohttp.ClientSession() as http, http.post(hook, data=body, headers={
                    "webhook-id": "msg_forged", "webhook-timestamp": stamp,
                    "webhook-signature": forged}) as resp:
                assert resp.status == 401
            assert await due_in_s(job_id) > 3500

            # the fake's own delivery when the prediction completes (the client asked for
            # `completed` only): the job is due now
            delivery = await eventually(
                lambda: _completed(fake, job_id), what="the fake's completed webhook")
            print(f"\nwebhook: {delivery}")
            assert delivery.status == 200
            assert {d.event for d in fake.webhook_deliveries} == {"completed"}
            assert await due_in_s(job_id) <= 0.5
    finally:
        await app_runner.cleanup()


async def _completed(fake: FakeReplicate, job_id: str) -> Any:
    return next((d for d in fake.webhook_deliveries
                 if d.prediction_id == job_id and d.event == "completed"
                 and d.status is not None), None)
