"""`vidpoll deliveries`: downloads and completion hooks, what is pending and what failed."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from vidpoll.cli._common import _cell, _json_default, _on_store, _stderr

if TYPE_CHECKING:
    from vidpoll.store import PgStore


@click.group("deliveries")
def deliveries() -> None:
    """Downloads and completion hooks: what is pending, what failed and why."""


@deliveries.command("list")
@click.option("--consumer", help="Only this consumer (download, hook:module:function).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
def deliveries_list(consumer: str | None, limit: int, as_json: bool) -> None:
    """Counts per consumer, then the failed and retrying deliveries with their last error."""

    async def collect(store: PgStore) -> dict[str, Any]:
        return {"consumers": await store.delivery_counts(),
                "problems": await store.failed_deliveries(consumer, limit)}

    shown = _on_store(collect)
    if as_json:
        click.echo(json.dumps(shown, default=_json_default))
        return
    if not shown["consumers"]:
        click.echo("no consumer registered (start a worker with --on-terminal or "
                   "--download-dir)")
    for c in shown["consumers"]:
        oldest = c["oldest_pending"]
        click.echo(f"{_cell(c['consumer'])}: {c['pending']} pending ({c['retrying']} retrying), "
                   f"{c['done']} done, {c['failed']} failed"
                   + (f"; oldest pending since {oldest:%Y-%m-%d %H:%M:%S}" if oldest else ""))
    for d in shown["problems"]:
        # job ids, hook names and errors come from outside: one line each, nothing that moves
        # the cursor (`logs.printable`, through _cell)
        click.echo(f"  {_cell(d['job_id'])} {_cell(d['consumer'])} {_cell(d['state'])} after "
                   f"{d['attempts']} tries: {_cell(d['last_error'])}")


@deliveries.command("retry")
@click.option("--consumer", help="Only this consumer.")
@click.option("--job", "job_id", help="Only this job.")
def deliveries_retry(consumer: str | None, job_id: str | None) -> None:
    """Make failed (and backing-off) deliveries due now, with their tries reset."""
    rows = _on_store(lambda store: store.retry_deliveries(consumer, job_id))
    click.echo(f"{len(rows)} deliveries due again")


@deliveries.command("forget")
@click.argument("consumer")
def deliveries_forget(consumer: str) -> None:
    """Unregister a consumer (a hook that no longer exists): jobs that end from now on get no
    delivery for it, and its undone deliveries are removed (done ones stay)."""
    gone, dropped = _on_store(lambda store: store.forget_consumer(consumer))
    if not gone:
        _stderr(f"error: no consumer {consumer!r} (see `vidpoll deliveries list`)")
        sys.exit(1)
    click.echo(f"forgot {consumer}; removed {dropped} undone deliveries")
