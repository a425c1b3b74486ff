"""Veo end to end, on the Gemini API and on Vertex AI: vidpoll's clients, submitter, worker,
deliverer and downloader against the fakes (vidpoll.providers.veo.fake,
vidpoll.providers.vertex.fake), real HTTP over loopback, real PostgreSQL.

What is checked, on each surface: a render polled to `done` and its videos on disk byte for
byte (Gemini: fetched from the API's origin with the key; Vertex: the inline bytes read again
and written as any file, never stored in the database; a Cloud Storage result recorded, not
fetched); an operation's error and a render the safety filters removed both `failed`, the
reasons kept in last_response; the 10 s floor of Veo's documented polling applied to a job
after a pending read; and under create faults (lost replies, 5xx before and after billing,
hangs past the timeout, a server that creates after its client gave up, 429s) and killed
submitters, no input billed twice, every create whose outcome is unknown parked as `unknown`
for `vidpoll intents resolve` and never sent again (Google has no idempotency key and no list
to look a create up in), none lost; `on_unknown_create = "resend"` sends it again (and may
bill twice).

Run with -s for the chaos figures. Tests wait on observed state (the store, the fakes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader, inline_fetcher
from vidpoll.fetch_guard import AccountRules, FetchPolicy
from vidpoll.models import HttpAnswer
from vidpoll.policy import PollPolicy
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.veo.client import VeoClient
from vidpoll.providers.veo.fake import (
    DEFAULT_API_KEY,
    DEFAULT_MODELS,
    FakeVeo,
    VeoFakeConfig,
    start_fake_veo,
)
from vidpoll.providers.veo.rules import RULES
from vidpoll.providers.vertex.client import VertexClient
from vidpoll.providers.vertex.fake import (
    DEFAULT_LOCATION,
    DEFAULT_PROJECT,
    FakeVertex,
    VertexFakeConfig,
    start_fake_vertex,
)
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import FAST_POLICY

MODEL = DEFAULT_MODELS[0]
HTTP_TIMEOUT_S = 1.0
POLICY = dataclasses.replace(FAST_POLICY, reconcile_settle_s=0.3)
"""An unknown create is taken up again (and, with no records to look in, parked) soon."""
WORKER_POLICY = dataclasses.replace(FAST_POLICY, default_poll_s=0.3)
FAST_FLOOR = 0.2
"""The account's own `min_poll_s` in these tests (Veo's default floor is 10 s)."""
WAIT_S = 60.0
SURFACES = ("gemini", "vertex")
REASON = "Unable to generate videos because the prompt may violate our policies."


@dataclass
class Surface:
    """One of Veo's two APIs, served by its fake, with a client of one account."""

    kind: str
    provider: str
    account: str
    fake: FakeVeo | FakeVertex
    url: str
    client: VeoClient | VertexClient

    def videos(self, job_id: str) -> list[bytes]:
        """What each video of a finished operation holds, in order."""
        op = self.fake.operation(job_id)
        if isinstance(self.fake, FakeVeo):
            return [self.fake.video_bytes(fid) for fid in op.file_ids[:op.samples]]
        return [self.fake.video_bytes(f"{op.id}/sample_{i}") for i in range(op.samples)]

    def set_mix(self, **weights: float) -> None:
        self.fake.base_config.outcome_mix = dict(weights)

    def downloader(self, directory: Path, clients: dict[str, Any]) -> Downloader:
        rules = AccountRules(self.url, api_headers=self.client.media_headers(),
                             header_hosts=self.client.media_auth_hosts())
        return Downloader(directory, policy=FetchPolicy(AccountRules(), {self.account: rules}),
                          inline_fetch=inline_fetcher(clients))


