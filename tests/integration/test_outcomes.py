"""Every row of the outcome table, end to end: worker → real HTTP → fake Sume → PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import psycopg
import pytest

from vidpoll.models import ClaimMode
from vidpoll.policy import PollPolicy
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore
from vidpoll.worker import Worker

from ..conftest import API_KEY, run_until

MODES = [ClaimMode.LEASE, ClaimMode.LOCK]
SLOW_BACKOFF = PollPolicy(min_poll_s=0.05, backoff_base_s=10.0, backoff_max_s=20.0)


async def one_read(store: PgStore, fake: FakeSume, make_worker: Callable[..., Worker],
                   script: list[dict[str, Any]], mode: ClaimMode = ClaimMode.LEASE,
                   job_id: str = "job-1", **worker_kwargs: Any) -> dict[str, Any]:
    """Track `job_id`, let a worker read it exactly once, return the row and timing."""
    fake.add_job(job_id, script=script)
    await store.add_job(job_id, delay_s=0)
    # a slow backoff, so no second read starts before the worker is stopped
    worker_kwargs.setdefault("policy", SLOW_BACKOFF)
    worker = make_worker(claim_mode=mode, **worker_kwargs)
    await run_until(worker, lambda: worker.stats.recorded >= 1)
    row = await store.get_job(job_id)
    assert row is not None
    assert fake.reads[job_id] == 1
    return row


def seconds_until(when: datetime) -> float:
    return (when - datetime.now(UTC)).total_seconds()


def scheduled_s(row: dict[str, Any]) -> float:
    """How far after the answer the next read was scheduled, by the database's clock (the
    hint counts from the answer, recorded as last_polled_at): no test-side clock in it."""
    return float((row["next_poll_at"] - row["last_polled_at"]).total_seconds())


@pytest.mark.parametrize("mode", MODES)
async def test_terminal_answer_stores_lower_cased_status(store, fake, fake_url, make_worker,
                                                         mode):
    row = await one_read(store, fake, make_worker, mode=mode, script=[
        {"sume_status": "COMPLETED", "terminal": True, "usage": {"captured": 3}}])
    assert row["state"] == "completed"
    assert row["finished_at"] is not None
    assert row["last_response"]["usage"] == {"captured": 3}
    assert row["polls"] == 1 and row["consecutive_errors"] == 0
    assert row["claim_token"] is None


@pytest.mark.parametrize("status", ["failed", "canceled", "Expired"])
async def test_every_terminal_status(store, fake, fake_url, make_worker, status):
    row = await one_read(store, fake, make_worker,
                         script=[{"sume_status": status, "terminal": True}])
    assert row["state"] == status.lower()


@pytest.mark.parametrize("mode", MODES)
async def test_not_ready_reschedules_from_hint(store, fake, fake_url, make_worker, mode):
    row = await one_read(store, fake, make_worker, mode=mode, script=[
        {"sume_status": "running", "terminal": False, "next_poll_after_seconds": 40}])
    assert row["state"] == "pending"
    assert scheduled_s(row) == pytest.approx(40)
    assert row["polls"] == 1 and row["consecutive_errors"] == 0
    assert row["provider_status"] == "running"


@pytest.mark.parametrize("hint", [None, -3, "soon", "absent"])
async def test_unusable_hint_defaults_to_15_s(store, fake, fake_url, make_worker, hint):
    step: dict[str, Any] = {"sume_status": "queued", "terminal": False}
    if hint != "absent":
        step["next_poll_after_seconds"] = hint
    row = await one_read(store, fake, make_worker, script=[step])
    assert scheduled_s(row) == pytest.approx(15)


async def test_hint_is_clamped_to_max(store, fake, fake_url, make_worker):
    row = await one_read(store, fake, make_worker, script=[
        {"sume_status": "running", "terminal": False, "next_poll_after_seconds": 10**9}])
    assert scheduled_s(row) == pytest.approx(3600)


@pytest.mark.parametrize("code", [429, 503])
async def test_retry_after_seconds_is_honoured(store, fake, fake_url, make_worker, code):
    row = await one_read(store, fake, make_worker, script=[
        {"http": code, "headers": {"Retry-After": "30"}, "code": "rate_limit_exceeded"}])
    assert row["state"] == "pending"
    assert scheduled_s(row) == pytest.approx(30)
    assert row["consecutive_errors"] == 1 and row["polls"] == 0
    assert row["last_error_class"] == ("rate_limited" if code == 429 else "unavailable")
    assert row["last_http_status"] == code
    assert "rate_limit_exceeded" in row["last_error"]


async def test_retry_after_http_date_is_honoured(store, fake, fake_url, make_worker):
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=60)
    row = await one_read(store, fake, make_worker, script=[
        {"http": 503, "headers": {"Retry-After": format_datetime(at, usegmt=True)}}])
    # due at that moment, however long the read took to come round (the delay is counted
    # from the answer, the answer's time is recorded: their sum is the date, give or take
    # the moment between the answer and the decision)
    assert abs((row["next_poll_at"] - at).total_seconds()) < 0.5


@pytest.mark.parametrize(("step", "error_class"), [
    ({"http": 500, "code": "internal_error"}, "server_error"),
    ({"http": 502, "raw": "<html>bad gateway</html>", "content_type": "text/html"},
     "server_error"),
    ({"raw": "<html><body>hello</body></html>", "content_type": "text/html"}, "malformed"),
    ({"raw": "{\"terminal\": tru", "content_type": "application/json"}, "malformed"),
    # neither a boolean `terminal` nor a status word (a word alone decides: test_status_shapes)
    ({"body": {"sume_status": 7}}, "malformed"),
    # valid for Python's json, refused by jsonb: must not break the batch write
    ({"raw": '{"terminal": false, "x": "\\u0000"}', "content_type": "application/json"},
     "malformed"),
    ({"raw": '{"terminal": false, "next_poll_after_seconds": NaN}',
      "content_type": "application/json"}, "malformed"),
    ({"body": ["not", "an", "object"]}, "malformed"),
    ({"hang": 3}, "timeout"),
    ({"http": 400, "code": "bad_request"}, "client_error"),
])
@pytest.mark.parametrize("mode", MODES)
async def test_failed_reads_back_off_and_stay_pending(store, fake, fake_url, make_worker, step,
                                                      error_class, mode):
    row = await one_read(store, fake, make_worker, mode=mode, script=[step])
    assert row["state"] == "pending"
    assert row["last_error_class"] == error_class
    assert row["consecutive_errors"] == 1 and row["errors_total"] == 1 and row["polls"] == 0
    # first failure: backoff base 10 s with equal jitter → 5-10 s later, never "now"
    delay = (row["next_poll_at"] - row["last_polled_at"]).total_seconds()
    assert 5.0 <= delay <= 10.0


async def test_backoff_grows_with_consecutive_errors(store, fake, fake_url, make_worker):
    fake.add_job("flaky", script=[{"http": 500}] * 4 + [{"sume_status": "completed",
                                                          "terminal": True}])
    await store.add_job("flaky", delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.finished == 1)
    row = await store.get_job("flaky")
    assert row["state"] == "completed"
    assert row["errors_total"] == 4 and row["consecutive_errors"] == 0 and row["polls"] == 1
    assert fake.reads["flaky"] == 5


async def test_404_retried_then_not_found(store, fake, fake_url, make_worker):
    await store.add_job("ghost", delay_s=0)
    worker = make_worker()
    policy = worker.config.policy
    await run_until(worker, lambda: worker.stats.finished == 1)
    row = await store.get_job("ghost")
    assert row["state"] == "not_found"
    assert fake.reads["ghost"] == policy.not_found_max_tries
    assert row["last_http_status"] == 404 and row["finished_at"] is not None


async def test_404_right_after_creation_then_found(store, fake, fake_url, make_worker):
    fake.add_job("young", script=[{"http": 404, "code": "not_found"}] * 2 + [
        {"sume_status": "completed", "terminal": True}])
    await store.add_job("young", delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.finished == 1)
    row = await store.get_job("young")
    assert row["state"] == "completed" and row["not_found_count"] == 0


async def test_gave_up_after_max_age_then_resume(store, db_url, fake, fake_url, make_worker):
    fake.add_job("slow", script=[{"sume_status": "running", "terminal": False}])
    await store.add_job("slow", delay_s=0)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE video_jobs SET polling_since = now() - interval '49 hours'")
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.finished == 1)
    row = await store.get_job("slow")
    assert row["state"] == "gave_up" and row["finished_at"] is not None
    assert row["provider_status"] == "running"
    assert await store.resume("slow")
    row = await store.get_job("slow")
    assert row["state"] == "pending" and row["finished_at"] is None
    assert seconds_until(row["next_poll_at"]) <= 0
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.recorded == 1)
    assert (await store.get_job("slow"))["state"] == "pending"  # clock restarted by resume


async def test_resume_leaves_sume_terminal_states_alone(store, fake, fake_url, make_worker):
    await one_read(store, fake, make_worker, script=[{"sume_status": "failed", "terminal": True}])
    assert not await store.resume("job-1")
    assert not await store.resume("no-such-job")


@pytest.mark.parametrize("code", [401, 403])
async def test_auth_failure_pauses_everything_and_touches_no_row(
        store, fake, fake_url, make_worker, caplog, code):
    for i in range(5):
        fake.add_job(f"a{i}", script=[{"http": code, "code": "unauthorized"}])
        await store.add_job(f"a{i}", delay_s=0)
    before = {i: await store.get_job(f"a{i}") for i in range(5)}
    caplog.set_level(logging.DEBUG)
    worker = make_worker(concurrency=1, batch_size=1)
    await run_until(worker, lambda: worker.stats.errors.get("auth", 0) >= 2, within_s=15)
    after = {i: await store.get_job(f"a{i}") for i in range(5)}
    for i in range(5):
        for column in ("state", "next_poll_at", "polls", "consecutive_errors", "errors_total"):
            assert after[i][column] == before[i][column], (i, column)
        assert after[i]["claim_token"] is None
    # paused: one probe per pause, not one read per row per loop
    assert sum(fake.reads.values()) <= worker.stats.errors["auth"] + 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and all("SUME_API_KEY" in r.getMessage() for r in errors)
    assert API_KEY not in caplog.text


async def test_wrong_key_is_never_logged(store, fake, fake_url, db_url, caplog):
    from vidpoll.providers.sume.client import SumeClient
    from vidpoll.worker import Worker, WorkerConfig

    from ..conftest import FAST_POLICY

    wrong = "sk-wrong-key-do-not-log-1234"
    fake.add_job("k")
    await store.add_job("k", delay_s=0)
    caplog.set_level(logging.DEBUG)
    async with SumeClient(fake_url, wrong, timeout_s=1) as bad_client:
        assert wrong not in repr(bad_client)
        worker = Worker(store, bad_client, WorkerConfig(policy=FAST_POLICY))
        await run_until(worker, lambda: worker.stats.errors.get("auth", 0) >= 1)
    assert fake.auth_failures >= 1
    assert wrong not in caplog.text and API_KEY not in caplog.text
    assert (await store.get_job("k"))["state"] == "pending"
