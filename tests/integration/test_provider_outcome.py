"""Migration 0014 (issue 19): a provider and a neutral outcome on every job, derived by a
trigger for writers that name none (the seed's own loop, an older worker), backfilled for rows
that ended before, and what the download delivery goes by. Real PostgreSQL, scratch databases.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from vidpoll.outcome_words import (
    backfill_batch,
    backfill_outcomes,
    settle_outcomes,
    write_outcome_words,
)
from vidpoll.providers import registry
from vidpoll.schema import level_of_each, migrate, shipped_migrations

from .test_schema import SEED_DDL

TODAYS_LATEST = 13
"""The latest migration before 0014."""

SUME_ENDINGS = {
    "completed": "succeeded", "succeeded": "succeeded", "success": "succeeded",
    "complete": "succeeded", "failed": "failed", "error": "failed", "errored": "failed",
    "canceled": "canceled", "cancelled": "canceled", "expired": "expired",
    "gave_up": "gave_up", "not_found": "not_found", "melted": "failed",  # a word Sume never sent
}


async def upgrade(url: str, **kwargs: Any) -> list[str]:
    """What `vidpoll migrate` does: the SQL migrations, then the words and the backfill."""
    applied = await migrate(url, **kwargs)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await settle_outcomes(conn)
    return applied


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit connection to a migrated database with every provider's words."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        await settle_outcomes(c)
        yield c


async def rows(conn: psycopg.AsyncConnection[Any], query: str,
               params: Any = None) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params)
    return await cur.fetchall()


async def outcomes(conn: psycopg.AsyncConnection[Any]) -> dict[str, tuple[str, str, Any]]:
    """job_id -> (state, provider, outcome)."""
    return {r[0]: r[1:] for r in await rows(
        conn, "SELECT job_id, state, provider, outcome FROM video_jobs")}


async def deliveries(conn: psycopg.AsyncConnection[Any]) -> set[tuple[Any, ...]]:
    return set(await rows(conn, "SELECT job_id, consumer, state, generation "
                                "FROM vidpoll_deliveries"))


async def seed_ends(conn: psycopg.AsyncConnection[Any], job_id: str, word: str) -> None:
    """The seed's own loop's write of a terminal word (no outcome, no provider)."""
    await conn.execute("UPDATE video_jobs SET state=%s WHERE job_id=%s", (word, job_id))


CONSUMERS = "INSERT INTO vidpoll_consumers (name) VALUES ('download'), ('hook:app:done')"


async def test_a_seed_table_upgrades_and_its_loop_gets_outcomes(empty_db):
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute(SEED_DDL)
        c.execute("INSERT INTO video_jobs (job_id) VALUES ('p1'), ('p2'), ('c1'), ('f1')")
        c.execute("UPDATE video_jobs SET state='completed' WHERE job_id='c1'")
        c.execute("UPDATE video_jobs SET state='failed' WHERE job_id='f1'")
    assert "0014_provider_outcome.sql" in await upgrade(empty_db)
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as conn:
        assert await outcomes(conn) == {
            "p1": ("pending", "sume", None), "p2": ("pending", "sume", None),
            "c1": ("completed", "sume", "succeeded"), "f1": ("failed", "sume", "failed")}
        await conn.execute(CONSUMERS)
        await seed_ends(conn, "p1", "completed")
        await seed_ends(conn, "p2", "failed")
        assert (await outcomes(conn))["p1"] == ("completed", "sume", "succeeded")
        assert (await outcomes(conn))["p2"] == ("failed", "sume", "failed")
        # the BEFORE trigger ran before the AFTER one that queues deliveries: a download for
        # the job that made a video only, a hook for both, nothing for the rows that ended
        # before the upgrade
        assert await deliveries(conn) == {("p1", "download", "pending", 0),
                                          ("p1", "hook:app:done", "pending", 0),
                                          ("p2", "hook:app:done", "pending", 0)}


async def test_a_database_at_todays_latest_gets_its_outcomes_backfilled(empty_db):
    await migrate(empty_db, found=shipped_migrations()[:TODAYS_LATEST])
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as conn:
        await conn.execute(CONSUMERS)
        words = sorted(SUME_ENDINGS)
        await conn.execute("INSERT INTO video_jobs (job_id) SELECT unnest(%s::text[])",
                           ([f"j_{w}" for w in words] + ["j_pending"],))
        for word in words:
            await seed_ends(conn, f"j_{word}", word)
        await conn.execute("INSERT INTO video_intents (idempotency_key, payload) "
                           "VALUES ('i1', '{}')")
        before = await deliveries(conn)
        assert ("j_completed", "download", "pending", 0) in before
        assert await rows(conn, "SELECT to_regclass('vidpoll_outcome_words')") == [(None,)]

    assert (await upgrade(empty_db))[0] == "0014_provider_outcome.sql"
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as conn:
        found = await outcomes(conn)
        assert found == {**{f"j_{w}": (w, "sume", o) for w, o in SUME_ENDINGS.items()},
                         "j_pending": ("pending", "sume", None)}
        assert await deliveries(conn) == before  # the backfill changes no state: none queued
        assert await rows(conn, "SELECT provider FROM video_intents") == [("sume",)]
        recorded = await rows(conn, "SELECT oldest_code FROM vidpoll_schema_migrations "
                                    "WHERE version = 14")
        # expand: code of today's level keeps working beside it
        assert recorded == [(level_of_each(shipped_migrations())[TODAYS_LATEST],)]
        assert await rows(conn, "SELECT convalidated FROM pg_constraint "
                                "WHERE conname = 'video_jobs_outcome_check'") == [(True,)]


async def test_the_outcome_follows_the_state_unless_a_writer_names_it(conn):
    await conn.execute("INSERT INTO video_jobs (job_id) VALUES ('a'), ('b'), ('c'), ('d')")
    # ends, then is resumed: pending again, no outcome
    await seed_ends(conn, "a", "completed")
    await conn.execute("UPDATE video_jobs SET state = 'pending' WHERE job_id = 'a'")
    # a writer that names the outcome keeps it, even for a word no provider lists
    await conn.execute("UPDATE video_jobs SET state = 'melted', outcome = 'canceled' "
                       "WHERE job_id = 'b'")
    # a word no provider lists, no outcome named: it ended without a video
    await seed_ends(conn, "c", "melted")
    # an operator's change of one ending for another: the outcome follows the new word
    await seed_ends(conn, "d", "failed")
    await seed_ends(conn, "d", "succeeded")
    await conn.execute(
        "INSERT INTO video_jobs (job_id, state, outcome) VALUES "
        "('e', 'melted', 'expired'),"  # named on insert: kept
        "('f', 'Cancelled', NULL),"    # a word written as it came: looked up lower-cased
        "('g', 'pending', 'succeeded'),"  # pending: none
        "('h', 'gave_up', 'failed')")  # vidpoll's own ending is its own outcome
    assert {k: v[2] for k, v in (await outcomes(conn)).items()} == {
        "a": None, "b": "canceled", "c": "failed", "d": "succeeded",
        "e": "expired", "f": "canceled", "g": None, "h": "gave_up"}
    with pytest.raises(psycopg.errors.CheckViolation):
        await conn.execute("UPDATE video_jobs SET outcome = 'won' WHERE job_id = 'c'")


@dataclass(frozen=True)
class ToyRules:
    words: dict[str, str] = field(default_factory=lambda: {"done": "succeeded",
                                                           "oops": "failed"})


@dataclass(frozen=True)
class ToyProvider:
    name: str = "toy_outcome"
    rules: ToyRules = field(default_factory=ToyRules)


async def test_a_provider_whose_words_are_not_written_yet_gets_them_at_the_next_migrate(conn):
    await conn.execute(CONSUMERS)
    await conn.execute("INSERT INTO video_jobs (job_id, provider) VALUES ('t1', 'toy_outcome'), "
                       "('t2', 'toy_outcome')")
    await seed_ends(conn, "t1", "done")
    await seed_ends(conn, "t2", "oops")
    # unknown yet, not "failed": the download is queued, the downloader looks at the job
    assert {k: v[2] for k, v in (await outcomes(conn)).items()} == {"t1": None, "t2": None}
    assert ("t1", "download", "pending", 0) in await deliveries(conn)
    registry.register(ToyProvider())  # type: ignore[arg-type]
    try:
        assert await write_outcome_words(conn) == 2
        assert await write_outcome_words(conn) == 0  # again: nothing changes
        assert await backfill_outcomes(conn) == 2
    finally:
        registry.unregister("toy_outcome")
    assert {k: v[2] for k, v in (await outcomes(conn)).items()} == {"t1": "succeeded",
                                                                    "t2": "failed"}


async def test_a_backfill_cut_off_after_one_batch_is_finished_by_the_next(conn):
    await conn.execute("INSERT INTO video_jobs (job_id) SELECT 'k' || g "
                       "FROM generate_series(1, 9) g")
    await conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id <> 'k5'")
    # as `migrate` leaves a database between the SQL and the words (killed there, or rows
    # that ended before 0014): no words, no outcomes
    await conn.execute("DELETE FROM vidpoll_outcome_words")
    await conn.execute("ALTER TABLE video_jobs DISABLE TRIGGER vidpoll_jobs_outcome_changed")
    await conn.execute("UPDATE video_jobs SET outcome = NULL")
    await conn.execute("ALTER TABLE video_jobs ENABLE TRIGGER vidpoll_jobs_outcome_changed")
    unfilled = "SELECT count(*) FROM video_jobs WHERE outcome IS NULL AND state <> 'pending'"
    assert await rows(conn, unfilled) == [(8,)]
    assert await backfill_outcomes(conn, batch=2) == 0  # no words: nothing is guessed
    await write_outcome_words(conn)
    last, filled = await backfill_batch(conn, None, rows=2)  # then the run is killed
    assert (last, filled) == ("k2", 2)
    assert await rows(conn, unfilled) == [(6,)]
    assert await backfill_outcomes(conn, batch=2) == 6  # the next run
    assert await rows(conn, unfilled) == [(0,)]
    assert await rows(conn, "SELECT DISTINCT outcome FROM video_jobs WHERE state <> 'pending'"
                      ) == [("succeeded",)]
    assert await backfill_outcomes(conn, batch=2) == 0


async def test_a_backfill_waits_for_a_row_another_transaction_holds(conn, db_url):
    await conn.execute("INSERT INTO video_jobs (job_id) VALUES ('r1'), ('r2')")
    await conn.execute("UPDATE video_jobs SET state = 'expired'")
    await conn.execute("ALTER TABLE video_jobs DISABLE TRIGGER vidpoll_jobs_outcome_changed")
    await conn.execute("UPDATE video_jobs SET outcome = NULL")
    await conn.execute("ALTER TABLE video_jobs ENABLE TRIGGER vidpoll_jobs_outcome_changed")
    async with await psycopg.AsyncConnection.connect(db_url) as holder:
        await holder.execute("SELECT 1 FROM video_jobs WHERE job_id = 'r2' FOR UPDATE")
        backfill = asyncio.create_task(backfill_outcomes(conn))
        await asyncio.sleep(0.7)  # past one lock_timeout: rolled back, waiting to try again
        assert not backfill.done()
        await holder.rollback()
    assert await asyncio.wait_for(backfill, 10) == 2
    assert {v[2] for v in (await outcomes(conn)).values()} == {"expired"}
