"""Every provider's terminal words in the database, and the outcome of rows that ended before.

Migration 0014 gives `video_jobs` a neutral `outcome`, which a trigger derives from
`(provider, state)` for writers that name none (the seed's own loop, an older worker) by
looking the word up in `vidpoll_outcome_words`. The words are each provider's `rules.words`:
Python knows them, the SQL names none. So `migrate`, once the SQL migrations ran, writes them
(`write_outcome_words`) and then fills in the outcome of finished rows that have none
(`backfill_outcomes`: rows that ended before 0014, or while no word was written yet), in
batches of keys, a short transaction each, skipping rows already done: a run killed half way
is finished by the next. `settle_outcomes` does both, in that order; all three are safe to
run again and beside live traffic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import psycopg

from vidpoll.errors import SchemaError
from vidpoll.providers import registry
from vidpoll.sql import QUERIES

log = logging.getLogger(__name__)

__all__ = ["BATCH_ROWS", "backfill_batch", "backfill_outcomes", "settle_outcomes",
           "write_outcome_words"]

BATCH_ROWS = 5000
"""Job ids per backfill transaction (as the migrations' batched steps)."""
LOCK_TIMEOUT = "500ms"
"""How long a batch waits for a row another transaction holds before it is rolled back and
tried again after a backoff, as the migrations' steps do: meanwhile the rows it already
updated stay locked, and a writer of one of them would wait with it."""
LOCK_PATIENCE_S = 300.0
"""How long a batch keeps trying before migrate stops with an error (run it again later)."""
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.1, 2.0


async def write_outcome_words(conn: psycopg.AsyncConnection[Any]) -> int:
    """Upsert every provider's terminal words (`rules.words`) into vidpoll_outcome_words, in
    one transaction; returns how many rows were added or changed. A word a provider no longer
    lists is kept (a worker of an older release may still write it)."""
    rows = [{"provider": name, "word": word.lower(), "outcome": outcome}
            for name in registry.names()
            for word, outcome in sorted(registry.load(name).rules.words.items())]
    changed = 0
    async with conn.transaction(), conn.cursor() as cur:
        for row in rows:
            await cur.execute(QUERIES["upsert_outcome_word"], row)
            changed += max(cur.rowcount, 0)
    # debug, as each applied migration: a first start on the embedded server says one line
    log.debug("outcome words: %d of %d added or changed", changed, len(rows))
    return changed


async def backfill_batch(conn: psycopg.AsyncConnection[Any], after: str | None,
                         rows: int = BATCH_ROWS) -> tuple[str | None, int]:
    """Fill in the outcome of the finished rows among the `rows` job ids after `after` (None:
    from the first), in one transaction; returns (the last id looked at, or None when there
    were none: the end; how many rows it filled in)."""
    async with conn.transaction():
        await conn.execute(QUERIES["set_setting"],
                           {"name": "lock_timeout", "value": LOCK_TIMEOUT, "local": True})
        cur = await conn.execute(QUERIES["outcome_backfill_first_keys" if after is None
                                         else "outcome_backfill_next_keys"],
                                 {"after": after, "rows": rows})
        bounds = await cur.fetchone()
        if bounds is None or not bounds[2]:
            return None, 0
        cur = await conn.execute(QUERIES["outcome_backfill"],
                                 {"first": bounds[0], "last": bounds[1]})
        return bounds[1], max(cur.rowcount, 0)


async def backfill_outcomes(conn: psycopg.AsyncConnection[Any], batch: int = BATCH_ROWS,
                            *, patience_s: float = LOCK_PATIENCE_S) -> int:
    """Fill in the outcome of every finished row that has none, `batch` job ids per
    transaction (see backfill_batch); returns how many rows it filled in. A batch that waits
    too long for a row lock is rolled back and tried again with backoff."""
    cur = await conn.execute(QUERIES["any_outcome_unfilled"])
    row = await cur.fetchone()
    if not (row and row[0]):
        return 0
    after: str | None = None
    batches = filled = 0
    while True:
        deadline = time.monotonic() + patience_s
        delay = _BACKOFF_FIRST_S
        while True:
            try:
                last, changed = await backfill_batch(conn, after, batch)
                break
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
                if time.monotonic() + delay > deadline:
                    raise SchemaError(
                        f"the outcome backfill could not lock its rows for {patience_s:g} s "
                        f"({str(exc).strip().splitlines()[0]}); a long transaction holds "
                        "them: end it and run `vidpoll migrate` again (it resumes)") from exc
                log.info("outcome backfill batch %d: %s; again in %.1f s", batches + 1,
                         str(exc).strip().splitlines()[0], delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
        if last is None:
            break
        after, batches, filled = last, batches + 1, filled + changed
    log.log(logging.INFO if filled else logging.DEBUG,
            "outcome backfill: %d batches, %d rows filled in", batches, filled)
    return filled


async def settle_outcomes(conn: psycopg.AsyncConnection[Any], batch: int = BATCH_ROWS,
                          *, patience_s: float = LOCK_PATIENCE_S) -> bool:
    """What `migrate` runs after the SQL migrations: the words, then the backfill that needs
    them; False, doing nothing, when the schema has no vidpoll_outcome_words yet (migrated
    short of 0014). `conn` is in autocommit mode (each step is its own transaction)."""
    cur = await conn.execute(QUERIES["outcome_words_exist"])
    row = await cur.fetchone()
    if not (row and row[0]):
        return False
    await write_outcome_words(conn)
    await backfill_outcomes(conn, batch, patience_s=patience_s)
    return True
