"""Fuzzing through the real stack (issue 8).

Hypothesis makes up Sume's answers; the fake serves them over loopback HTTP, the real
SumeClient reads them, the real Worker (or Submitter) decides and writes them into a real
PostgreSQL row. Each example then checks that the row made one of the transitions README's
"How it works" table documents, with the counters, history and claim fence that go with it,
and that the worker kept polling afterwards. The unit tests fuzz `decide` alone; these fuzz
what sits around it: HTTP framing, header and body transport, JSON in PostgreSQL, the fence.

Examples are derandomized (the same ones every run, so CI is reproducible) and bounded: the
file adds about 15 s to the suite (status answers 120 examples, result answers 80, job ids
60, payloads 60).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.utils import format_datetime
from typing import Any
from urllib.parse import unquote

import psycopg
import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vidpoll.errors import InvalidIntent, InvalidJobId
from vidpoll.models import ClaimedJob, HttpAnswer, Outcome, ResultOutcome
from vidpoll.policy import (
    MAX_RESULT_ATTEMPTS,
    PollPolicy,
    next_poll_delay,
    parse_retry_after,
    server_pause_s,
)
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.store import PgStore
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY

# min_poll_s of 2 s: a row read once is not due again before its example has been checked
POLICY = PollPolicy(min_poll_s=2.0, max_poll_s=900.0, default_poll_s=15.0, backoff_base_s=4.0,
                    backoff_max_s=120.0)
SLACK_S = 0.25
"""Clock slack for due times: the worker decides on its clock, the database writes on its own."""

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
"""The fixtures (database, fake, client) are shared by the examples of one test; every
example uses fresh ids, so sharing them is safe."""


# -- answers ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Raw:
    """JSON text put into a body as is: what json.dumps will not write (NaN, 10**400, ...)."""

    text: str


RAW_ATOMS = [
    "1" + "0" * 400, "-" + "9" * 400, "1e400", "-1e400", "1e-400", "1.5e308", "NaN",
    "Infinity", "-Infinity", "-0", "0e0", "1E2", "123456789012345678901234567890.5",
    '"\\ud800"', '"x\\udfff"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"', '"a\\u0000b"',
    '"\\\\u0000"', '"\\u00e9\\u65e5"', '"\\u2028\\u2029"', '"\\ufeff"', "7" * 5000,
]

NO_SURROGATES = st.characters(exclude_categories=["Cs"])
texts = st.text(NO_SURROGATES, max_size=12)
json_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
             | st.floats(allow_nan=False, allow_infinity=False) | texts
             | st.sampled_from(RAW_ATOMS).map(Raw))
json_values = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(texts, inner, max_size=3), max_leaves=8)

STATUS_WORDS = ["completed", "failed", "canceled", "expired", "queued", "running", "processing",
                "pending", "submitted", "COMPLETED", " Failed ", "PENDING", "", "   ", "rendering",
                "x" * 80, "İstanbul", "ﬁnished"]
terminal_values = (st.booleans() | st.sampled_from([None, 0, 1, "true", "false", [], {}])
                   | json_values)
status_values = st.sampled_from(STATUS_WORDS) | json_values
hint_values = (st.sampled_from([None, 0, -1, 0.5, 1.5, 30, 899.9, 3600, 10**6, "10", " 20 ",
                                "abc", "", True, False, 1e308, -1e308])
               | st.integers(-(10**30), 10**30) | st.floats() .filter(math.isfinite)
               | st.sampled_from(["1" + "0" * 400, "NaN", "Infinity", "-Infinity", "1e400",
                                  "-1e400"]).map(Raw)
               | json_values)
ABSENT = object()


@st.composite
def status_objects(draw: st.DrawFn) -> dict[str, Any]:
    """An object shaped like a status answer, any of whose fields may be absent or wrong."""
    body: dict[str, Any] = {}
    for name, values in (("terminal", terminal_values), ("sume_status", status_values),
                         ("next_poll_after_seconds", hint_values),
                         ("job_id", texts | json_values),
                         ("request_id", st.sampled_from(["req_1", "r" * 300]) | json_values),
                         ("error", st.fixed_dictionaries({"code": texts, "message": texts})
                          | json_values)):
        value = draw(st.just(ABSENT) | values)
        if value is not ABSENT:
            body[name] = value
    body.update(draw(st.dictionaries(texts, json_values, max_size=3)))
    return body


def dump(value: Any, ascii_only: bool) -> str:
    """JSON text of `value` with its Raw parts spliced in verbatim."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=ascii_only)}: {dump(v, ascii_only)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dump(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def bodies(draw: st.DrawFn, objects: st.SearchStrategy[dict[str, Any]]) -> str:
    """Body text: mostly shaped objects, else any JSON value, truncated JSON, HTML or text."""
    kind = draw(st.sampled_from(["object"] * 6 + ["value", "cut", "html", "text", "empty"]))
    if kind == "object":
        return dump(draw(objects), draw(st.booleans()))
    if kind == "value":
        return dump(draw(json_values), draw(st.booleans()))
    if kind == "cut":
        text = dump(draw(objects), True)
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    if kind == "html":
        return "<html><body><h1>502 Bad Gateway</h1></body></html>"
    if kind == "text":
        return draw(st.text(NO_SURROGATES, max_size=60))
    return ""