@asynccontextmanager
async def surface(kind: str, tmp_path: Path, **config: Any) -> AsyncIterator[Surface]:
    base: dict[str, Any] = {"processing_s": 0.3, "file_bytes": 16 * 1024, "seed": 7,
                            "filtered_reasons": [REASON], **config}
    if kind == "gemini":
        gemini = FakeVeo(VeoFakeConfig(**base))
        runner, url = await start_fake_veo(gemini)
        try:
            async with VeoClient(url, DEFAULT_API_KEY, timeout_s=HTTP_TIMEOUT_S) as client:
                yield Surface(kind, "veo", "gem", gemini, url, client)
        finally:
            await runner.cleanup()
        return
    vertex = FakeVertex(VertexFakeConfig(**base))
    runner, url = await start_fake_vertex(vertex)
    try:
        key_file = vertex.write_credentials(tmp_path / "vertex-sa.json")
        async with VertexClient(url, str(key_file), timeout_s=HTTP_TIMEOUT_S,
                                options=ProviderOptions(extra={
                                    "project": DEFAULT_PROJECT,
                                    "location": DEFAULT_LOCATION})) as vclient:
            yield Surface(kind, "vertex", "vtx", vertex, url, vclient)
    finally:
        await runner.cleanup()


class CountingCreator:
    """The account's client, noting every create sent per key and how it was answered (the
    status, the transport error, or None while it is in flight or was cut off)."""

    def __init__(self, client: VeoClient | VertexClient) -> None:
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


def intent_payload(i: int, **parameters: Any) -> dict[str, Any]:
    return {"instances": [{"prompt": f"a heron, take {i}"}],
            "parameters": {"aspectRatio": "16:9", "seed": i, **parameters}}


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S,
                     what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def submitter(store: PgStore, s: Surface, creator: Any = None, *, concurrency: int = 16,
              resend: bool = False) -> Submitter:
    return Submitter(store, {s.account: creator or s.client}, SubmitterConfig(
        policy=POLICY, lease_s=HTTP_TIMEOUT_S + 4.0, http_timeout_s=HTTP_TIMEOUT_S,
        first_poll_s=0.0, max_active=None, concurrency=concurrency, accounts=(s.account,),
        shutdown_timeout_s=3.0,
        resend_unknown=frozenset({s.account}) if resend else frozenset()))


def worker(store: PgStore, s: Surface, *, floor: float | None = FAST_FLOOR,
           drain: bool = True, policy: PollPolicy = WORKER_POLICY) -> Worker:
    return Worker(store, {s.account: s.client}, WorkerConfig(
        policy=policy, lease_s=5.0, concurrency=20, drain=drain, fetch_results=True,
        accounts=(s.account,),
        poll_floors={} if floor is None else {s.account: floor}))


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
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        else:
            loop.stop()
            await asyncio.wait_for(task, 15)
    return dataclasses.asdict(loop.stats)


async def states(store: PgStore) -> dict[str, int]:
    return await store.intent_counts()


async def poll_and_deliver(store: PgStore, s: Surface, media: Path) -> tuple[int, int]:
    """Poll every job of the account to its end, then download what succeeded; (status
    reads while polling, while downloading: Vertex reads an operation again for its bytes)."""
    before = s.fake.stats()["status_reads"]
    async with s.downloader(media, {s.account: s.client}) as downloader:
        deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0, drain=True,
                                                    concurrency=8), downloader)
        await deliverer.prepare()
        await asyncio.wait_for(worker(store, s).run(), WAIT_S)
        polled = s.fake.stats()["status_reads"]
        deliverer.producers_finished()
        await asyncio.wait_for(deliverer.run(), WAIT_S)
    return polled - before, s.fake.stats()["status_reads"] - polled


def on_disk(path: str, media: Path) -> bytes:
    found = Path(path)
    return (found if found.is_absolute() else media / found).read_bytes()


# ---- 1. every end, each surface -----------------------------------------------------------

