"""Render times in the database (0018): recorded as jobs end, summarised once a minute
fleet-wide, pruned to a window; overdue jobs listed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from vidpoll.models import ClaimedJob, ErrorClass, Outcome
from vidpoll.schedule import ANY_KEY, durations_from_samples
from vidpoll.store import PgStore


def _sql(url: str, statement: str, params: dict[str, object] | None = None) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def _end_jobs(url: str, prefix: str, seconds: list[float], *, model: str = "m1",
              key: str | None = None, outcome: str = "succeeded", account: str = "default",
              provider: str = "replicate") -> None:
    """Jobs made `seconds[i]` ago and read running 1 s ago, ended now by an UPDATE (the
    trigger records each: its observed render time is seconds[i] - 0.5)."""
    _sql(url, """
        INSERT INTO video_jobs (job_id, account, provider, model, duration_key, created_at,
                                polling_since, last_polled_at)
        SELECT %(prefix)s || i, %(account)s, %(provider)s, %(model)s, %(key)s,
               now() - make_interval(secs => s), now() - make_interval(secs => s),
               now() - interval '1 second'
        FROM unnest(%(seconds)s::float8[]) WITH ORDINALITY AS u(s, i)""",
         {"prefix": prefix, "seconds": seconds, "model": model, "key": key,
          "account": account, "provider": provider})
    _sql(url, "UPDATE video_jobs SET state = 'done', outcome = %(outcome)s, finished_at = now()"
              " WHERE job_id LIKE %(like)s",
         {"outcome": outcome, "like": f"{prefix}%"})


async def test_ended_jobs_are_summarised_per_model_and_key(db_url: str,
                                                           store: PgStore) -> None:
    fast = [20.0 + i * 0.1 for i in range(150)]
    slow = [200.0 + i for i in range(120)]
    _end_jobs(db_url, "f", fast, key="5s")
    _end_jobs(db_url, "s", slow, key="10s")
    _end_jobs(db_url, "x", [5.0] * 30, outcome="canceled")  # not a render's end: not counted
    groups = {(d.model, d.duration_key): d for d in await store.render_stats()}
    assert set(groups) == {("m1", "5s"), ("m1", "10s"), ("m1", ANY_KEY)}
    want = durations_from_samples([s - 0.5 for s in fast])
    got = groups[("m1", "5s")]
    assert got.jobs == 150
    assert got.quantiles == pytest.approx(want.quantiles, abs=0.05)  # real, to ~1e-6
    assert groups[("m1", ANY_KEY)].jobs == 270
    rows = _sql(db_url, "SELECT source, count(*) FROM vidpoll_render_times GROUP BY source")
    assert rows == [("observed", 270)]


async def test_the_providers_own_render_time_wins(db_url: str, store: PgStore) -> None:
    _sql(db_url, "INSERT INTO video_jobs (job_id, provider, model, created_at) "
                 "VALUES ('p1', 'replicate', 'm1', now() - interval '100 seconds')")
    _sql(db_url, "UPDATE video_jobs SET state = 'succeeded', outcome = 'succeeded', "
                 "render_s = 61.5 WHERE job_id = 'p1'")
    assert _sql(db_url, "SELECT seconds, source FROM vidpoll_render_times") == [
        (61.5, "provider")]


async def test_the_summary_is_refreshed_at_most_once_a_minute(db_url: str,
                                                               store: PgStore) -> None:
    _end_jobs(db_url, "a", [30.0] * 10)
    first = await store.render_stats(max_age_s=60)
    assert [d.jobs for d in first if d.duration_key == ANY_KEY] == [10]
    _end_jobs(db_url, "b", [30.0] * 5)
    # within the minute: the summary as it was (no statement scans the samples)
    again = await store.render_stats(max_age_s=60)
    assert [d.jobs for d in again if d.duration_key == ANY_KEY] == [10]
    later = datetime.now(UTC) + timedelta(seconds=61)
    fresh = await store.render_stats(max_age_s=60, now=later)
    assert [d.jobs for d in fresh if d.duration_key == ANY_KEY] == [15]


async def test_the_window_keeps_the_newest_thousand_within_thirty_days(
        db_url: str, store: PgStore) -> None:
    _sql(db_url, """
        INSERT INTO vidpoll_render_times (account, provider, model, duration_key, ended_at,
                                          seconds, source)
        SELECT 'default', 'replicate', 'm1', '', now() - make_interval(secs => i),
               CASE WHEN i <= 1000 THEN 50 ELSE 500 END, 'observed'
        FROM generate_series(1, 1200) AS i""")
    _sql(db_url, """
        INSERT INTO vidpoll_render_times (account, provider, model, duration_key, ended_at,
                                          seconds, source)
        SELECT 'default', 'replicate', 'old', '', now() - interval '31 days', 9, 'observed'
        FROM generate_series(1, 5)""")
    groups = {(d.model, d.duration_key): d for d in await store.render_stats()}
    newest = groups[("m1", "")]
    assert newest.jobs == 1000
    assert newest.longest == 50.0  # the 200 older, slower ones are out of the window
    assert ("old", "") not in groups
    assert _sql(db_url, "SELECT count(*) FROM vidpoll_render_times") == [(1000,)]


async def test_overdue_jobs_are_listed_and_counted(db_url: str, store: PgStore) -> None:
    await store.add_job("late-1", delay_s=0.0)
    await store.add_job("fine-1", delay_s=0.0)
    claimed = await store.claim(10, 30.0, "w1")
    by_id = {j.job_id: j for j in claimed}
    assert set(by_id) == {"late-1", "fine-1"}

    def pending(job: ClaimedJob, overdue_after_s: float) -> Outcome:
        return Outcome(job.job_id, job.claim_token, "pending", 5.0, read_ok=True,
                       poll_reason="learned: read 3 of 9", overdue_after_s=overdue_after_s)

    assert await store.record([pending(by_id["late-1"], 60.0),
                               pending(by_id["fine-1"], 3600.0)]) == {"late-1", "fine-1"}
    assert await store.list_overdue() == []
    soon = datetime.now(UTC) + timedelta(seconds=120)
    rows = await store.list_overdue(now=soon)
    assert [r["job_id"] for r in rows] == ["late-1"]
    assert rows[0]["poll_reason"] == "learned: read 3 of 9"
    assert await store.count_overdue(now=soon) == {"default": 1}
    # a job that ends is no longer overdue
    again = await store.claim(10, 30.0, "w1", now=soon)
    late = next(j for j in again if j.job_id == "late-1")
    await store.record([Outcome(late.job_id, late.claim_token, "succeeded", 0.0, read_ok=True,
                                outcome="succeeded")], now=soon)
    assert await store.count_overdue(now=soon) == {}


async def test_an_intent_records_its_model_for_its_job(db_url: str, store: PgStore) -> None:
    intent, new = await store.add_intent(f"k-{uuid.uuid4()}", {"prompt": "a cat"},
                                         provider="replicate", model="owner/model")
    assert new
    rows = _sql(db_url, "SELECT model FROM video_intents WHERE idempotency_key = %(k)s",
                {"k": intent.key})
    assert rows == [("owner/model",)]


async def test_the_trigger_keeps_a_group_to_its_newest_thousand(db_url: str) -> None:
    # nobody reads the summary here (every account fixed, no serve): the table stays bounded
    _end_jobs(db_url, "a", [30.0] * 1000)
    _end_jobs(db_url, "b", [40.0] * 7)
    assert _sql(db_url, "SELECT count(*) FROM vidpoll_render_times") == [(1000,)]
    assert _sql(db_url, "SELECT count(*) FROM vidpoll_render_times WHERE seconds > 35") == [
        (7,)]


async def test_a_failed_read_is_no_bound_on_the_end(db_url: str, store: PgStore) -> None:
    await store.add_job("r1", delay_s=0.0)
    (job,) = await store.claim(5, 30.0, "w1")
    # a read that saw it running, then (the next claim) one that failed
    await store.record([Outcome(job.job_id, job.claim_token, "pending", 0.0, read_ok=True)])
    seen = _sql(db_url, "SELECT running_seen_at FROM video_jobs")[0][0]
    (job,) = await store.claim(5, 30.0, "w1")
    await store.record([Outcome(job.job_id, job.claim_token, "pending", 0.0, read_ok=False,
                                error_class=ErrorClass.SERVER_ERROR, http_status=502)])
    assert _sql(db_url, "SELECT running_seen_at FROM video_jobs") == [(seen,)]
