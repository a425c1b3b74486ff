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

from vidpoll import metrics
from vidpoll.models import QUEUED, REJECTED, SUBMITTED, ClaimMode
from vidpoll.policy import NOT_API_STREAK, MisroutedCreate, PollPolicy
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig, submit_now
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
        # the pause shows in the stop line and the metrics, not only in the ERROR
        assert worker.misroute_pauses == 1 and worker.url_probes >= 1
        assert (f"url_pauses=1 url_probes={worker.url_probes} " in caplog.text), caplog.text
        assert metrics.MISROUTE_PAUSES.labels("default", "poll")._value.get() >= 1

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


# -- the submitter: a create answered by something other than Sume --------------------------
SUBMIT_PROBES = 8
"""Status-read probes the submitter must have sent while paused (a few backoff rounds)."""


def posts_unrouted(fake: FakeSume) -> int:
    return sum(n for p, n in fake.unrouted.items() if p.endswith("/v1/videos"))


def reads_unrouted(fake: FakeSume) -> int:
    return sum(n for p, n in fake.unrouted.items() if p.endswith("/status"))


async def queue_intents(store: PgStore, *keys: str) -> None:
    for key in keys:
        await store.add_intent(key, {"prompt": f"clip {key}"})


async def never_sent(store: PgStore, key: str) -> None:
    """The intent as a submitter that never POSTed it would have left it."""
    intent = await store.get_intent(key)
    assert intent is not None and intent.state == QUEUED, intent
    assert intent.attempts == 0 and intent.unknown_outcome_at is None, intent
    assert intent.job_id is None and intent.error_code is None, intent


def submitter_config(**kwargs: Any) -> SubmitterConfig:
    kwargs.setdefault("concurrency", 2)
    return SubmitterConfig(max_active=None, policy=FAST_PROBES, lease_s=5.0,
                           http_timeout_s=1.0, first_poll_s=0.0, **kwargs)


async def test_a_wrong_path_prefix_pauses_submitting_and_probes_with_reads_never_posts(
        store, fake, fake_url, caplog):
    # the review: one INFO line per retry ('outcome unknown (HTTP 404 (not a Sume error
    # answer))'), 19 in 11 minutes, never an ERROR naming the URL, never a pause; and each
    # 404 recorded an unknown outcome, so a later refusal needed `intents resolve` by hand
    caplog.set_level(logging.INFO, logger="vidpoll")
    keys = ("wu-1", "wu-2", "wu-3")
    await queue_intents(store, *keys)
    wrong = f"{fake_url}/wrong"
    async with SumeClient(wrong, API_KEY, timeout_s=1.0) as bad:
        sub = Submitter(store, bad, submitter_config())
        await run_until(sub, lambda: reads_unrouted(fake) >= SUBMIT_PROBES
                        or posts_unrouted(fake) > 2 * SUBMIT_PROBES)
    # the first batch (concurrency 2) went out; after it only status reads, with backoff
    assert posts_unrouted(fake) <= 2, fake.unrouted
    assert sub.stats.url_pauses == 1 and sub.stats.url_probes >= SUBMIT_PROBES
    assert fake.creates == 0 and fake.billed == 0
    for key in keys:
        await never_sent(store, key)
    lines = errors(caplog)
    assert len(lines) == 1, lines
    assert f"POST {wrong}/v1/videos got HTTP 404" in lines[0], lines
    assert "account 'default'" in lines[0] and "paused" in lines[0]
    assert "outcome unknown" not in caplog.text
    assert API_KEY not in caplog.text and "Bearer" not in caplog.text
    assert "url_pauses=1" in caplog.text  # the stop line

    # the URL fixed (a restart with the right setting): each intent sent once, billed once
    caplog.clear()
    async with SumeClient(fake_url, API_KEY, timeout_s=1.0) as good:
        fixed = Submitter(store, good, submitter_config())
        await run_until(fixed, lambda: fixed.stats.submitted == 3)
    assert fake.billed == 3 and all(fake.billed_by_key[k] == 1 for k in keys)
    assert all(fake.posts_by_key[k] == 1 for k in keys)
    for key in keys:
        intent = await store.get_intent(key)
        assert intent is not None and intent.state == SUBMITTED and intent.attempts == 1
    assert errors(caplog) == []


