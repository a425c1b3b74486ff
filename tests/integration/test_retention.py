"""Retention: `jobs prune` archives by named columns (a column a user adds to video_jobs
breaks nothing), deletes old history and webhook events in batches, and says why each row it
kept stayed. Real PostgreSQL, the CLI as a subprocess."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import psycopg

from vidpoll.sql import QUERIES
from vidpoll.store import ARCHIVED_COLUMNS

from .test_process import cli_env
from .test_submit_process import run_cli


async def execute(db_url: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)


async def rows(db_url: str, query: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(query)
        return await cur.fetchall()


async def prune(db_url: str, fake_url: str, *args: str,
                before: datetime | None = None) -> tuple[int, str, str]:
    cutoff = (before or datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    return await run_cli(cli_env(db_url, fake_url), "jobs", "prune", "--finished-before",
                         cutoff, *args)


async def finished(db_url: str, *job_ids: str, days_ago: float = 1.0) -> None:
    """Final rows (no result wanted, no delivery), finished `days_ago`."""
    values = ", ".join(f"('{j}', 'failed', now() - interval '{days_ago} days')" for j in job_ids)
    await execute(db_url, f"INSERT INTO video_jobs (job_id, state, finished_at) VALUES {values}")


async def test_prune_works_with_a_column_a_user_added_to_video_jobs(store, db_url, fake_url):
    # a text column: `INSERT ... SELECT *` put it in archived_at's place and failed
    await execute(db_url, "ALTER TABLE video_jobs ADD COLUMN customer text "
                          "NOT NULL DEFAULT 'acme'")
    await finished(db_url, "u1", "u2", "u3")
    code, out, err = await prune(db_url, fake_url, "--batch", "2")
    assert code == 0, err
    assert "moved 3 rows" in out
    assert await store.counts() == {}
    archived = await store.get_archived_job("u2")
    assert archived is not None and archived["state"] == "failed"
    # said, not silent: the column's values are not kept by the archive
    assert "columns prune does not archive" in err and "customer" in err


async def test_a_user_timestamp_column_never_lands_in_archived_at(store, db_url):
    # a timestamptz column: `SELECT *` copied it into archived_at without an error
    await execute(db_url, "ALTER TABLE video_jobs ADD COLUMN billed_on timestamptz "
                          "DEFAULT '2001-02-03 00:00+00'")
    await finished(db_url, "t1")
    started = datetime.now(UTC) - timedelta(minutes=5)
    assert await store.prune_finished(datetime.now(UTC), 10) == 1
    archived = await store.get_archived_job("t1")
    assert archived is not None
    assert archived["archived_at"] > started, archived["archived_at"]
    assert "billed_on" not in archived


async def test_the_prune_column_list_is_every_column_of_the_archive(db_url):
    insert = re.search(r"INSERT INTO video_jobs_archive \((.*?)\)\s*SELECT(.*?)FROM moved",
                       re.sub(r"--[^\n]*", "", QUERIES["prune_finished"]), re.S)
    assert insert is not None
    into, select = ([c.strip() for c in part.split(",")] for part in insert.groups())
    archive = [r[0] for r in await rows(
        db_url, "SELECT column_name FROM information_schema.columns WHERE table_name = "
                "'video_jobs_archive' ORDER BY ordinal_position")]
    # a column a migration adds to both tables must be added to the query (and the constant)
    assert into == select == list(ARCHIVED_COLUMNS) == [c for c in archive if c != "archived_at"]


async def test_prune_deletes_the_history_of_gone_jobs_by_age_and_keeps_the_rest(
        store, db_url, fake_url):
    await finished(db_url, "old1", "old2", "old3", "mixed", days_ago=100)
    await finished(db_url, "recent", days_ago=100)
    await execute(
        db_url,
        # a job still on the hot table keeps its history, whatever its age
        "INSERT INTO video_jobs (job_id, state, next_poll_at) VALUES ('live', 'pending', now())",
        "INSERT INTO video_job_events (job_id, kind, detail) "
        "SELECT 'live', 'error', 'e' || g FROM generate_series(1, 3) g",
        "INSERT INTO video_job_events (job_id, kind, detail) "
        "SELECT 'old2', 'error', 'e' || g FROM generate_series(1, 4) g",
        "UPDATE video_job_events SET at = now() - interval '100 days' "
        "WHERE job_id <> 'recent'",
        # a history with one recent event is kept whole, never half
        "INSERT INTO video_job_events (job_id, kind, at) "
        "VALUES ('mixed', 'recovered', now() - interval '1 day')")
    before = await rows(db_url, "SELECT job_id, count(*) FROM video_job_events "
                                "GROUP BY job_id ORDER BY job_id")
    assert dict(before) == {"live": 4, "mixed": 2, "old1": 1, "old2": 5, "old3": 1,
                            "recent": 1}
    code, out, err = await prune(db_url, fake_url, "--batch", "2",
                                 "--events-older-than", "30d")
    assert code == 0, err
    assert "moved 5 rows" in out
    after = await rows(db_url, "SELECT job_id, count(*) FROM video_job_events "
                               "GROUP BY job_id ORDER BY job_id")
    assert dict(after) == {"live": 4, "mixed": 2, "recent": 1}
    assert ("deleted 7 history events of jobs no longer in video_jobs, all older than 30d; "
            "kept 5 as old: their jobs are still in video_jobs or have newer events") in out, out
    assert "deleted 2 events so far" in err  # in windows of --batch, each its own transaction
    # off: nothing deleted
    code, out, err = await prune(db_url, fake_url, "--events-older-than", "off")
    assert code == 0 and "history: kept for ever" in out, err
    code, _, err = await prune(db_url, fake_url, "--events-older-than", "soon")
    assert code == 2 and "not a duration" in err


async def test_prune_deletes_webhook_events_past_the_replay_window(store, db_url, fake_url):
    await execute(
        db_url,
        "INSERT INTO vidpoll_webhook_events (event_id, job_id, effect, received_at) "
        "SELECT 'old-' || g, 'j', 'unknown', now() - interval '3 hours' "
        "FROM generate_series(1, 5) g",
        "INSERT INTO vidpoll_webhook_events (event_id, job_id, effect, received_at) VALUES "
        "('within-margin', 'j', 'unknown', now() - interval '30 minutes'), "
        "('new', 'j', 'unknown', now())")
    # shorter than twice the tolerance (300 s): a captured delivery could be replayed
    code, _, err = await prune(db_url, fake_url, "--webhook-events-older-than", "5m")
    assert code == 2 and "at least 600s" in err, err
    assert len(await rows(db_url, "SELECT 1 FROM vidpoll_webhook_events")) == 7
    # the default: the replay window (2 x 300 s) plus an hour
    code, out, err = await prune(db_url, fake_url, "--batch", "2")
    assert code == 0, err
    assert "deleted 5 webhook events received over 1h10m ago" in out, out
    left = await rows(db_url, "SELECT event_id FROM vidpoll_webhook_events ORDER BY 1")
    assert left == [("new",), ("within-margin",)]
    code, out, err = await prune(db_url, fake_url, "--webhook-events-older-than", "20m")
    assert code == 0 and "deleted 1 webhook events received over 20m ago" in out, err


async def test_prune_says_why_each_row_it_kept_stayed(store, db_url, fake_url):
    await execute(
        db_url,
        "INSERT INTO video_jobs (job_id, state, finished_at, result_state, result_next_at) "
        "VALUES ('no-fetcher', 'completed', now() - interval '3 days', 'pending', "
        "        now() - interval '3 days'), "
        "       ('fetching', 'completed', now() - interval '3 days', 'pending', now()), "
        "       ('gone-hook', 'failed', now() - interval '3 days', NULL, NULL), "
        "       ('stalled', 'failed', now() - interval '3 days', NULL, NULL), "
        "       ('retrying', 'failed', now() - interval '3 days', NULL, NULL), "
        "       ('done', 'failed', now() - interval '3 days', NULL, NULL)",
        "INSERT INTO vidpoll_consumers (name) VALUES ('hook:app:notify')",
        # a consumer nobody registers any more (its deliveries outlived it)
        "INSERT INTO vidpoll_deliveries (job_id, consumer, next_at) "
        "VALUES ('gone-hook', 'hook:old:gone', now() - interval '3 days'), "
        "       ('stalled', 'hook:app:notify', now() - interval '3 days'), "
        "       ('retrying', 'hook:app:notify', now() + interval '1 minute')",
        "INSERT INTO vidpoll_deliveries (job_id, consumer, state) "
        "VALUES ('done', 'hook:app:notify', 'done')")
    code, out, err = await prune(db_url, fake_url)
    assert code == 0, err
    assert "moved 1 rows" in out  # `done`: its only delivery is done
    assert "kept 5 rows finished before then:" in out, out
    lines = {line.split(" (")[0].strip() for line in out.splitlines() if line.startswith("  ")}
    assert lines == {"1 result_unfetched", "1 result_pending", "1 consumer_gone hook:old:gone",
                     "1 delivery_stalled hook:app:notify",
                     "1 delivery_pending hook:app:notify"}, out
    assert "is a worker with --fetch-results" in out
    assert "`vidpoll deliveries forget hook:old:gone` drops it" in out
    assert set((await store.counts()).values()) == {2, 3}  # 2 completed, 3 failed still there
