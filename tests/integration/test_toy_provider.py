"""A second provider, written here and nowhere else, runs end to end through the same worker.

"Toy" has its own status vocabulary (IN_QUEUE, WORKING, DONE, BROKEN, STOPPED), its own hint
(`retry_in_ms`), its own error envelope (`{"problem": {"kind": ...}}`) and its result inline
in the status answer (no result call: its server has none). Nothing in vidpoll's core names
it: it is registered here (`registry.register`), its jobs are tracked under an account of
its own, and the worker, the store, the triggers and the deliveries do the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.fetch_guard import AccountRules, FetchPolicy
from vidpoll.models import ErrorClass, HttpAnswer
from vidpoll.providers import registry
from vidpoll.providers.base import (
    NeutralOutcome,
    Pending,
    ProviderOptions,
    ResultSource,
    StatusView,
    Terminal,
    Unreadable,
)
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import FAST_POLICY

WORDS: dict[str, NeutralOutcome] = {"done": "succeeded", "broken": "failed",
                                    "stopped": "canceled"}


class ToyRules:
    result_source = ResultSource.INLINE
    idempotency_header = None
    takes_model = True
    min_poll_s = 0.1
    rate_limit_headers = ("X-Toy-Left", "X-Toy-Reset")
    words: Mapping[str, NeutralOutcome] = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        phase = body.get("phase")
        if not isinstance(phase, str) or not phase.strip():
            return Unreadable("no 'phase'")
        word = phase.strip().lower()
        if word in WORDS:
            return Terminal(word, WORDS[word])
        hint = body.get("retry_in_ms")
        return Pending(word, hint / 1000 if isinstance(hint, int | float) else None,
                       known=word in ("in_queue", "working"))

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        problem = (body or {}).get("problem")
        if isinstance(problem, dict) and isinstance(problem.get("kind"), str):
            return problem["kind"], None
        return None, None

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        value = (body or {}).get("ticket")
        return value if isinstance(value, str) else None

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        return False

    def media_urls(self, result: Any) -> list[str]:
        video = ((result or {}).get("output") or {}).get("video")
        return [video] if isinstance(video, str) else []


RULES = ToyRules()
NO_OPTIONS = ProviderOptions()


class ToyClient:
    rules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 2.0,
                 max_connections: int = 10) -> None:
        self.base_url = base_url.rstrip("/")
        self.key_problem: str | None = None
        self._key = api_key
        self._timeout = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self.result_calls = 0
        self.creates: list[tuple[str, str | None]] = []

    async def __aenter__(self) -> ToyClient:
        self._session = aiohttp.ClientSession(
            headers={"X-Toy-Key": self._key},
            timeout=aiohttp.ClientTimeout(total=self._timeout))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def read_status(self, job_id: str) -> HttpAnswer:
        assert self._session is not None
        try:
            async with self._session.get(f"{self.base_url}/tickets/{job_id}") as resp:
                return HttpAnswer(resp.status, await resp.read())
        except (aiohttp.ClientError, TimeoutError):
            return HttpAnswer(None, transport_error=ErrorClass.CONNECTION)

    async def read_result(self, job_id: str) -> HttpAnswer:
        self.result_calls += 1  # inline results: the worker must never call this
        return HttpAnswer(501, b"")

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        # a create Toy billed, whose answer was lost on the way back
        self.creates.append((idempotency_key, model))
        return HttpAnswer(None, transport_error=ErrorClass.TIMEOUT, detail="no answer")

    def shown_status_url(self, job_id: str) -> str:
        return f"{self.base_url}/tickets/{job_id}"

    def shown_create_url(self) -> str:
        return f"{self.base_url}/tickets"

    def media_headers(self) -> Mapping[str, str]:
        return {"X-Toy-Key": self._key}

    def media_auth_hosts(self) -> frozenset[str]:
        return frozenset()  # its files are on its API's origin


class ToyProvider:
    name = "toy"
    default_base_url = "https://toy.invalid"
    env_prefix = "TOY"
    rules = RULES
    webhooks = None
    default_rates: tuple[float | None, float | None] = (None, None)

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = NO_OPTIONS) -> ToyClient:
        return ToyClient(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)


class ToyServer:
    """Toy's API: each ticket says IN_QUEUE, then WORKING, then its ending."""

    def __init__(self) -> None:
        self.endings: dict[str, str] = {}
        self.reads: dict[str, int] = {}
        self.keys: set[str] = set()
        self.file_reads = 0
        self.base = ""

    async def ticket(self, request: web.Request) -> web.Response:
        self.keys.add(request.headers.get("X-Toy-Key", ""))
        job_id = request.match_info["id"]
        if job_id not in self.endings:
            return web.json_response({"problem": {"kind": "no_such_ticket"}}, status=404)
        n = self.reads[job_id] = self.reads.get(job_id, 0) + 1
        if n < 3:
            return web.json_response({"phase": "IN_QUEUE" if n == 1 else "WORKING",
                                      "retry_in_ms": 50})
        ending = self.endings[job_id]
        body: dict[str, Any] = {"phase": ending}
        if ending == "DONE":
            body["output"] = {"video": f"{self.base}/files/{job_id}.mp4", "seconds": 4}
        return web.json_response(body)

    async def file(self, request: web.Request) -> web.Response:
        self.file_reads += 1
        if request.headers.get("X-Toy-Key") != "toy-key":
            return web.Response(status=401)
        return web.Response(body=b"toy video " * 100, content_type="video/mp4")