NOW = datetime.now(UTC)
header_texts = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t")
                       | st.sampled_from("é日€ÿ"), max_size=30)
retry_afters = st.one_of(
    st.integers(0, 10**6).map(str), st.integers(-(10**6), -1).map(str),
    st.floats(-1e6, 1e6).map(lambda f: f"{f:.3f}"),
    st.integers(-400_000, 400_000).map(
        lambda s: format_datetime(NOW + timedelta(seconds=s), usegmt=True)),
    st.integers(-400_000, 400_000).map(
        lambda s: (NOW + timedelta(seconds=s)).strftime("%A, %d-%b-%y %H:%M:%S GMT")),
    st.integers(-400_000, 400_000).map(
        lambda s: (NOW + timedelta(seconds=s)).strftime("%a %b %d %H:%M:%S %Y")),
    st.sampled_from(["", "  ", "9" * 40, "1e400", "inf", "-inf", "nan", "NaN", "0x10", "1_000",
                     "5, 6", "Wed, 31 Feb 2026 25:61:61 GMT", "Mon, 01 Jan 0001 00:00:00 GMT",
                     "Fri, 31 Dec 9999 23:59:59 GMT", "soon", "١٢"]),
    header_texts)
ratelimit_values = st.sampled_from(["0", "1", "-1", "0.0", "-0", "1e400", "nan", "abc", "",
                                    "1700000000", "9" * 30, "5.5"]) | header_texts
CONTENT_TYPES = ["application/json", "text/html", "text/plain", "application/problem+json",
                 "application/octet-stream", "application/xml"]
# a 1xx (but 101) never ends a response for aiohttp's client: the read times out, which costs
# the client's timeout, so they are two of the listed codes rather than a range
http_codes = st.one_of(
    st.sampled_from([200] * 8 + [201, 202, 204, 206, 299, 404, 404, 429, 429, 503, 503, 500, 502,
                                 504, 400, 401, 403, 408, 409, 410, 422, 301, 304, 101, 102, 599]),
    st.integers(200, 599))
TIMEOUT_S = 0.3


@st.composite
def headers(draw: st.DrawFn) -> dict[str, str]:
    out: dict[str, str] = {}
    if draw(st.booleans()):
        out["Retry-After"] = draw(retry_afters)
    if draw(st.integers(0, 3)) == 0:
        out["RateLimit-Remaining"] = draw(ratelimit_values)
        out["RateLimit-Reset"] = draw(ratelimit_values)
    if draw(st.integers(0, 2)) == 0:
        out["X-Request-Id"] = draw(st.sampled_from(["req_h", "h" * 250, "ünï"]))
    return out


