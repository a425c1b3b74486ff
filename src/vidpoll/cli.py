"""The `vidpoll` command: wiring only; every behaviour lives in the modules it calls."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import fields
from datetime import datetime
from typing import Any, TypeVar

import click

from vidpoll.config import DEFAULT_LEASE_MARGIN_S, Settings
from vidpoll.embedded import resolve_database_url
from vidpoll.errors import ConfigError, DatabaseUnavailable, SchemaError, VidpollError
from vidpoll.fake_sume import FakeConfig, FakeSume, start_fake
from vidpoll.models import ClaimMode
from vidpoll.store import PgStore, migrate
from vidpoll.sume import SumeClient
from vidpoll.worker import Worker, WorkerConfig

T = TypeVar("T")
EXIT_CODES: dict[type[VidpollError], int] = {ConfigError: 2, DatabaseUnavailable: 3,
                                             SchemaError: 4}


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; turn vidpoll's errors into one clear line and an exit code."""
    try:
        return asyncio.run(coro)
    except VidpollError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(next((c for t, c in EXIT_CODES.items() if isinstance(exc, t)), 1))


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


async def _open_store(settings: Settings, max_size: int = 4) -> PgStore:
    url = resolve_database_url(settings.database_url, settings.home)
    return await PgStore.open(url, max_size=max_size)


def _on_store(use: Callable[[PgStore], Awaitable[T]]) -> T:
    """Open the store the environment names, run `use` on it, close it (errors → exit codes)."""
    settings = _settings()

    async def go() -> T:
        store = await _open_store(settings)
        try:
            return await use(store)
        finally:
            await store.close()

    return _run(go())