async def test_a_proxy_in_sumes_place_pauses_submitting_until_a_read_reaches_sume(
        store, fake, fake_url, caplog):
    caplog.set_level(logging.INFO, logger="vidpoll")
    keys = ("px-1", "px-2", "px-3")
    await queue_intents(store, *keys)
    fake.config.front_answer = HTML_404
    async with SumeClient(fake_url, API_KEY, timeout_s=1.0) as client:
        sub = Submitter(store, client, submitter_config())
        task = asyncio.create_task(sub.run())
        try:
            await sub.signals.wait_for(lambda: sub.stats.url_probes >= SUBMIT_PROBES
                                       or sub.stats.posts > 2 * SUBMIT_PROBES
                                       or task.done(), 10)
            assert not task.done()
            assert sub.stats.posts <= 2 and sub.stats.url_pauses == 1, sub.stats
            assert fake.creates == 0
            for key in keys:
                await never_sent(store, key)
            assert len(errors(caplog)) == 1 and resumed(caplog) == []
            # the proxy fixed: the next probe (a status read) reaches Sume, submitting resumes
            fake.config.front_answer = None
            await sub.signals.wait_for(lambda: sub.stats.submitted == 3 or task.done(), 10)
        finally:
            sub.stop()
            await asyncio.wait_for(task, 10)
    assert sub.stats.submitted == 3 and sub.stats.url_pauses == 1
    assert fake.billed == 3 and all(fake.billed_by_key[k] == 1 for k in keys)
    assert len(errors(caplog)) == 1 and len(resumed(caplog)) == 1, caplog.text
    assert API_KEY not in caplog.text


@pytest.mark.parametrize(("payload", "credits", "code"), [
    pytest.param({"prompt": " "}, None, "invalid_request", id="422"),
    pytest.param({"prompt": "a heron"}, 0, "insufficient_credits", id="402"),
])
async def test_a_refusal_after_a_wrong_url_is_final_not_unknown(
        store, fake, fake_url, payload, credits, code):
    # the wrong URL's 404 never reached Sume: no unknown outcome is recorded, so Sume's own
    # refusal of the same key afterwards is a plain rejection, not an `unknown` intent that
    # needs `intents resolve` by hand (before: UNKNOWN)
    await store.add_intent("rf-1", payload)
    async with SumeClient(f"{fake_url}/wrong", API_KEY, timeout_s=1.0) as bad:
        result = await submit_now(store, bad, submitter_config(), "rf-1")
    assert isinstance(result, MisroutedCreate) and result.http_status == 404
    await never_sent(store, "rf-1")
    fake.config.credits = credits
    async with SumeClient(fake_url, API_KEY, timeout_s=1.0) as good:
        sub = Submitter(store, good, submitter_config())
        await run_until(sub, lambda: sub.stats.rejected + sub.stats.unknown >= 1)
    intent = await store.get_intent("rf-1")
    assert intent is not None and intent.state == REJECTED and intent.error_code == code
    assert intent.unknown_outcome_at is None and fake.billed == 0


# -- redirects and web pages: probably not the API, but no pause ---------------------------
async def test_redirects_in_the_providers_place_are_named_once_and_pause_nothing(
        store, fake, fake_url, make_worker, caplog):
    # before: each row's error with backoff, silently, until `gave_up` after 48 h
    caplog.set_level(logging.INFO, logger="vidpoll")
    for job_id in ("rd-1", "rd-2"):
        fake.add_job(job_id)
        await store.add_job(job_id, delay_s=0)
    fake.config.front_answer = {"http": 302, "raw": "",
                                "headers": {"Location": "https://login.example.com/?next=x"}}
    worker = make_worker(policy=FAST_PROBES)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: fake.front_answers >= NOT_API_STREAK + 3
                                      or task.done(), 10)
        assert not task.done() and worker.stats.finished == 0
        lines = errors(caplog)
        assert len(lines) == 1, lines
        assert f"{fake_url}/v1/jobs/rd-" in lines[0] and "HTTP 302" in lines[0]
        assert "a redirect" in lines[0] and "probably wrong" in lines[0]
        assert "login.example.com" not in caplog.text  # never the redirect's target
        assert worker.misroute_pauses == 0 and worker.url_probes == 0  # no pause
        for job_id in ("rd-1", "rd-2"):
            row = await store.get_job(job_id)
            assert row["state"] == "pending" and row["not_found_count"] == 0, row
        fake.config.front_answer = None
        await worker.signals.wait_for(lambda: worker.stats.finished == 2 or task.done(), 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert worker.stats.finished == 2 and len(errors(caplog)) == 1
    assert any("answers status reads again" in r.getMessage() for r in caplog.records)


async def test_a_providers_passing_broken_bodies_pause_nothing_and_say_nothing(
        store, fake, make_worker, caplog):
    # the fake's own fault (a 200 with an HTML body): a few now and then must never pause the
    # account nor name the URL (NOT_API_STREAK in a row would)
    caplog.set_level(logging.INFO, logger="vidpoll")
    done = {"sume_status": "completed", "terminal": True}
    for i in range(2):  # 4 broken bodies at most in a row: under NOT_API_STREAK
        fake.add_job(f"bb-{i}", script=[{"fault": "html"}, {"fault": "html"}, done])
        await store.add_job(f"bb-{i}", delay_s=0)
    fake.add_job("bb-ok")
    await store.add_job("bb-ok", delay_s=0)
    worker = make_worker(policy=FAST_PROBES)
    await run_until(worker, lambda: worker.stats.finished == 3)
    assert worker.misroute_pauses == 0 and errors(caplog) == []