@st.composite
def answers(draw: st.DrawFn, objects: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """One scripted answer for the fake: {"http", "headers", "raw", "content_type"}."""
    return {"http": draw(http_codes), "headers": draw(headers()),
            "raw": draw(bodies(objects)), "content_type": draw(st.sampled_from(CONTENT_TYPES))}


@st.composite
def row_histories(draw: st.DrawFn) -> dict[str, Any]:
    """The row's counters before the read: how long it has polled, how many errors so far."""
    errors = draw(st.integers(0, 12))
    return {"polls": draw(st.integers(0, 50)), "consecutive_errors": errors,
            "errors_total": errors + draw(st.integers(0, 20)),
            "not_found_count": draw(st.integers(0, 9)),
            "age_s": draw(st.sampled_from([0.0, 600.0, 3590.0, 3610.0, POLICY.max_age_s - 30,
                                           POLICY.max_age_s + 30]))}


# -- the reference: what README's table says the row becomes ------------------------------------

def storable_object(body: bytes) -> dict[str, Any] | None:
    """The body if it is a JSON object that jsonb can hold (written apart from policy's)."""
    def bad_constant(name: str) -> None:
        raise ValueError(name)

    def clean(node: Any) -> bool:
        if isinstance(node, str):
            return "\x00" not in node and not any(0xD800 <= ord(c) <= 0xDFFF for c in node)
        if isinstance(node, float):
            return math.isfinite(node)
        if isinstance(node, dict):
            return all(clean(k) and clean(v) for k, v in node.items())
        if isinstance(node, list):
            return all(clean(v) for v in node)
        return True

    try:
        value = json.loads(body, parse_constant=bad_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and clean(value) else None


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON: numbers by decimal value (jsonb keeps 1e300 as 1000...0, an int)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return Decimal(repr(a)) == Decimal(repr(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b and type(a) is type(b))


def backoff_bounds(attempt: int, policy: PollPolicy) -> tuple[float, float]:
    exp = min(policy.backoff_max_s, policy.backoff_base_s * 2 ** min(max(attempt, 1) - 1, 30))
    return max(policy.min_poll_s, exp / 2), max(policy.min_poll_s, exp)


def clamp(seconds: float, policy: PollPolicy) -> float:
    return min(policy.max_poll_s, max(policy.min_poll_s, seconds))


def hinted_bounds(value: str | None, t0: datetime, t1: datetime,
                  policy: PollPolicy) -> tuple[float, float] | None:
    """Delay bounds from a Retry-After read at any moment between t0 and t1."""
    early, late = parse_retry_after(value, t0), parse_retry_after(value, t1)
    if early is None or late is None:
        return None
    return clamp(late, policy), clamp(early, policy)


@dataclass
class Expected:
    """The documented transition of one read."""

    released: bool = False
    state: str = "pending"
    error_class: str | None = None
    provider_status: str | None = None
    delay: tuple[float, float] | None = None  # due-time bounds while pending


def sume_envelope(obj: dict[str, Any] | None) -> bool:
    """Whether a body is Sume's error envelope: {"error": {"code": "<non-empty string>"}}."""
    err = (obj or {}).get("error")
    return isinstance(err, dict) and isinstance(err.get("code"), str) and bool(err["code"])


def expected_read(code: int | None, body: bytes, retry_after: str | None,
                  pre: dict[str, Any], t0: datetime, t1: datetime) -> Expected:
    """README "How it works", one row of the table per branch."""
    obj = storable_object(body)
    age = pre["age_s"]
    old = age >= POLICY.max_age_s

    def error(cls: str, state: str = "pending",
              delay: tuple[float, float] | None = None) -> Expected:
        if state == "pending" and old:
            state = "gave_up"
        return Expected(state=state, error_class=cls,
                        delay=delay or backoff_bounds(pre["consecutive_errors"] + 1, POLICY))

    if code is None:
        return error("timeout")
    if code in (401, 403):
        return Expected(released=True)
    if code is not None and 400 <= code < 500 and code not in (408, 425, 429) \
            and not sume_envelope(obj):
        # not Sume's answer (a wrong URL, a proxy): the account pauses, the row is untouched
        return Expected(released=True)
    if code == 404:
        tries = pre["not_found_count"] + 1
        gone = tries >= POLICY.not_found_max_tries or (
            age >= POLICY.not_found_max_age_s and tries >= POLICY.not_found_min_tries_when_old)
        return error("not_found", "not_found" if gone else "pending")
    if code in (429, 503):
        return error("rate_limited" if code == 429 else "unavailable",
                     delay=hinted_bounds(retry_after, t0, t1, POLICY))
    if code >= 500:
        return error("server_error")
    if not 200 <= code < 300:
        return error("client_error")
    if obj is None or not isinstance(obj.get("terminal"), bool):
        return error("malformed")
    word = obj.get("sume_status")
    word = word.strip().lower() if isinstance(word, str) else None
    if obj["terminal"]:
        if not word or word == "pending":
            return error("malformed")
        return Expected(state=word[:64], provider_status=word)
    delay = next_poll_delay(obj.get("next_poll_after_seconds"), POLICY)
    return Expected(state="gave_up" if old else "pending", provider_status=word,
                    delay=(delay, delay))


# -- harness ------------------------------------------------------------------------------------

class Watched:
    """The real store, noting every write the worker makes (the examples wait on these)."""

    def __init__(self, inner: PgStore) -> None:
        self.inner = inner
        self.recorded: dict[str, tuple[Outcome, bool]] = {}
        self.released: set[str] = set()
        self.results: dict[str, tuple[ResultOutcome, bool]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def record(self, outcomes: list[Outcome]) -> set[str]:
        applied = await self.inner.record(outcomes)
        for o in outcomes:
            self.recorded[o.job_id] = (o, o.job_id in applied)
        return applied

    async def release(self, jobs: list[ClaimedJob]) -> set[str]:
        given_back = await self.inner.release(jobs)
        self.released |= given_back
        return given_back

    async def record_result(self, outcome: ResultOutcome) -> bool:
        landed = await self.inner.record_result(outcome)
        self.results[outcome.job_id] = (outcome, landed)
        return landed


class Problems(logging.Handler):
    """Collects the exceptions vidpoll logs and carries on from (log.exception: a read that
    raised, an answer it could not interpret, a batch it could not write): a swallowed crash
    fails the example. Errors it reports on purpose (a rejection) have no traceback."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.seen.append(record.getMessage())


@pytest.fixture
def problems() -> Iterator[Problems]:
    handler = Problems()
    logger = logging.getLogger("vidpoll")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture
async def conn(db_url: str) -> Any:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        yield c


class Running:
    """A worker running in the background for one example."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task = asyncio.create_task(worker.run())

    async def until(self, predicate: Callable[[], bool], within_s: float = 10.0) -> None:
        await self.worker.signals.wait_for(lambda: predicate() or self.task.done(), within_s)
        assert not self.task.done(), "the worker ended on its own"
        assert predicate()

    async def stop(self) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, 10)  # re-raises if the worker crashed


class FuzzFake(FakeSume):
    """The fake with per-job scripted result answers (raw status, body and headers)."""

    def __init__(self, config: FakeConfig) -> None:
        super().__init__(config)
        self.result_script: dict[str, dict[str, Any]] = {}
        self.result_reads: dict[str, int] = {}

    async def result(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        step = self.result_script.get(job_id)
        if step is None:
            return await super().result(request)
        self.result_reads[job_id] = self.result_reads.get(job_id, 0) + 1
        return web.Response(status=step["http"], text=step["raw"], headers=step["headers"],
                            content_type=step["content_type"])


@pytest.fixture
async def fuzz_fake() -> Any:
    """A FuzzFake on a loopback port and the real client pointed at it."""
    fake = FuzzFake(FakeConfig(api_key=API_KEY, queued_s=0, render_s=0, render_jitter=0,
                               seed=1))
    runner, url = await start_fake(fake)
    async with SumeClient(url, API_KEY, timeout_s=TIMEOUT_S) as c:
        yield fake, c
    await runner.cleanup()


def fuzz_worker(store: Watched, client: SumeClient, **kwargs: Any) -> Worker:
    kwargs.setdefault("fetch_results", False)
    return Worker(store, client, WorkerConfig(  # type: ignore[arg-type]
        policy=POLICY, lease_s=30.0, concurrency=4, batch_size=4, listen=False, idle_max_s=0.05,
        vacuum_every_rows=0, worker_id="fuzz", **kwargs))


async def fetch_row(conn: Any, job_id: str) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute("SELECT *, now() AS db_now FROM video_jobs WHERE job_id = %s", (job_id,))
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def history(conn: Any, job_id: str) -> list[tuple[Any, ...]]:
    cur = await conn.execute(
        "SELECT kind, from_state, to_state, error_class, http_status FROM video_job_events "
        "WHERE job_id = %s ORDER BY id", (job_id,))
    return list(await cur.fetchall())


async def pause_of(conn: Any) -> datetime | None:
    cur = await conn.execute("SELECT paused_until FROM vidpoll_rate_buckets "
                             "WHERE account = 'default' AND kind = 'status'")
    row = await cur.fetchone()
    return None if row is None else row[0]


async def sentinel_finishes(run: Running, store: Watched, fake: FakeSume, conn: Any) -> None:
    """After the fuzzed read, the same worker still polls other jobs to the end."""
    await conn.execute("DELETE FROM vidpoll_rate_buckets")  # a server pause is tested apart
    job_id = f"ok-{uuid.uuid4().hex[:12]}"
    fake.add_job(job_id, script=[{"sume_status": "completed", "terminal": True}])
    await store.add_job(job_id, delay_s=0)
    await run.until(lambda: store.recorded.get(job_id, (None, False))[1])
    assert (await fetch_row(conn, job_id))["state"] == "completed"


def what_the_client_got(answer: dict[str, Any]) -> tuple[int | None, dict[str, str], bytes]:
    """Status, headers and body as an HTTP client receives the scripted answer: a 1xx other
    than 101 is no answer at all (a timeout); 101, 204 and 304 have no body; header values
    lose their surrounding whitespace."""
    code = answer["http"]
    if 100 <= code < 200 and code != 101:
        return None, {}, b""
    headers = {k: v.strip(" \t") for k, v in answer["headers"].items()}
    return code, headers, b"" if code in (101, 204, 304) else answer["raw"].encode()


# -- 1. status answers ----------------------------------------------------------------------

@FUZZ
@given(answer=answers(status_objects()), pre=row_histories())
@example(answer={"http": 200, "headers": {}, "raw": '{"": 1e400}', "content_type": "text/plain"},
         pre={"polls": 0, "consecutive_errors": 0, "errors_total": 0, "not_found_count": 0,
              "age_s": 0.0})  # was never written: the batch failed on every read
async def test_any_status_answer_makes_a_documented_transition(
        store, fuzz_fake, conn, problems, answer, pre):
    fake, client = fuzz_fake
    watched = Watched(store)
    job_id = f"fz-{uuid.uuid4().hex[:12]}"
    # the second answer is for a later read, which no example waits long enough to make
    fake.add_job(job_id, script=[answer, {"sume_status": "completed", "terminal": True}])
    await conn.execute("DELETE FROM vidpoll_rate_buckets")
    await store.add_job(job_id, delay_s=0)
    await conn.execute(
        "UPDATE video_jobs SET polls = %s, consecutive_errors = %s, errors_total = %s, "
        "not_found_count = %s, polling_since = now() - make_interval(secs => %s) "
        "WHERE job_id = %s", (pre["polls"], pre["consecutive_errors"], pre["errors_total"],
                              pre["not_found_count"], pre["age_s"], job_id))
    before = await fetch_row(conn, job_id)
    t0 = datetime.now(UTC)
    run = Running(fuzz_worker(watched, client))
    try:
        await run.until(lambda: job_id in watched.recorded or job_id in watched.released)
        t1 = datetime.now(UTC)
        row = await fetch_row(conn, job_id)
        paused_until = await pause_of(conn)
        code, sent, body = what_the_client_got(answer)
        got_code = code
        want = expected_read(got_code, body, sent.get("Retry-After"), pre, t0, t1)
        check_row(job_id, before, row, want, code=got_code, body=body, sent=sent, t0=t0, t1=t1)
        assert fake.reads[job_id] == 1
        assert await history(conn, job_id) == expected_history(before, want, got_code)

        # a pause asked by the server reaches the fleet's bucket, and nothing else does
        pause = server_pause_s(HttpAnswer(got_code, retry_after=sent.get("Retry-After"),
                                          ratelimit_remaining=sent.get("RateLimit-Remaining"),
                                          ratelimit_reset=sent.get("RateLimit-Reset")),
                               t0, POLICY)
        if pause is None or got_code in (401, 403):
            assert paused_until is None
        else:
            assert paused_until is not None
            lo = t0 + timedelta(seconds=min(pause, POLICY.max_poll_s) - 1.0 - SLACK_S)
            hi = t1 + timedelta(seconds=pause + SLACK_S)
            assert lo <= paused_until <= hi, (pause, paused_until - t0)

        # a refused key or a wrong URL pauses every read by design: nothing to poll
        if not want.released:
            await sentinel_finishes(run, watched, fake, conn)
    finally:
        await run.stop()
    assert watched.recorded.get(job_id, (None, True))[1], "the write was fenced out"
    assert run.worker.stats.fenced_out == 0
    assert problems.seen == []


def check_row(job_id: str, before: dict[str, Any], row: dict[str, Any], want: Expected, *,
              code: int | None, body: bytes, sent: dict[str, str], t0: datetime,
              t1: datetime) -> None:
    assert row["claim_token"] is None, "the claim was not cleared"
    if want.released:  # given back unread: nothing moved, due when it was due
        for name in ("state", "polls", "consecutive_errors", "errors_total", "not_found_count",
                     "next_poll_at", "last_error_class", "last_response"):
            assert row[name] == before[name], name
        return
    assert row["state"] == want.state
    assert row["last_http_status"] == code
    assert row["last_error_class"] == want.error_class
    assert (row["finished_at"] is not None) == (want.state != "pending")
    assert row["result_state"] == ("pending" if want.state == "completed" else None)
    obj = storable_object(body)
    assert same_json(row["last_response"], obj), (row["last_response"], obj)
    request_id = (obj or {}).get("request_id")
    if isinstance(request_id, str):
        assert row["last_request_id"] == request_id[:200]
    else:
        assert row["last_request_id"] == (sent.get("X-Request-Id") or None)
    if want.error_class is None:  # an answer was read: polls moves, the error run ends
        assert row["polls"] == before["polls"] + 1
        assert row["consecutive_errors"] == 0 and row["not_found_count"] == 0
        assert row["errors_total"] == before["errors_total"]
        assert row["last_error"] is None
        assert row["provider_status"] == want.provider_status
    else:
        assert row["polls"] == before["polls"]
        assert row["consecutive_errors"] == before["consecutive_errors"] + 1
        assert row["errors_total"] == before["errors_total"] + 1
        assert row["not_found_count"] == (before["not_found_count"] + 1
                                          if want.error_class == "not_found" else 0)
        assert row["last_error"] and len(row["last_error"]) <= 500
        assert row["provider_status"] is None
    if want.state == "pending":
        assert want.delay is not None
        lo, hi = want.delay
        due = row["next_poll_at"]
        assert (t0 + timedelta(seconds=lo - SLACK_S) <= due
                <= t1 + timedelta(seconds=hi + SLACK_S)), (job_id, (due - t0).total_seconds(),
                                                           want.delay)


def expected_history(before: dict[str, Any], want: Expected,
                     code: int | None) -> list[tuple[Any, ...]]:
    """The trigger's events: tracked, then one per change of state or of error class."""
    events: list[tuple[Any, ...]] = [("tracked", None, "pending", None, None)]
    if want.released:
        return events
    if want.state != "pending":
        events.append(("state", "pending", want.state, want.error_class, code))
    elif want.error_class is not None:
        events.append(("error", None, "pending", want.error_class, code))
    return events


# -- 2. job ids ---------------------------------------------------------------------------------

job_ids = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="ascii"), min_size=900, max_size=1100),
    st.text(st.sampled_from("/?#%.é日😀\x00\ud800 +&;=\\"), min_size=1, max_size=12),
    st.sampled_from([".", "..", "%2F", "a/../b", "\ud800", "\udfff", "a\x00", "😀" * 256,
                     "日" * 341, "日" * 342, "é" * 512, "é" * 513, "a" * 1024, "a" * 1025]))


def storable_id(job_id: str) -> bool:
    """README: any id PostgreSQL text can hold and a URL can carry (1 to 1024 UTF-8 bytes)."""
    try:
        size = len(job_id.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 0 < size <= 1024 and "\x00" not in job_id


@settings(FUZZ, max_examples=60)
@given(ids=st.lists(job_ids, min_size=1, max_size=4, unique=True))
async def test_any_job_id_is_refused_clearly_or_polled_to_the_end(
        store, fuzz_fake, conn, problems, ids):
    fake, client = fuzz_fake
    watched = Watched(store)
    valid = [i for i in ids if storable_id(i)]
    # hypothesis tries an id in more than one example: each starts without the earlier rows
    await conn.execute("DELETE FROM video_jobs WHERE job_id = ANY(%s)", (valid,))
    for job_id in valid:
        fake.reads[job_id] = 0
    cur = await conn.execute("SELECT count(*) FROM video_jobs")
    (rows_before,) = await cur.fetchone()
    for job_id in ids:
        if job_id in valid:
            fake.add_job(job_id, script=[{"sume_status": "completed", "terminal": True}])
            assert await store.add_job(job_id, delay_s=0)
        else:
            with pytest.raises(InvalidJobId):
                await store.add_job(job_id)
    cur = await conn.execute("SELECT count(*) FROM video_jobs")
    assert (await cur.fetchone())[0] == rows_before + len(valid), "a refused id was written"
    if not valid:
        return
    paths_before = len(fake.raw_paths)
    run = Running(fuzz_worker(watched, client))
    try:
        await run.until(lambda: all(watched.recorded.get(i, (None, False))[1] for i in valid))
    finally:
        await run.stop()
    for job_id in valid:
        assert fake.reads[job_id] == 1  # the fake saw exactly this id, once
        assert (await fetch_row(conn, job_id))["state"] == "completed"
    # each id went out as exactly one path segment, and came back from it unchanged
    paths = fake.raw_paths[paths_before:]
    assert all(p.count("/") == 4 for p in paths), paths
    assert sorted(unquote(p.split("/")[3]) for p in paths) == sorted(valid)
    assert problems.seen == []


async def test_the_plain_fake_serves_an_id_with_a_brace(store, fake, fake_url, client):
    fake.add_job("{x}", script=[{"sume_status": "completed", "terminal": True}])
    answer = await client.read_status("{x}")
    assert answer.status == 200


# -- 3. result bodies -----------------------------------------------------------------------------

result_objects = st.fixed_dictionaries(
    {}, optional={"job_id": texts, "videos": st.lists(st.fixed_dictionaries(
        {"url": st.sampled_from(["https://cdn.example/v.mp4?sig=x", "", "ftp://x"])
         | json_values}), max_size=2) | json_values,
        "error": st.fixed_dictionaries({"code": texts | json_values,
                                         "message": texts | json_values}) | json_values,
        "request_id": texts}).flatmap(
    lambda d: st.dictionaries(texts, json_values, max_size=2).map(lambda e: {**d, **e}))

RETRY_LATER = {401, 403, 404, 408, 409, 425, 429}


def expected_result(code: int | None, body: bytes, retry_after: str | None, attempts: int,
                    t0: datetime, t1: datetime) -> tuple[str, tuple[float, float] | None]:
    """README "Results": fetched; pending again (409 not yet, transient failures); failed for
    good on Sume's own refusal or after MAX_RESULT_ATTEMPTS tries (a 429 never uses them up)."""
    obj = storable_object(body)
    err = (obj or {}).get("error")
    code_word = err.get("code") if isinstance(err, dict) else None
    has_code = isinstance(code_word, str) and bool(code_word)

    def later() -> tuple[str, tuple[float, float] | None]:
        if attempts >= MAX_RESULT_ATTEMPTS and code != 429:
            return "failed", None
        return "pending", (hinted_bounds(retry_after, t0, t1, POLICY)
                           or backoff_bounds(attempts, POLICY))

    if code is None:
        return later()
    if 200 <= code < 300:
        return ("fetched", None) if obj is not None else later()
    if code in RETRY_LATER or code >= 500 or not has_code:
        return later()
    return "failed", None


@settings(FUZZ, max_examples=80)
@given(answer=answers(result_objects), attempts=st.sampled_from([0, 1, 5, 28, 29, 30, 40]))
async def test_any_result_answer_makes_a_documented_transition(
        store, fuzz_fake, conn, problems, answer, attempts):
    fake, client = fuzz_fake
    watched = Watched(store)
    job_id = f"rz-{uuid.uuid4().hex[:12]}"
    fake.add_job(job_id, outcome="completed")
    fake.result_script[job_id] = answer
    await conn.execute("DELETE FROM vidpoll_rate_buckets")
    await store.add_job(job_id, delay_s=3600)
    # a job that completed a moment ago, its result due, after `attempts` earlier tries
    await conn.execute(
        "UPDATE video_jobs SET state = 'completed', finished_at = now(), "
        "result_state = 'pending', result_next_at = now(), result_attempts = %s "
        "WHERE job_id = %s", (attempts, job_id))
    t0 = datetime.now(UTC)
    run = Running(fuzz_worker(watched, client, fetch_results=True))
    try:
        await run.until(lambda: job_id in watched.results)
        t1 = datetime.now(UTC)
        row = await fetch_row(conn, job_id)
    finally:
        await run.stop()
    assert watched.results[job_id][1], "the write was fenced out"
    got_code, sent, body = what_the_client_got(answer)
    state, delay = expected_result(got_code, body, sent.get("Retry-After"), attempts + 1, t0, t1)
    assert fake.result_reads[job_id] == 1
    assert row["state"] == "completed"  # a result never changes the job's own state
    assert row["result_attempts"] == attempts + 1
    assert row["result_token"] is None
    assert row["result_state"] == state, (row["result_state"], row["result_error"])
    assert (row["result_fetched_at"] is not None) == (state == "fetched")
    if state == "fetched":
        assert same_json(row["result"], storable_object(body))
        assert row["result_error"] is None
    else:
        assert row["result"] is None
        assert row["result_error"] and len(row["result_error"]) <= 500
    if delay is not None:
        due = row["result_next_at"]
        assert (t0 + timedelta(seconds=delay[0] - SLACK_S) <= due
                <= t1 + timedelta(seconds=delay[1] + SLACK_S)), ((due - t0).total_seconds(),
                                                               delay)
    assert problems.seen == []


# -- 4. submission payloads ---------------------------------------------------------------------

class Unjsonable:
    """Not JSON at all."""


payload_values = json_values.filter(lambda v: not isinstance(v, Raw)) | st.sampled_from(
    [float("nan"), float("inf"), -float("inf"), "a\x00b", "\ud800", {"\udfff": 1}, {1: "int key"},
     {(1, 2): "tuple key"}, b"bytes", {1, 2}, Unjsonable(), (1, 2), 10**400, 1e300, 1e-300,
     -0.0, "\\u0000", {"k": "\x00"}])
prompts = st.sampled_from(["a lighthouse at dawn", "", "   ", "\u3000", "日本の灯台", "x" * 5000,
                           None, 42, ["a"], {"text": "a"}, "\\u0000"]) | texts


@st.composite
def payloads(draw: st.DrawFn) -> Any:
    """Mostly objects with a prompt (right or wrong); some not objects, some not storable."""
    if draw(st.integers(0, 9)) == 0:
        return draw(payload_values)
    payload: dict[Any, Any] = {}
    prompt = draw(st.just(ABSENT) | prompts)
    if prompt is not ABSENT:
        payload["prompt"] = prompt
    payload.update(draw(st.dictionaries(texts | st.sampled_from([1, "", "\ud800", "a\x00"]),
                                        payload_values, max_size=3)))
    return payload


def reference_payload(payload: Any) -> dict[str, Any] | None:
    """The payload as jsonb gives it back, or None if it cannot be stored (apart from policy)."""
    if not isinstance(payload, dict):
        return None
    try:
        text = json.dumps(payload, allow_nan=False)
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None
    return storable_object(json.dumps(value, ensure_ascii=True).encode())


@settings(FUZZ, max_examples=60)
@given(payload=payloads())
@example(payload={"prompt": "a lighthouse", "f": 1e300})  # re-adding it raised KeyConflict
@example(payload={"prompt": "\\u0000 is six characters"})  # was refused as a NUL
async def test_any_payload_is_refused_before_a_post_or_billed_exactly_once(
        store, fake, fake_url, make_submitter, conn, problems, payload):
    key = f"pz-{uuid.uuid4().hex[:12]}"
    stored = reference_payload(payload)
    if stored is None:
        with pytest.raises(InvalidIntent):
            await store.add_intent(key, payload)
        assert await store.get_intent(key) is None
        assert fake.posts_by_key[key] == 0
        return
    intent, new = await store.add_intent(key, payload)
    assert new and same_json(intent.payload, stored)
    again, new = await store.add_intent(key, payload)  # a re-run with the same request
    assert not new and again.payload == intent.payload
    sub = make_submitter(listen=False, idle_max_s=0.05)
    task = asyncio.create_task(sub.run())
    try:
        await sub.signals.wait_for(
            lambda: sub.stats.submitted + sub.stats.rejected >= 1 or task.done(), 10)
    finally:
        sub.stop()
        await asyncio.wait_for(task, 10)
    done = await store.get_intent(key)
    assert done is not None
    prompt = stored.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        assert done.state == "submitted", (done.state, done.last_error)
        assert fake.billed_by_key[key] == 1
        assert done.job_id is not None and await store.get_job(done.job_id) is not None
        assert same_json(fake.payloads[key], stored)  # what Sume got is what was recorded
    else:
        assert done.state == "rejected"
        assert done.error_code == "invalid_request" and "prompt" in (done.error_message or "")
        assert fake.billed_by_key[key] == 0
    assert fake.posts_by_key[key] == 1
    assert problems.seen == []