@click.group()
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(log_level: str) -> None:
    """Track paid AI video jobs in one Postgres table and poll them with any number of workers.

    Uses DATABASE_URL, or an embedded PostgreSQL under VIDPOLL_HOME when it is unset.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # aiohttp's access log is noise; the pool's reconnect warnings repeat what the worker's
    # own "database unavailable ... reachable again" lines say once.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


@main.command("migrate")
def migrate_cmd() -> None:
    """Create or upgrade the schema (idempotent; safe to run concurrently)."""
    settings = _settings()

    async def go() -> list[str]:
        url = resolve_database_url(settings.database_url, settings.home)
        return await migrate(url)

    applied = _run(go())
    click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")


@main.command("worker")
@click.option("--concurrency", default=50, show_default=True, type=click.IntRange(1, 10_000),
              help="Status reads in flight at once.")
@click.option("--claim", "claim_mode", default="lease", show_default=True,
              type=click.Choice(["lease", "lock"]),
              help="lease: commit the claim and fence writes (no transaction during HTTP); "
                   "lock: hold row locks during the read, as the seed's loop does.")
@click.option("--drain", is_flag=True, help="Exit 0 once no row is pending.")
@click.option("--no-listen", is_flag=True, help="Do not LISTEN (for transaction poolers).")
@click.option("--batch-size", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--lease-seconds", type=click.FloatRange(1, 3600),
              help="Lease length; default: HTTP timeout + 10 s.")
@click.option("--db-connections", default=4, show_default=True, type=click.IntRange(2, 100))
def worker_cmd(concurrency: int, claim_mode: str, drain: bool, no_listen: bool,
               batch_size: int, lease_seconds: float | None, db_connections: int) -> None:
    """Poll due jobs until stopped (SIGTERM/SIGINT finish in-flight reads, then exit 0)."""
    settings = _settings()
    try:
        api_key = settings.require_api_key()
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    config = WorkerConfig(
        concurrency=concurrency, claim_mode=ClaimMode(claim_mode),
        lease_s=lease_seconds or settings.http_timeout_s + DEFAULT_LEASE_MARGIN_S,
        batch_size=batch_size, lock_lanes=db_connections - 1, drain=drain,
        listen=not no_listen, policy=settings.policy)

    async def go() -> None:
        store = await _open_store(settings, db_connections)
        try:
            async with SumeClient(settings.sume_base_url, api_key,
                                  timeout_s=settings.http_timeout_s,
                                  max_connections=concurrency) as client:
                worker = Worker(store, client, config)
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, worker.stop)
                await worker.run()
        finally:
            await store.close()

    _run(go())


@main.command("fake-sume")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8900, show_default=True, type=int)
@click.option("--api-key", default="sk-fake", show_default=True,
              help="Key the fake accepts ('' accepts any).")
@click.option("--latency-ms", default=0.0, type=float, show_default=True)
@click.option("--latency-jitter", default=0.0, type=float, show_default=True,
              help="Fraction: 0.3 means latency ± 30%.")
@click.option("--render-seconds", default=2.0, type=float, show_default=True)
@click.option("--next-poll-after", default=1.0, type=float, show_default=True)
@click.option("--fail-5xx", default=0.0, type=float, help="Share of reads answered 500.")
@click.option("--rate-429", default=0.0, type=float, help="Share answered 429 + Retry-After.")
@click.option("--unavailable-503", default=0.0, type=float)
@click.option("--hang", default=0.0, type=float, help="Share of reads that hang --hang-seconds.")
@click.option("--hang-seconds", default=30.0, type=float)
@click.option("--malformed", default=0.0, type=float, help="Share of 200s with a bad body.")
@click.option("--html", default=0.0, type=float, help="Share of 200s with an HTML body.")
@click.option("--not-found-for", default=0.0, type=float,
              help="Seconds a new job answers 404.")
@click.option("--uppercase", is_flag=True, help="Send statuses in upper case.")
@click.option("--auto-create", is_flag=True, help="Treat unknown job ids as new jobs.")
@click.option("--terminal-mix", default="completed=1",
              help="e.g. completed=0.8,failed=0.1,canceled=0.05,expired=0.05")
@click.option("--seed", type=int)
def fake_sume_cmd(host: str, port: int, api_key: str, latency_ms: float, **opts: Any) -> None:
    """Run the bundled fake Sume (tests, demo, benchmarks)."""
    mix: dict[str, float] = {}
    for part in str(opts.pop("terminal_mix")).split(","):
        name, _, weight = part.partition("=")
        try:
            mix[name.strip().lower()] = float(weight)
        except ValueError:
            raise click.BadParameter(f"bad weight in {part!r}",
                                     param_hint="--terminal-mix") from None
    known = {f.name for f in fields(FakeConfig)}
    cfg = FakeConfig(api_key=api_key or None, latency_s=latency_ms / 1000, terminal_mix=mix,
                     **{k: v for k, v in _fake_opts(opts).items() if k in known})

    async def go() -> None:
        runner, url = await start_fake(FakeSume(cfg), host, port)
        click.echo(f"fake Sume listening on {url}", err=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(go())


def _fake_opts(opts: dict[str, Any]) -> dict[str, Any]:
    renames = {"render_seconds": "render_s", "next_poll_after": "next_poll_after_s",
               "hang_seconds": "hang_s", "not_found_for": "not_found_for_s"}
    return {renames.get(k, k): v for k, v in opts.items()}


@main.group("jobs")
def jobs() -> None:
    """Inspect and change tracked jobs."""


@jobs.command("add")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--delay", default=15.0, show_default=True, type=float,
              help="Seconds until the first read.")
def jobs_add(job_ids: tuple[str, ...], delay: float) -> None:
    """Track job ids Sume already returned (never POSTs anything)."""

    async def add_all(store: PgStore) -> int:
        return sum([await store.add_job(j, delay) for j in job_ids])

    added = _on_store(add_all)
    click.echo(f"added {added}, already tracked {len(job_ids) - added}")


@jobs.command("resume")
@click.argument("job_id")
def jobs_resume(job_id: str) -> None:
    """Put a gave_up or not_found job back to polling now."""
    if not _on_store(lambda store: store.resume(job_id)):
        click.echo(f"error: no job {job_id!r} in a resumable state "
                   "(pending, gave_up, not_found)", err=True)
        sys.exit(1)
    click.echo(f"{job_id}: pending, due now")


@jobs.command("show")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    """Print one job's row as JSON."""
    row = _on_store(lambda store: store.get_job(job_id))
    if row is None:
        click.echo(f"error: no job {job_id!r}", err=True)
        sys.exit(1)
    click.echo(json.dumps(row, default=_json_default, indent=2, sort_keys=True))


@jobs.command("stats")
@click.option("--json", "as_json", is_flag=True)
def jobs_stats(as_json: bool) -> None:
    """Counts by state and the due backlog."""

    async def collect(store: PgStore) -> dict[str, Any]:
        due, late = await store.backlog()
        return {"states": await store.counts(), "due_now": due, "oldest_late_s": late}

    stats = _on_store(collect)
    if as_json:
        click.echo(json.dumps(stats))
        return
    for state, n in stats["states"].items():
        click.echo(f"{state:>12} {n}")
    click.echo(f"due now: {stats['due_now']}, oldest late by {stats['oldest_late_s']:.1f}s")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


@main.command("demo")
@click.option("--jobs", "n_jobs", default=40, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 16))
def demo_cmd(n_jobs: int, workers: int) -> None:
    """Embedded Postgres + fake Sume: submit jobs, poll them to the end, show it live."""
    from vidpoll.demo import run_demo

    _run(run_demo(_settings(), n_jobs, workers))


if __name__ == "__main__":
    main()
