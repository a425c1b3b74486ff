"""What an unauthenticated caller, or time, costs the webhook endpoint: refused deliveries
are counted by reason and logged at a sampled rate, and `vidpoll serve` deletes webhook events
older than the retention itself. Real aiohttp app on loopback, real PostgreSQL."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import aiohttp
import psycopg
import pytest
from psycopg import sql

from vidpoll import metrics
from vidpoll.providers.sume.webhooks import sign
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server
from vidpoll.webhook import MAX_BODY_BYTES

SECRET = "whsec-flood"


def rejected(reason: str) -> float:
    """vidpoll_webhooks_rejected_total{reason} now (0 if it was never exported)."""
    value = metrics.REGISTRY.get_sample_value("vidpoll_webhooks_rejected_total",
                                              {"reason": reason})
    return value or 0.0


async def insert_events(db_url: str, rows: list[tuple[str, float]]) -> None:
    """Webhook events received `age_s` seconds ago, as (event_id, age_s)."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO vidpoll_webhook_events (event_id, job_id, effect, signature, "
            "received_at) SELECT e, 'vid', 'unknown', 'v1=' || e, "
            "now() - make_interval(secs => a) FROM unnest(%s::text[], %s::float8[]) AS t(e, a)",
            ([e for e, _ in rows], [a for _, a in rows]))


async def event_ids(db_url: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT event_id FROM vidpoll_webhook_events")
        return {r[0] for r in await cur.fetchall()}


async def test_refused_deliveries_are_counted_and_logged_a_few_times(store, db_url, caplog):
    caplog.set_level(logging.INFO, logger="vidpoll")
    await store.add_job("vid_1", delay_s=3600)
    before = {r: rejected(r) for r in ("unsigned", "signature", "timestamp", "malformed",
                                       "too_large")}
    runner, url = await start_server(make_app(store, SECRET), "127.0.0.1", 0)
    body = json.dumps({"job_id": "vid_1"}).encode()
    stamp = f"{time.time():.0f}"
    statuses: list[int] = []
    try:
        async with aiohttp.ClientSession() as http:
            async def send(data: bytes, **headers: str) -> None:
                async with http.post(f"{url}/webhooks/sume", data=data,
                                     headers=headers) as resp:
                    statuses.append(resp.status)

            for i in range(200):  # no credentials at all
                await send(body, **{"X-Sume-Event-Id": f"evt_{i}"})
            for i in range(50):  # a guessed signature
                await send(body, **{"X-Sume-Timestamp": stamp, "X-Sume-Event-Id": f"f{i}",
                                    "X-Sume-Signature": f"v1={i:064x}"})
            old = f"{time.time() - 3600:.0f}"  # a captured delivery, too late
            await send(body, **{"X-Sume-Timestamp": old, "X-Sume-Event-Id": "late",
                                "X-Sume-Signature": sign(SECRET, old, body)})
            await send(body, **{"X-Sume-Timestamp": stamp,  # signed, but no event id
                                "X-Sume-Signature": sign(SECRET, stamp, body)})
            await send(b"{" * (MAX_BODY_BYTES + 1))
    finally:
        await runner.cleanup()
    assert statuses == [401] * 251 + [400, 413]
    assert {r: rejected(r) - n for r, n in before.items()} == {
        "unsigned": 200, "signature": 50, "timestamp": 1, "malformed": 1, "too_large": 1}
    lines = [r.getMessage() for r in caplog.records
             if r.name.startswith("vidpoll.web") and r.levelno >= logging.WARNING]
    # one line per reason (at most one a minute each), not one per request
    assert len(lines) == 5, lines
    assert sum("(unsigned)" in line for line in lines) == 1
    assert all("webhook refused" in line and "whsec" not in line for line in lines)
    assert await event_ids(db_url) == set()  # no row for anything refused
    job = await store.get_job("vid_1")
    assert job is not None and job["poked_at"] is None


async def test_serve_deletes_webhook_events_past_the_retention(store, db_url):
    from vidpoll.web.webhooks import WEBHOOK_PRUNER

    # the default retention with a 300 s tolerance: the replay window (600 s) plus an hour;
    # 12,000 old ones span three of the prune's windows
    old = [(f"old_{i:05d}", 7200.0) for i in range(12_000)]
    await insert_events(db_url, [*old, ("just_past", 4300.0), ("in_margin", 4100.0),
                                 ("in_window", 500.0), ("new", 0.0)])
    app = make_app(store, SECRET, webhook_prune_every_s=0.05)
    runner, _ = await start_server(app, "127.0.0.1", 0)
    try:
        pruner = app[WEBHOOK_PRUNER]
        await pruner.signals.wait_for(lambda: pruner.passes >= 1, 30)
        assert await event_ids(db_url) == {"in_margin", "in_window", "new"}
        # on a timer, not only at start: a row that is old by now goes at the next pass
        await insert_events(db_url, [("later", 9000.0)])
        passes = pruner.passes
        await pruner.signals.wait_for(lambda: pruner.passes >= passes + 2, 30)
        assert await event_ids(db_url) == {"in_margin", "in_window", "new"}
        assert pruner.deleted == 12_002
    finally:
        await runner.cleanup()


async def test_no_pruning_when_off_or_without_a_secret(store, db_url):
    from vidpoll.web.webhooks import WEBHOOK_PRUNER

    await insert_events(db_url, [("old", 7200.0)])
    for app in (make_app(store, SECRET, webhook_events_retention_s=float("inf")),
                make_app(store, None)):
        runner, _ = await start_server(app, "127.0.0.1", 0)
        await runner.cleanup()
        assert WEBHOOK_PRUNER not in app
    assert await event_ids(db_url) == {"old"}


@pytest.fixture
def no_delete_role(db_url: str) -> Iterator[str]:
    """A role like docs/SECURITY.md's worker: rows read and written, nothing deleted."""
    name = f"vp_nodelete_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        admin.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public "
                              "TO {}").format(sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(db_url, user=name)
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
async def no_delete_store(no_delete_role: str) -> AsyncIterator[PgStore]:
    s = await PgStore.open(no_delete_role, max_size=2)
    yield s
    await s.close()


async def test_a_role_that_may_not_delete_leaves_events_to_jobs_prune(
        no_delete_store, db_url, caplog):
    from vidpoll.web.webhooks import WEBHOOK_PRUNER

    caplog.set_level(logging.INFO, logger="vidpoll")
    await insert_events(db_url, [("old", 7200.0)])
    app = make_app(no_delete_store, SECRET)
    runner, _ = await start_server(app, "127.0.0.1", 0)
    try:
        pruner = app[WEBHOOK_PRUNER]
        await pruner.signals.wait_for(lambda: pruner.allowed is not None, 30)
    finally:
        await runner.cleanup()
    assert pruner.allowed is False and pruner.passes == 0
    assert await event_ids(db_url) == {"old"}
    said = [r for r in caplog.records if "may not delete webhook events" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