@pytest.mark.parametrize("kind", SURFACES)
async def test_each_end_of_a_render_is_recorded_and_its_videos_land_on_disk(
        kind: str, store: PgStore, tmp_path: Path) -> None:
    async with surface(kind, tmp_path) as s:
        plan: list[tuple[str, dict[str, Any], dict[str, float]]] = [
            ("ok", intent_payload(1, sampleCount=2), {"success": 1.0}),
            ("err", intent_payload(2), {"error": 1.0}),
            ("filtered", intent_payload(3, sampleCount=2), {"filtered": 1.0})]
        if kind == "vertex":
            plan.append(("gcs", intent_payload(4, storageUri="gs://vidpoll-out/renders"),
                         {"success": 1.0}))
        jobs: dict[str, str] = {}
        for key, payload, mix in plan:  # one at a time: the fake draws each end at its create
            s.set_mix(**mix)
            await store.add_intent(key, payload, account=s.account, provider=s.provider,
                                   model=MODEL)

            async def sent(key: str = key) -> bool:
                found = await store.get_intent(key)
                return found is not None and found.state == "submitted"

            await run_until(submitter(store, s), sent)
            intent = await store.get_intent(key)
            assert intent is not None and intent.job_id is not None
            jobs[key] = intent.job_id

        media = tmp_path / "media"
        await poll_and_deliver(store, s, media)
        rows = {key: await store.get_job(job_id) for key, job_id in jobs.items()}
        for key, row in rows.items():
            assert row is not None and row["provider"] == s.provider, key
            assert row["state"] == "done", (key, row["state"], row["last_error"])
            print(f"\n{kind} {key}: outcome={row['outcome']} polls={row['polls']} "
                  f"last_response={json.dumps(row['last_response'])[:300]}")

        # succeeded: every video on disk byte for byte, sha256 and size in the delivery
        ok = await store.job(jobs["ok"])
        assert ok is not None and ok.outcome == "succeeded"
        expected = s.videos(jobs["ok"])
        assert len(expected) == 2 and len(ok.files) == 2
        for media_file, data in zip(ok.files, expected, strict=True):
            assert on_disk(media_file.path, media) == data
            assert media_file.size == len(data)
            assert media_file.sha256 == hashlib.sha256(data).hexdigest()
            assert Path(media_file.path).name.endswith("-video.mp4")
        [download] = await store.job_deliveries(jobs["ok"])
        assert download["state"] == "done" and download["attempts"] == 1
        assert [f["sha256"] for f in download["detail"]["files"]] == [
            hashlib.sha256(d).hexdigest() for d in expected]
        assert not [p for p in media.rglob("*") if p.name.endswith(".part")]
        stored = json.dumps([rows["ok"]["result"], rows["ok"]["last_response"]])  # type: ignore[index]
        assert "bytesBase64Encoded" not in stored and len(stored) < 8192
        if kind == "gemini":
            # fetched from the API's own origin, with the key
            assert download["detail"]["files"][0]["url"].startswith(s.url)
            assert s.fake.stats()["file_reads"] == 2 and s.fake.stats()["unauthorized"] == 0
        else:
            assert [f["url"] for f in download["detail"]["files"]] == ["inline:0", "inline:1"]
            videos = rows["ok"]["result"]["response"]["videos"]  # type: ignore[index]
            assert [v["sha256"] for v in videos] == [f["sha256"] for f in
                                                    download["detail"]["files"]]

        # an operation's error: failed, its words kept; nothing to download
        assert rows["err"]["outcome"] == "failed"  # type: ignore[index]
        assert rows["err"]["last_response"]["error"]["code"] == 13  # type: ignore[index]
        assert await store.job_deliveries(jobs["err"]) == []

        # filtered: failed, never a success without a video; the reasons visible
        assert rows["filtered"]["outcome"] == "failed"  # type: ignore[index]
        kept = json.dumps(rows["filtered"]["last_response"])  # type: ignore[index]
        assert REASON in kept and '"raiMediaFilteredCount": 2' in kept
        # and said in one line as the row's last_error (`jobs show`, the dashboard)
        said = rows["filtered"]["last_error"]  # type: ignore[index]
        assert said.startswith("no video: the safety filters removed 2") and REASON[:40] in said
        assert await store.job_deliveries(jobs["filtered"]) == []

        if kind == "vertex":
            # written to the user's bucket: recorded in the result, nothing fetched
            gcs = rows["gcs"]
            assert gcs is not None and gcs["outcome"] == "succeeded"
            [video] = gcs["result"]["response"]["videos"]
            assert video["gcsUri"].startswith("gs://vidpoll-out/renders/")
            [delivery] = await store.job_deliveries(jobs["gcs"])
            assert delivery["state"] == "done" and delivery["detail"]["files"] == []


