"""Misconfiguration never ends a job (issue 17, item 1): a status read that something other
than the provider answers (a wrong base URL's path, a proxy's error page) pauses the account
as a refused key does, with one ERROR naming the URL tried, and never counts toward
`not_found`. Worker → real HTTP → fake Sume (or what answers in its place) → PostgreSQL.

Every wait is on observed state (requests the fake saw, the worker's counters), never on time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from vidpoll.models import ClaimMode
from vidpoll.policy import PollPolicy
from vidpoll.store import PgStore
from vidpoll.sume import SumeClient
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, run_until

FAST_PROBES = PollPolicy(min_poll_s=0.05, backoff_base_s=0.1, backoff_max_s=0.5,
                         default_poll_s=15.0, auth_backoff_max_s=0.1)
"""Pauses and probes of 0.05-0.1 s: a dozen attempts take about a second."""
ATTEMPTS = 12
"""Well past the 8 reads (not_found_max_tries) that ended such a job as not_found."""
NGINX_404 = ("<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 "
             "Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
HTML_404 = {"http": 404, "raw": NGINX_404, "content_type": "text/html"}


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("vidpoll") and r.levelno >= logging.ERROR]


def resumed(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("vidpoll")
            and r.levelno == logging.INFO and "resumed" in r.getMessage()]


async def untouched(store: PgStore, job_id: str) -> dict[str, Any]:
    """The row as a worker that never read it would have left it."""
    row = await store.get_job(job_id)
    assert row is not None
    assert row["state"] == "pending", row
    assert row["not_found_count"] == 0 and row["errors_total"] == 0, row
    assert row["consecutive_errors"] == 0 and row["polls"] == 0, row
    assert row["claim_token"] is None and row["last_http_status"] is None, row
    return row


async def test_a_wrong_path_prefix_pauses_its_account_and_never_ends_a_job(
        store, fake, fake_url, caplog):
    caplog.set_level(logging.INFO, logger="vidpoll")
    fake.add_job("job-1")
    fake.add_job("acme-1")
    await store.add_job("job-1", delay_s=0)
    await store.add_job("acme-1", delay_s=0, account="acme")
    wrong = f"{fake_url}/wrong"  # right host, wrong path prefix: aiohttp's own plain 404

    def tried() -> int:
        return sum(fake.unrouted.values())

    config = WorkerConfig(policy=FAST_PROBES, lease_s=5.0, concurrency=5,
                          accounts=("default", "acme"))
    async with SumeClient(wrong, API_KEY, timeout_s=1.0) as bad, \
            SumeClient(fake_url, API_KEY, timeout_s=1.0) as good:
        worker = Worker(store, {"default": bad, "acme": good}, config)
        # many attempts at the wrong URL (or, the bug, the job ended)
        await run_until(worker, lambda: (tried() >= ATTEMPTS and worker.stats.finished == 1)
                        or worker.stats.finished > 1)
        assert worker.stats.finished == 1, "a job ended while the base URL was wrong"
        await untouched(store, "job-1")
        # the other account went on
        assert (await store.get_job("acme-1"))["state"] == "completed"
        assert fake.reads["job-1"] == 0  # no request reached the provider's route
        assert all(p.startswith("/wrong/v1/jobs/") and p.endswith("/status")
                   for p in fake.unrouted), fake.unrouted
        # one ERROR for the whole pause, naming the URL tried and the status, never the key
        lines = errors(caplog)
        assert len(lines) == 1, lines
        assert f"{wrong}/v1/jobs/job-1/status" in lines[0] and "HTTP 404" in lines[0]
        assert "account 'default'" in lines[0] and "paused" in lines[0]
        assert API_KEY not in caplog.text and "Bearer" not in caplog.text
        assert "not_found" not in caplog.text

        # the URL fixed (a restart with the right setting): the job completes
        caplog.clear()
        fixed = Worker(store, {"default": good, "acme": good}, config)
        await run_until(fixed, lambda: fixed.stats.finished == 1)
    row = await store.get_job("job-1")
    assert row["state"] == "completed" and row["not_found_count"] == 0
    assert errors(caplog) == []


@pytest.mark.parametrize(("answer", "mode"), [
    pytest.param(HTML_404, ClaimMode.LEASE, id="proxy-html-404"),
    pytest.param({"http": 400, "raw": "400 Bad Request: plain HTTP sent to the HTTPS port",
                  "content_type": "text/plain"}, ClaimMode.LOCK, id="text-400-lock"),
    pytest.param({"http": 404, "raw": '{"detail": "Not Found"}',
                  "content_type": "application/json"}, ClaimMode.LEASE, id="json-404"),
])
async def test_a_proxy_answering_in_the_providers_place_pauses_until_it_is_fixed(
        store, fake, fake_url, make_worker, caplog, answer, mode):
    caplog.set_level(logging.INFO, logger="vidpoll")
    fake.add_job("job-1")
    await store.add_job("job-1", delay_s=0)
    fake.config.front_answer = answer
    worker = make_worker(policy=FAST_PROBES, claim_mode=mode)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: fake.front_answers >= ATTEMPTS
                                      or worker.stats.finished > 0 or task.done(), 10)
        assert not task.done() and worker.stats.finished == 0
        await untouched(store, "job-1")
        lines = errors(caplog)
        assert len(lines) == 1, lines
        assert f"{fake_url}/v1/jobs/job-1/status" in lines[0]
        assert f"HTTP {answer['http']}" in lines[0]
        assert resumed(caplog) == []
        # the proxy fixed: the next probe reaches the provider, polling resumes
        fake.config.front_answer = None
        await worker.signals.wait_for(lambda: worker.stats.finished == 1 or task.done(), 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    row = await store.get_job("job-1")
    assert row["state"] == "completed" and row["not_found_count"] == 0, row
    assert len(errors(caplog)) == 1 and len(resumed(caplog)) == 1, caplog.text
    assert API_KEY not in caplog.text


async def test_a_proxy_refusing_one_rows_url_backs_off_that_row_and_the_rest_go_on(
        store, fake, fake_url, make_worker, caplog):
    # a proxy that refuses one job id's URL (an encoded character it dislikes) while the
    # provider answers every other read: that row backs off on its own after one pause
    caplog.set_level(logging.INFO, logger="vidpoll")
    fake.add_job("odd", script=[HTML_404] * 3 + [{"sume_status": "completed",
                                                  "terminal": True}])
    await store.add_job("odd", delay_s=0)
    for i in range(3):
        fake.add_job(f"ok{i}")
        await store.add_job(f"ok{i}", delay_s=0)
    worker = make_worker(policy=FAST_PROBES)
    await run_until(worker, lambda: worker.stats.finished == 4)
    for i in range(3):
        assert (await store.get_job(f"ok{i}"))["state"] == "completed"
    row = await store.get_job("odd")
    assert row["state"] == "completed" and row["not_found_count"] == 0, row
    # the first refusal paused the account (untouched); the provider answering the others
    # showed it was this row's URL: its later refusals were its own errors, with backoff
    assert row["errors_total"] == 2, row
    assert fake.reads["odd"] == 4
    # one pause, one resume: not a line per read
    assert len(errors(caplog)) == 1 and len(resumed(caplog)) == 1, caplog.text