@pytest.fixture
async def toy() -> AsyncIterator[ToyServer]:
    server = ToyServer()
    app = web.Application()
    app.router.add_get("/tickets/{id}", server.ticket)
    app.router.add_get("/files/{name}", server.file)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.base = f"http://127.0.0.1:{port}"
    registry.register(ToyProvider())
    try:
        yield server
    finally:
        registry.unregister("toy")
        await runner.cleanup()


async def test_a_toy_provider_runs_end_to_end_through_the_same_worker(
        store: PgStore, toy: ToyServer, tmp_path: Any) -> None:
    endings = {"t-ok": "DONE", "t-bad": "BROKEN", "t-stop": "STOPPED"}
    toy.endings.update(endings)
    for job_id in endings:
        assert await store.add_job(job_id, delay_s=0, account="toyacct", provider="toy")
    async with ToyClient(toy.base, "toy-key") as client, Downloader(
            tmp_path, policy=FetchPolicy(AccountRules(), {"toyacct": AccountRules(
                toy.base, api_headers=client.media_headers())})) as downloader:
        # downloads wanted before the jobs end (a consumer gets the jobs that end after it)
        deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=5.0,
                                                    drain=True), downloader)
        await deliverer.prepare()
        worker = Worker(store, {"toyacct": client},
                        WorkerConfig(policy=FAST_POLICY, lease_s=5.0, concurrency=5,
                                     drain=True, fetch_results=True, accounts=("toyacct",)))
        await asyncio.wait_for(worker.run(), 20)
        assert client.result_calls == 0  # the result came inline, with the status answer

        rows = {j: await store.get_job(j) for j in endings}
        assert {j: r["state"] for j, r in rows.items() if r} == {
            "t-ok": "done", "t-bad": "broken", "t-stop": "stopped"}  # Toy's words, lower-cased
        assert {j: r["outcome"] for j, r in rows.items() if r} == {
            "t-ok": "succeeded", "t-bad": "failed", "t-stop": "canceled"}
        assert {j: r["provider"] for j, r in rows.items() if r} == dict.fromkeys(endings, "toy")
        ok = rows["t-ok"]
        assert ok is not None and ok["result_state"] == "fetched"
        assert ok["result"]["output"]["video"].endswith("/files/t-ok.mp4")
        assert rows["t-bad"]["result_state"] is None  # type: ignore[index]
        assert toy.keys == {"toy-key"}

        # the download of the succeeded one, with Toy's own header on its API origin
        deliverer.producers_finished()  # no poller in this test will finish more jobs
        await asyncio.wait_for(deliverer.run(), 20)
    assert (tmp_path / "t-ok").is_dir()
    [video] = [p for p in (tmp_path / "t-ok").iterdir() if not p.name.endswith(".json")]
    assert video.read_bytes() == b"toy video " * 100
    assert not (tmp_path / "t-bad").exists()  # no download for a render that failed
    job = await store.job("t-ok")
    assert job is not None and job.succeeded and job.outcome == "succeeded"
    assert json.loads(json.dumps(job.result))["output"]["seconds"] == 4


async def test_an_unknown_create_without_an_idempotency_key_is_parked_not_sent_again(
        store: PgStore, toy: ToyServer, db_url: str) -> None:
    intent, _ = await store.add_intent("toy-1", {"prompt": "a heron"}, account="toyacct",
                                       provider="toy", model="toy/v2")
    assert intent.provider == "toy" and intent.model == "toy/v2"
    async with ToyClient(toy.base, "toy-key") as client:
        # no records to search (Toy has no list): parked once its settle time has passed
        config = SubmitterConfig(policy=dataclasses.replace(FAST_POLICY, reconcile_settle_s=0.1),
                                 lease_s=5.0, http_timeout_s=1.0,
                                 first_poll_s=0.0, max_active=None, drain=True,
                                 accounts=("toyacct",))
        await asyncio.wait_for(Submitter(store, {"toyacct": client}, config).run(), 20)
        assert client.creates == [("toy-1", "toy/v2")]  # the model went with the create
        parked = await store.get_intent("toy-1")
        assert parked is not None and parked.state == "unknown"
        assert "intents resolve" in (parked.last_error or "")
        # due again (an operator's `intents retry`, a clock far ahead): still never re-sent
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("UPDATE video_intents SET next_attempt_at = now() "
                               "WHERE idempotency_key = 'toy-1'")
        submitter = Submitter(store, {"toyacct": client}, config)
        await asyncio.wait_for(submitter.run(), 20)
        assert client.creates == [("toy-1", "toy/v2")]
        again = await store.get_intent("toy-1")
        assert again is not None and again.state == "unknown" and again.job_id is None