# ---- 2. the poll floor --------------------------------------------------------------------

@pytest.mark.parametrize("kind", SURFACES)
async def test_a_pending_read_waits_veos_documented_ten_seconds(
        kind: str, store: PgStore, tmp_path: Path) -> None:
    async with surface(kind, tmp_path, processing_s=3600.0) as s:
        answer = await s.client.create_video(intent_payload(0), "k", MODEL)
        job_id = RULES.created_job_id(json.loads(answer.body))
        assert job_id is not None
        assert await store.add_job(job_id, delay_s=0, account=s.account, provider=s.provider)
        # the policy's own default wait is 0.3 s: only the provider's floor makes it 10
        poller = worker(store, s, floor=None, drain=False)
        task = asyncio.create_task(poller.run())
        try:
            async def read_once() -> dict[str, Any] | None:
                row = await store.get_job(job_id)
                return row if row is not None and row["polls"] >= 1 else None

            row = await eventually(read_once, what="the first read")
        finally:
            poller.stop()
            await asyncio.wait_for(task, 15)
        assert row["state"] == "pending" and row["provider_status"] == "running"
        waits = (row["next_poll_at"] - row["last_polled_at"]).total_seconds()
        print(f"\n{kind}: after a pending read the next is due in {waits:.2f}s")
        assert RULES.min_poll_s == 10.0
        assert 9.5 <= waits <= 10.5


# ---- 3. chaos ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SURFACES)
async def test_chaos_no_input_is_billed_twice_and_every_unknown_create_is_parked(
        kind: str, store: PgStore, db_url: str, tmp_path: Path) -> None:
    faults = dict.fromkeys(("lose_reply", "5xx_after", "5xx_before", "hang",
                            "hang_then_create", "429"), 0.06)
    total = 100
    async with surface(kind, tmp_path, create_fault_rates=faults, hang_s=1.5,
                       retry_delay_s=0, processing_jitter_s=0.3,
                       outcome_mix={"success": 0.8, "error": 0.1, "filtered": 0.1}) as s:
        assert s.fake.base_config.hang_s > HTTP_TIMEOUT_S
        creator = CountingCreator(s.client)
        payloads = {f"chaos-{i:03d}": intent_payload(i) for i in range(total)}
        for key, payload in payloads.items():
            await store.add_intent(key, payload, account=s.account, provider=s.provider,
                                   model=MODEL)

        # a submitter that died mid-POST: two intents claimed, one create sent (billed, its
        # answer never recorded), the other never sent at all
        dead = await store.claim_intents(2, 1.0, "dead-submitter", None, account=s.account)
        assert len(dead) == 2
        s.fake.script_creates(["ok"])
        creator.sent[dead[0].key].append("dead")
        answer = await s.client.create_video(dead[0].payload, dead[0].key, dead[0].model)
        assert answer.status == 200
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                               "WHERE idempotency_key = ANY(%s)", ([c.key for c in dead],))

        async def at_least(n: int) -> bool:
            return (await states(store)).get("submitted", 0) >= n

        async def settled() -> bool:
            found = await states(store)
            return found.get("submitted", 0) + found.get("unknown", 0) == total

        runs = [
            # killed once a quarter are in: POSTs in flight and leases held
            await run_until(submitter(store, s, creator), lambda: at_least(25), kill=True),
            # stopped (a graceful shutdown) once a half are in
            await run_until(submitter(store, s, creator), lambda: at_least(50)),
            # and a last one until every intent is submitted or parked
            await run_until(submitter(store, s, creator), settled, timeout_s=90)]

        intents = {key: await store.get_intent(key) for key in payloads}
        billed = s.fake.created_bodies()
        fstats = s.fake.stats()
        parked = {k: i for k, i in intents.items() if i is not None and i.state == "unknown"}
        submitted = {k: i for k, i in intents.items() if i is not None and i.state == "submitted"}
        job_ids = {k: i.job_id for k, i in submitted.items()}
        # a create that was billed but whose intent is parked: the operator's to resolve
        held = set(job_ids.values())
        orphans = [op for name, op in s.fake.operations.items() if name not in held]
        sends = [len(v) for v in creator.sent.values()]
        totals = {k: sum(r[k] for r in runs) for k in ("posts", "submitted", "unknown",
                                                       "parked", "resent")}
        print(f"\n{kind} chaos: intents {await states(store)}")
        print(f"{kind} chaos: fake creates={fstats['creates']} create_requests="
              f"{fstats['create_requests']} duplicates="
              f"{sum(n - 1 for n in billed.values() if n > 1)} faults="
              f"{ {k: v for k, v in fstats.items() if k.startswith('fault_')} } "
              f"throttled={fstats['throttled']}")
        print(f"{kind} chaos: submitters (killed, stopped, last) "
              f"{[{k: r[k] for k in totals} for r in runs]}; totals {totals}")
        print(f"{kind} chaos: parked={len(parked)} (billed anyway: {len(orphans)}), "
              f"submitted={len(submitted)}, sends per key max={max(sends)}")

        # never billed twice
        assert billed and max(billed.values()) == 1, billed.most_common(3)
        # none lost: every intent submitted with a tracked job of its own input, or parked
        assert len(parked) + len(submitted) == total
        assert len(set(job_ids.values())) == len(submitted)
        for key, job_id in job_ids.items():
            assert job_id is not None and await store.get_job(job_id) is not None, key
            assert s.fake.operation(job_id).body == payloads[key]
        # every unknown create parked for an operator, never sent again: only a 429 (nothing
        # created) was ever followed by another send of the same key
        assert parked, "the faults should have left some creates unknown"
        for intent in parked.values():
            assert "vidpoll intents resolve" in (intent.last_error or ""), intent.last_error
        for key, answers in creator.sent.items():
            assert all(a == 429 for a in answers[:-1]), (key, answers)
        # the renders billed but parked are of parked intents' inputs only
        parked_bodies = [payloads[k] for k in parked]
        assert all(op.body in parked_bodies for op in orphans)
        assert dead[0].key in parked, "a create lost mid-POST is parked, never sent again"

        # poll every submitted job to its end; download what succeeded
        media = tmp_path / "media"
        reads, rereads = await poll_and_deliver(store, s, media)
        outcomes: dict[str, int] = defaultdict(int)
        downloaded = 0
        for job_id in job_ids.values():
            assert job_id is not None
            job = await store.job(job_id)
            assert job is not None and job.state == "done" and job.outcome is not None
            outcomes[job.outcome] += 1
            if job.outcome == "succeeded":
                expected = s.videos(job_id)
                assert [on_disk(f.path, media) for f in job.files] == expected
                downloaded += len(job.files)
        print(f"{kind} chaos: outcomes {dict(outcomes)}; files downloaded {downloaded}; status "
              f"reads {reads} ({reads / max(1, len(job_ids)):.2f} per job), and {rereads} "
              f"more for the downloads")
        assert downloaded >= outcomes["succeeded"] > 0


# ---- 4. on_unknown_create = "resend" --------------------------------------------------------

@pytest.mark.parametrize("kind", SURFACES)
async def test_resend_sends_an_unknown_create_again_and_may_bill_twice(
        kind: str, store: PgStore, tmp_path: Path) -> None:
    async with surface(kind, tmp_path) as s:
        creator = CountingCreator(s.client)
        payload = intent_payload(9)
        await store.add_intent("again", payload, account=s.account, provider=s.provider,
                               model=MODEL)
        s.fake.script_creates(["lose_reply", "ok"])  # billed, its answer lost; then answered

        async def sent() -> bool:
            found = await store.get_intent("again")
            return found is not None and found.state == "submitted"

        stats = await run_until(submitter(store, s, creator, resend=True), sent)
        intent = await store.get_intent("again")
        assert intent is not None and intent.job_id is not None
        print(f"\n{kind} resend: sends {creator.sent['again']}; billed "
              f"{sum(s.fake.created_bodies().values())}; submitter {stats}")
        assert stats["resent"] == 1 and len(creator.sent["again"]) == 2
        assert list(s.fake.created_bodies().values()) == [2]  # re-sent: billed twice
        assert len(s.fake.operations) == 2
        assert intent.job_id in s.fake.operations
