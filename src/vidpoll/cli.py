"""The `vidpoll` command: wiring only; every behaviour lives in the modules it calls."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import importlib.metadata
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

import vidpoll
from vidpoll import logs
from vidpoll.api import Submission, Vidpoll
from vidpoll.bulk import BadLine, KeyDeriver, parse_param
from vidpoll.config import (
    DEFAULT_LEASE_MARGIN_S,
    Settings,
    check_webhook_retention,
    parse_duration,
)
from vidpoll.deliver import Deliverer, DeliveryConfig, load_hook
from vidpoll.doctor import FAIL, OK, WARN, check_providers, diagnose
from vidpoll.download import Downloader
from vidpoll.embedded import refusal as embedded_refusal
from vidpoll.embedded import resolve_database_url
from vidpoll.embedded import set_notice as set_embedded_notice
from vidpoll.errors import (
    ConfigError,
    DatabaseUnavailable,
    DiskError,
    IntentRejected,
    InvalidIntent,
    InvalidJobId,
    KeyConflict,
    SchemaError,
    VidpollError,
)
from vidpoll.media import media_urls, without_signatures
from vidpoll.models import DOWNLOAD, QUEUED, SUCCESS_STATES, ClaimMode, Intent
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import (
    STATUS_CASES,
    STATUS_SHAPES,
    FakeConfig,
    FakeSume,
    start_fake,
)
from vidpoll.runner import SHUTDOWN_TIMEOUT_S, default_worker_id
from vidpoll.sql import migrations
from vidpoll.store import (
    ORDERS,
    POLLS,
    PRUNE_KEPT_REASONS,
    SUBMITS,
    InvalidCursor,
    PgStore,
    Serves,
    migrate,
)
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import DEFAULT_VACUUM_EVERY_ROWS, Worker, WorkerConfig

T = TypeVar("T")
log = logging.getLogger(__name__)
EXIT_CODES: dict[type[VidpollError], int] = {
    ConfigError: 2, DatabaseUnavailable: 3, SchemaError: 4, IntentRejected: 5,
    InvalidJobId: 6, InvalidIntent: 6, KeyConflict: 6}
"""Exit codes (docs: the command reference):
0 done; 1 failed otherwise (no such job or intent, a doctor check failed); 2 a setting or
usage error (one line, nothing done); 3 PostgreSQL unreachable; 4 schema missing or too old;
5 Sume rejected the submission; 6 bad input (job id, key, payload, cursor); 7 the job ended
without a video; 8 --timeout ran out (the job goes on); 9 Sume refused the configuration
(API key or base URL; the intent is kept, queued); 75 a worker ended a sync hook's thread at
shutdown; 128+N a worker stopped at once by a second signal N (130: Ctrl-C)."""
EXIT_BAD_INPUT = 6
MIN_TOKEN_CHARS = 16
EXIT_NOT_COMPLETED = 7
EXIT_WAIT_TIMEOUT = 8
EXIT_PROVIDER_REFUSED = 9
BULK_BATCH = 200


def _stderr(text: str) -> None:
    """One line on stderr in the log's format (json: an object), redacted: `error: ...`,
    `warning: ...` and `note: ...` keep their level, anything else is info."""
    level, sep, rest = text.partition(": ")
    if not sep or level not in ("error", "warning", "note"):
        level, rest = "info", text
    if logs.json_format():  # a JSON line names its logger: no "vidpoll: " before the text
        rest = rest.removeprefix("vidpoll: ")
    click.echo(logs.say(level, rest, "vidpoll.cli"), err=True)


class _Main(click.Group):
    """The `vidpoll` group: a usage error (a bad flag or value, an unreadable --json file) is
    one line and exit 2, like every setting error, instead of click's usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command line (click's entry point); exit with the command's code."""
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        kwargs["standalone_mode"] = False
        # an error found before `main` runs (an unknown option or command) is said in the
        # format asked for, as every later line is
        argv = kwargs.get("args") or (args[0] if args else None)
        logs.console(_early_format(sys.argv[1:] if argv is None else list(argv)))
        try:
            code = super().main(*args, **kwargs)
        except click.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `vidpoll` alone: the help
                exc.show()
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            _stderr(f"error: {exc.format_message()}{hint}")
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            _stderr("error: aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _early_format(argv: list[str]) -> str:
    """The log format the command line asks for (--log-format before the command, else
    VIDPOLL_LOG_FORMAT), read before click parses it."""
    fmt = os.environ.get("VIDPOLL_LOG_FORMAT", "text")
    at = 0
    while at < len(argv) and argv[at].startswith("-"):
        name, eq, value = argv[at].partition("=")
        if name in ("--log-format", "--log-level") and not eq:
            value, at = (argv[at + 1] if at + 1 < len(argv) else ""), at + 1
        if name == "--log-format":
            fmt = value
        at += 1
    return "json" if fmt == "json" else "text"


def _version() -> str:
    try:
        return importlib.metadata.version("vidpoll")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return str(getattr(vidpoll, "__version__", "unknown"))


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"vidpoll {_version()}")
        ctx.exit()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; turn vidpoll's errors into one clear line and an exit code."""
    async def with_task_dump() -> T:
        with contextlib.suppress(NotImplementedError, AttributeError):  # not on Windows
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, logs.dump_tasks)
        return await coro

    try:
        return asyncio.run(with_task_dump())
    except VidpollError as exc:
        _stderr(f"error: {exc}")
        sys.exit(next((c for t, c in EXIT_CODES.items() if isinstance(exc, t)), 1))
    except LookupError as exc:
        _stderr(f"error: {exc.args[0] if exc.args else exc}")
        sys.exit(1)


def _settings() -> Settings:
    """The environment's settings (exit 2 on a bad one). With DATABASE_URL unset and the
    embedded fallback turned off (VIDPOLL_EMBEDDED=off, `vidpoll --no-embedded`), exit 2 at
    once: before anything is recorded or sent."""
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        _stderr(f"error: {exc}")
        sys.exit(2)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.find_root().params.get("no_embedded"):
        settings = dataclasses.replace(settings, embedded=False)
    if settings.database_url is None and not settings.embedded:
        _stderr(f"error: {embedded_refusal()}")
        sys.exit(2)
    return settings


async def _open_store(settings: Settings, max_size: int = 4,
                      application_name: str = "vidpoll", serves: Serves | None = None
                      ) -> PgStore:
    url = resolve_database_url(settings.database_url, settings.home,
                               embedded=settings.embedded)
    return await PgStore.open(url, max_size=max_size, prepare=settings.prepared_statements,
                              application_name=application_name, serves=serves)


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


@click.group(cls=_Main)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Print vidpoll's version and exit.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, envvar="VIDPOLL_LOG_FORMAT",
              type=click.Choice(["text", "json"]),
              help="One line per event; json: one object per line. Secrets and signed URL "
                   "query strings are redacted either way.")
@click.option("--no-embedded", is_flag=True,
              help="With DATABASE_URL unset, exit 2 instead of using the embedded PostgreSQL "
                   "(as VIDPOLL_EMBEDDED=off does).")
def main(log_level: str, log_format: str, no_embedded: bool) -> None:
    """Track paid AI video jobs in one Postgres table and poll them with any number of workers.

    Uses DATABASE_URL, or an embedded PostgreSQL under VIDPOLL_HOME when it is unset (each
    command that does says so on stderr; VIDPOLL_EMBEDDED=off or --no-embedded refuses it).
    """
    logs.setup(log_level, log_format)
    set_embedded_notice(lambda line: _stderr(line))


@main.command("migrate")
def migrate_cmd() -> None:
    """Create or upgrade the schema (idempotent; safe to run concurrently)."""
    settings = _settings()

    async def go() -> list[str]:
        url = resolve_database_url(settings.database_url, settings.home,
                                   embedded=settings.embedded)
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
@click.option("--drain", is_flag=True,
              help="Exit 0 once no job is pending (and, when submitting, no intent queued).")
@click.option("--no-listen", is_flag=True, help="Do not LISTEN (for transaction poolers).")
@click.option("--batch-size", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--lease-seconds", type=click.FloatRange(1, 3600),
              help="Lease length; default: HTTP timeout + 10 s.")
@click.option("--db-connections", default=4, show_default=True, type=click.IntRange(2, 100),
              help="PostgreSQL connections this process may hold, its one LISTEN connection "
                   "included (the pool gets the rest; lock mode uses all but one of the pool "
                   "for locked batches).")
@click.option("--vacuum-every", default=DEFAULT_VACUUM_EVERY_ROWS, show_default=True,
              type=click.IntRange(0, 100_000_000), metavar="ROWS",
              help="VACUUM video_jobs after this many row versions this worker wrote (two a "
                   "poll), if its role may; 0: leave it to autovacuum.")
@click.option("--poll-only", is_flag=True, help="Only poll jobs; never POST anything.")
@click.option("--submit-only", is_flag=True, help="Only send queued intents; never poll.")
@click.option("--max-active", type=click.IntRange(1, 1_000_000),
              help="Start a render only while fewer jobs are active "
                   "[default: VIDPOLL_MAX_ACTIVE or 50].")
@click.option("--submit-concurrency", default=4, show_default=True,
              type=click.IntRange(1, 1000), help="POSTs in flight at once.")
@click.option("--account", "accounts", multiple=True,
              help="Serve only this account (repeatable) [default: every account with a key: "
                   "SUME_API_KEY, SUME_API_KEY_<NAME>].")
@click.option("--status-rate-per-min", type=click.FloatRange(min=0.001),
              help="Status reads a minute per account, shared by every worker "
                   "[default: VIDPOLL_STATUS_RATE_PER_MIN, else unlimited].")
@click.option("--submit-rate-per-min", type=click.FloatRange(min=0.001),
              help="Creates a minute per account, shared by every worker "
                   "[default: VIDPOLL_SUBMIT_RATE_PER_MIN, else unlimited].")
@click.option("--rate-burst", type=click.FloatRange(min=1),
              help="Tokens a bucket may hold [default: VIDPOLL_RATE_BURST, else two seconds "
                   "of the rate, at least 1].")
@click.option("--fetch-results/--no-fetch-results", default=True, show_default=True,
              help="GET each completed job's result and store it with the job (shares the "
                   "read budget).")
@click.option("--on-terminal", "hook_specs", multiple=True, metavar="MODULE:FUNCTION",
              help="Call this function with each job that ends (after its result and files), "
                   "at least once, retried with backoff. Repeatable.")
@click.option("--download-dir", type=click.Path(file_okay=False, writable=True),
              help="Download each completed job's media here (temp file, fsync, rename; "
                   "resumed after a crash; expired links refreshed).")
@click.option("--hook-timeout", default=300.0, show_default=True,
              type=click.FloatRange(0.1, 86_400), help="Seconds a hook may run per try.")
@click.option("--delivery-concurrency", default=4, show_default=True,
              type=click.IntRange(1, 1000), help="Downloads (and runs of each hook) at once.")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve Prometheus /metrics (and /healthz, /readyz) on this port.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option("--shutdown-timeout", default=SHUTDOWN_TIMEOUT_S, show_default=True,
              type=click.FloatRange(1, 86_400), metavar="SECONDS",
              help="After SIGTERM/SIGINT, exit within this (under your orchestrator's grace "
                   "period: Kubernetes' default is 30 s). Reads, POSTs, downloads and hooks "
                   "that finish in time are recorded; a few seconds before it ends the rest "
                   "are stopped: deliveries handed back to other workers, reads and POSTs "
                   "left to their leases.")
def worker_cmd(concurrency: int, claim_mode: str, drain: bool, no_listen: bool,
               batch_size: int, lease_seconds: float | None, db_connections: int,
               vacuum_every: int, poll_only: bool, submit_only: bool, max_active: int | None,
               submit_concurrency: int, accounts: tuple[str, ...],
               status_rate_per_min: float | None, submit_rate_per_min: float | None,
               rate_burst: float | None, fetch_results: bool, hook_specs: tuple[str, ...],
               download_dir: str | None, hook_timeout: float,
               delivery_concurrency: int, metrics_port: int | None, metrics_host: str,
               shutdown_timeout: float) -> None:
    """Poll due jobs and send queued intents until stopped (SIGTERM/SIGINT finish what is in
    flight, then exit 0)."""
    if poll_only and submit_only:
        raise click.UsageError("--poll-only and --submit-only exclude each other")
    settings = _settings()
    try:
        hooks = {spec: _load_hook(spec) for spec in hook_specs}
        if download_dir is not None:
            Downloader(download_dir).check_directory()
    except (ConfigError, DiskError) as exc:
        _stderr(f"error: {exc}")
        sys.exit(2)
    if (hooks or download_dir) and not fetch_results:
        _stderr("warning: --no-fetch-results: completed jobs' downloads and hooks wait "
                   "until another worker fetches their result")
    settings = dataclasses.replace(
        settings,
        status_rates=_override(settings.status_rates, status_rate_per_min, settings),
        submit_rates=_override(settings.submit_rates, submit_rate_per_min, settings),
        rate_burst=rate_burst or settings.rate_burst)
    served = accounts or tuple(sorted(settings.account_keys)) or ("default",)
    try:
        keys = {a: settings.require_api_key(a) for a in served}
    except ConfigError as exc:
        _stderr(f"error: {exc}")
        sys.exit(2)
    lease_s = lease_seconds or settings.http_timeout_s + DEFAULT_LEASE_MARGIN_S
    worker_id = default_worker_id()
    # every runner of this process shares the store's one LISTEN connection: the pool gets
    # the rest (docs/SCALING.md has the formula)
    pool_size = max(1, db_connections - (0 if no_listen else 1))
    if claim_mode == "lock" and pool_size < 2:
        raise click.UsageError("--claim lock holds a pooled connection per locked batch: it "
                               "needs --db-connections 3 or more (2 with --no-listen)")
    try:
        poll_config = WorkerConfig(
            concurrency=concurrency, claim_mode=ClaimMode(claim_mode), lease_s=lease_s,
            batch_size=batch_size, lock_lanes=pool_size - 1, drain=drain,
            drain_waits_for_intents=not poll_only, listen=not no_listen,
            policy=settings.policy, worker_id=worker_id, accounts=served,
            budgets=settings.budgets("status", served), fetch_results=fetch_results,
            vacuum_every_rows=vacuum_every, read_timeout_s=settings.http_timeout_s,
            shutdown_timeout_s=shutdown_timeout)
    except ConfigError as exc:
        _stderr(f"error: {exc} (--lease-seconds, VIDPOLL_HTTP_TIMEOUT)")
        sys.exit(2)
    submit_config: SubmitterConfig | None = None
    if not poll_only:
        try:
            submit_config = SubmitterConfig(
                concurrency=submit_concurrency,
                max_active=max_active if max_active is not None else settings.max_active,
                lease_s=lease_s, http_timeout_s=settings.http_timeout_s,
                first_poll_s=settings.first_poll_s, drain=drain, listen=not no_listen,
                policy=settings.policy, worker_id=worker_id, accounts=served,
                budgets=settings.budgets("create", served), shutdown_timeout_s=shutdown_timeout)
        except ConfigError as exc:
            _stderr(f"error: {exc} (--lease-seconds, VIDPOLL_HTTP_TIMEOUT)")
            sys.exit(2)

    serves = Serves(("" if submit_only else POLLS) + ("" if poll_only else SUBMITS), served)

    async def go() -> None:
        store = await _open_store(settings, pool_size, f"vidpoll {worker_id}", serves)
        try:
            async with contextlib.AsyncExitStack() as stack:
                if metrics_port is not None:  # first: a port in use stops it before any work
                    from vidpoll.web import metrics_app, start_server

                    server, url = await _listening(
                        start_server(metrics_app(store), metrics_host, metrics_port),
                        metrics_host, metrics_port, "--metrics-port", "--metrics-host")
                    stack.push_async_callback(server.cleanup)
                    log.info("metrics on %s/metrics", url)
                clients = {a: await stack.enter_async_context(SumeClient(
                    settings.sume_base_url, key, timeout_s=settings.http_timeout_s,
                    max_connections=concurrency + submit_concurrency))
                    for a, key in keys.items()}
                parts: list[Worker | Submitter] = []
                if not submit_only:
                    parts.append(Worker(store, clients, poll_config))
                if submit_config is not None:
                    parts.append(Submitter(store, clients, submit_config))
                deliverer = None
                if hooks or download_dir is not None:
                    downloader = None
                    if download_dir is not None:
                        downloader = await stack.enter_async_context(Downloader.from_settings(
                            download_dir, settings, max_connections=delivery_concurrency))
                    deliverer = Deliverer(store, DeliveryConfig(
                        hooks=hooks, concurrency=delivery_concurrency,
                        hook_timeout_s=hook_timeout, lease_s=lease_s, drain=drain,
                        listen=not no_listen, shutdown_timeout_s=shutdown_timeout,
                        policy=settings.policy, worker_id=worker_id), downloader)
                loop = asyncio.get_running_loop()
                runners: list[Worker | Submitter | Deliverer] = [*parts]
                if deliverer is not None:
                    runners.append(deliverer)
                stopping = _Stopping(runners, ClaimMode(claim_mode), lease_s)
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, stopping.signalled, sig)

                async def produce() -> None:
                    await asyncio.gather(*(p.run() for p in parts))
                    if deliverer is not None:
                        deliverer.producers_finished()

                await asyncio.gather(produce(), *([deliverer.run()] if deliverer else []))
        finally:
            await store.close()

    _run(go())


def _load_hook(spec: str) -> Any:
    """load_hook, with an error raised while importing the user's module as one line too."""
    try:
        return load_hook(spec)
    except ConfigError:
        raise
    except Exception as exc:
        module = spec.partition(":")[0]
        raise ConfigError(f"importing {module!r} for --on-terminal raised "
                          f"{type(exc).__name__}: {exc} (`python -c 'import {module}'` shows "
                          "where)") from None


class _Stopping:
    """A worker process's SIGTERM/SIGINT: the first stops claiming and lets work in flight
    finish within --shutdown-timeout; a second one stops the process at once, saying what
    is left to the leases (exit 128 + the signal: 130 for a second Ctrl-C)."""

    def __init__(self, runners: list[Worker | Submitter | Deliverer], mode: ClaimMode,
                 lease_s: float) -> None:
        self.runners = runners
        self.mode = mode
        self.lease_s = lease_s
        self.asked = False

    def signalled(self, sig: int) -> None:
        if not self.asked:
            self.asked = True
            log.info("stopping: what is in flight may finish (--shutdown-timeout); a second "
                     "signal stops at once, leaving it to its leases")
            for r in self.runners:
                r.stop()
            return
        log.warning("%s", self.left())
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        sys.stderr.flush()
        os._exit(128 + sig)  # at once: nothing may wait, not even a hung statement

    def left(self) -> str:
        """What a stop at once leaves to the leases, as one line."""
        reads = posts = deliveries = 0
        for r in self.runners:
            if isinstance(r, Worker):
                # claimed and not read yet (prefetched) holds a lease like a read in flight
                reads += r.in_flight() + len(getattr(r, "_ready", ()))
            elif isinstance(r, Submitter):
                posts += r.in_flight()
            else:
                deliveries += r.in_flight()
        said = "stopped at once (second signal)"
        if self.mode is ClaimMode.LOCK and reads:
            # lock mode holds row locks, not leases: they end with the connection
            said += (f": {_n(reads, 'read')} in flight released with this process's row "
                     "locks, due again now")
            reads = 0
        leased = [_n(reads, "read"), _n(posts, "POST") + " (sent again with the same key)",
                  _n(deliveries, "delivery", "deliveries")]
        leased = [what for what, n in zip(leased, (reads, posts, deliveries), strict=True) if n]
        if leased:
            said += (f"; left to their leases: {', '.join(leased)}; each is due again when "
                     f"its lease ends (within {self.lease_s:g}s)")
        elif said.endswith("(second signal)"):
            said += ": nothing was in flight"
        return said.replace("(second signal); ", "(second signal): ", 1)


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


async def _listening(start: Awaitable[T], host: str, port: int, flag: str,
                     host_flag: str = "--host") -> T:
    """Await a server's start; a port or host that cannot be had is a setting to fix (exit 2):
    the line names the flag to change (`flag` for the port, `host_flag` for the host)."""
    try:
        return await start
    except OSError as exc:
        number = exc.errno or 0
        if isinstance(exc, socket.gaierror) or number == errno.EADDRNOTAVAIL:
            why = ("is not an address of this machine" if number == errno.EADDRNOTAVAIL
                   else "is not a name or address this machine can resolve")
            raise ConfigError(f"{host} {why}; choose another with {host_flag}") from None
        why = {errno.EADDRINUSE: "is already in use (another vidpoll serve, fake-sume or "
                                 "worker --metrics-port?)",
               errno.EACCES: "needs privileges this user lacks (a port below 1024?)"}.get(
                   number, f"cannot be listened on ({exc.strerror or type(exc).__name__})")
        raise ConfigError(f"{host}:{port} {why}; choose another with {flag}") from None


def _override(rates: Mapping[str, float], per_min: float | None,
              settings: Settings) -> Mapping[str, float]:
    """A flag's rate applies to every account (it overrides the environment's)."""
    if per_min is None:
        return rates
    return {a: per_min for a in {"default", *settings.account_keys}}


@main.command("fake-sume")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8900, show_default=True, type=click.IntRange(0, 65535))
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
@click.option("--status-shape", type=click.Choice(list(STATUS_SHAPES)), default="seed",
              show_default=True,
              help="seed: {terminal, sume_status, ...}; the others: the CLI's envelope, the "
                   "word under that field, no terminal flag.")
@click.option("--status-case", type=click.Choice(list(STATUS_CASES)), default="as_is",
              show_default=True, help="Letter case of status words (random: per read).")
@click.option("--auto-create", is_flag=True, help="Treat unknown job ids as new jobs.")
@click.option("--terminal-mix", default="completed=1",
              help="e.g. completed=0.8,failed=0.1,canceled=0.05,expired=0.05")
@click.option("--create-lose-reply", default=0.0, type=float,
              help="Share of creates billed, then never answered (lost reply).")
@click.option("--create-5xx-billed", default=0.0, type=float,
              help="Share of creates billed, then answered 500.")
@click.option("--create-fail-5xx", default=0.0, type=float,
              help="Share of creates answered 500 before billing.")
@click.option("--create-rate-429", default=0.0, type=float, help="Share of creates answered 429.")
@click.option("--credits", type=int, help="Renders the account can pay for; then 402.")
@click.option("--limits-before-key", is_flag=True,
              help="Check credits, limits and the request before the Idempotency-Key lookup "
                   "(a re-send of a billed key then gets 402 while credits are out).")
@click.option("--key-ttl", "key_ttl_s", type=float,
              help="Seconds an Idempotency-Key is remembered (then a re-send bills again).")
@click.option("--create-keeps-running", is_flag=True,
              help="A create goes on (and bills) after its client disconnected.")
@click.option("--create-bill-seconds", "create_bill_s", default=0.0, type=float,
              help="Seconds a create works before it bills.")
@click.option("--max-concurrent", type=int,
              help="Renders that may run at once; then 429 concurrency_limit_exceeded.")
@click.option("--read-rate-per-s", type=float,
              help="Status/result reads per second per key; beyond it 429 + RateLimit-*.")
@click.option("--read-burst", default=1.0, show_default=True, type=float)
@click.option("--create-rate-per-s", type=float, help="Creates per second per key.")
@click.option("--create-burst", default=1.0, show_default=True, type=float)
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
        runner, url = await _listening(start_fake(FakeSume(cfg), host, port), host, port,
                                       "--port")
        _stderr(f"fake Sume listening on {url}")
        await _until_signalled()
        await runner.cleanup()

    _run(go())


async def _until_signalled() -> None:
    """Return on SIGTERM or SIGINT (the servers' way to stop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


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
@click.option("--account", default="default", show_default=True,
              help="The account whose API key reads these jobs.")
def jobs_add(job_ids: tuple[str, ...], delay: float, account: str) -> None:
    """Track job ids Sume already returned (never POSTs anything)."""

    async def add_all(store: PgStore) -> int:
        return sum([await store.add_job(j, delay, account=account) for j in job_ids])

    added = _on_store(add_all)
    click.echo(f"added {added}, already tracked {len(job_ids) - added}")


@jobs.command("resume")
@click.argument("job_id")
def jobs_resume(job_id: str) -> None:
    """Put a gave_up or not_found job back to polling now (a pending one: as poll-now)."""
    async def resume(store: PgStore) -> str | None:
        nonlocal job_id
        job_id = await whole_id(store, job_id)
        return await store.resume(job_id)

    done = _on_store(resume)
    if done is None:
        _stderr(f"error: no job {job_id!r} in a resumable state "
                   "(gave_up, not_found; a pending one is polled now)")
        sys.exit(1)
    shown_id = logs.printable(job_id)
    click.echo({"resumed": f"{shown_id}: pending again with fresh counters, due now",
                "made_due": f"{shown_id}: still pending; made due now (as poll-now)",
                "marked": f"{shown_id}: still pending and being read right now; read again "
                          "as soon as that read is recorded (as poll-now)"}[done])


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Everything as one JSON object.")
def jobs_show(job_id: str, as_json: bool) -> None:
    """One job: its row, the intent that created it, its result (signed links shown without
    their query string), its deliveries and its history. Archived (pruned) jobs too."""

    async def collect(store: PgStore) -> dict[str, Any] | None:
        nonlocal job_id
        job_id = await whole_id(store, job_id)
        row = await store.get_job(job_id)
        archived = row is None
        if row is None:
            row = await store.get_archived_job(job_id)
        if row is None:
            return None
        intent = await store.intent_of_job(job_id)
        # stored results keep their signed links; nothing shown does
        return {**without_signatures(row), "archived": archived,
                "intent": None if intent is None else _intent_dict(intent),
                "history": await store.job_history(job_id),
                "deliveries": without_signatures(await store.job_deliveries(job_id))}

    shown = _on_store(collect)
    if shown is None:
        hint = ("; that id is shortened: `vidpoll jobs list --json` has it whole"
                if "…" in job_id else "")
        _stderr(f"error: no job {job_id!r}{hint}")
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(shown, default=_json_default, indent=2, sort_keys=True))
        return
    console = Console(highlight=False)
    row = Table.grid(padding=(0, 2))
    for name in ("job_id", "state", "provider_status", "account", "created_at", "finished_at",
                 "next_poll_at", "polls", "consecutive_errors", "errors_total",
                 "last_error_class", "last_http_status", "last_error", "last_request_id",
                 "claimed_by", "idempotency_key"):
        if shown.get(name) is not None:
            row.add_row(name, escape(_cell(shown[name])))
    if shown["archived"]:
        row.add_row("archived_at", escape(_cell(shown.get("archived_at"))))
    console.print(Panel(row, title=f"job {_shown(job_id)}", expand=False))
    intent = shown["intent"]
    if intent is not None:
        grid = Table.grid(padding=(0, 2))
        for name in ("key", "state", "account", "priority", "attempts", "created_at",
                     "submitted_at", "error_code", "error_message", "resolution"):
            if intent.get(name) is not None:
                grid.add_row(name, escape(_cell(intent[name])))
        grid.add_row("payload", escape(_compact(intent["payload"])))
        console.print(Panel(grid, title="intent (the submission that started it)",
                            expand=False))
    else:
        console.print("intent: none (tracked with `jobs add`, or sent outside vidpoll)")
    if shown.get("result_state") is not None or shown.get("result") is not None:
        grid = Table.grid(padding=(0, 2))
        grid.add_row("state", escape(_cell(shown.get("result_state"))))
        for name in ("result_fetched_at", "result_attempts", "result_error"):
            if shown.get(name):
                grid.add_row(name.removeprefix("result_"), escape(_cell(shown[name])))
        if shown.get("result") is not None:
            grid.add_row("media links", str(len(media_urls(shown["result"]))))
            grid.add_row("body", escape(_compact(shown["result"], 600)))
        console.print(Panel(grid, title="result (signed links without their query)",
                            expand=False))
    files = [f for d in shown["deliveries"] if d["consumer"] == DOWNLOAD
             and isinstance(d.get("detail"), dict)
             for f in d["detail"].get("files", []) if isinstance(f, dict)]
    if files:
        table = Table(title="downloaded files", title_justify="left")
        for col, justify in (("path", "left"), ("bytes", "right"), ("sha256", "left")):
            table.add_column(col, overflow="fold", justify=justify)  # type: ignore[arg-type]
        for f in files:
            table.add_row(escape(_cell(f.get("path"))), escape(_cell(f.get("size"))),
                          escape(_cell(f.get("sha256")))[:16])
        console.print(table)
    if shown["deliveries"]:
        console.print(_table("deliveries", shown["deliveries"],
                             ("consumer", "state", "attempts", "next_at", "last_error")))
    console.print(_table("history", shown["history"],
                         ("at", "kind", "from_state", "to_state", "error_class",
                          "http_status", "detail")))


def _compact(value: Any, limit: int = 2000) -> str:
    """A JSON value on one line (never a Python repr), cut at `limit` characters."""
    text = logs.printable(json.dumps(value, default=_json_default, ensure_ascii=False,
                                     separators=(", ", ": ")))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _table(title: str, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Table:
    """A rich table of `rows` (dicts) with these columns; values escaped, times shortened."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")  # wrapped, never cut: an id is read whole
    for r in rows:
        table.add_row(*(escape(_cell(r.get(c))) for c in columns))
    return table


def _cell(value: Any) -> str:
    """A value as a person reads it: times to the second, JSON for dicts and lists, numbers
    as numbers (never a Python repr), control characters escaped (`logs.printable`)."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, Decimal):
        return f"{value:f}"
    if isinstance(value, dict | list | tuple):
        return _compact(value, 400)
    return logs.printable(str(value))


def _shown(value: Any) -> str:
    """A value for a rich cell or title: as `_cell` shows it, rich markup escaped."""
    return escape(_cell(value))


@jobs.command("watch")
@click.argument("job_id")
@click.option("--timeout", type=click.FloatRange(0), help="Give up after S seconds (exit 8).")
def jobs_watch(job_id: str, timeout: float | None) -> None:
    """Block until a job is final (LISTEN/NOTIFY, with a re-read every 5 s); print its state.

    Says on stderr, within seconds, when no worker polling the job's account is connected
    (and waits on). Exit 0 if it ended with a video (completed, succeeded, ...), 7 if it
    ended otherwise, 8 on --timeout (the line names the job and its key).
    """
    settings = _settings()

    async def go() -> tuple[str | None, str | None]:
        nonlocal job_id
        async with await Vidpoll.open(settings=settings) as vp:
            job_id = await whole_id(vp.store, job_id)
            try:
                return (await vp.wait(job_id, timeout=timeout,
                                      on_no_worker=_warn_line)).state, None
            except TimeoutError as exc:
                return None, str(exc)

    try:
        final, timed_out = _run(go())
    except KeyboardInterrupt:
        _stderr(f"stopped watching {job_id} (it goes on)")
        sys.exit(128 + signal.SIGINT)
    if final is None:
        _stderr(f"error: {timed_out}")
        sys.exit(EXIT_WAIT_TIMEOUT)
    click.echo(logs.printable(final))  # the provider's word
    if final not in SUCCESS_STATES:
        sys.exit(EXIT_NOT_COMPLETED)


@jobs.command("stats")
@click.option("--minutes", default=10, show_default=True, type=click.IntRange(1, 10_080),
              help="The window for rates and errors.")
@click.option("--json", "as_json", is_flag=True)
def jobs_stats(minutes: int, as_json: bool) -> None:
    """Counts by state, the due backlog and how late it is, polls per second and errors by
    class over the last minutes, stuck claims, deliveries and rate buckets."""

    async def collect(store: PgStore) -> dict[str, Any]:
        due, late = await store.backlog()
        polls: dict[str, int] = {}
        submits: dict[str, int] = {}
        late_sum = late_max = 0.0
        for r in await store.minutes_since(minutes):
            if r["kind"] == "poll":
                polls[r["outcome"]] = polls.get(r["outcome"], 0) + int(r["n"])
                late_sum += r["late_sum_s"]
                late_max = max(late_max, r["late_max_s"])
            elif r["kind"] == "submit":
                submits[r["outcome"]] = submits.get(r["outcome"], 0) + int(r["n"])
        reads = sum(polls.values())
        # the window holds `minutes` whole minutes and the one going on now
        covered_s = minutes * 60 + datetime.now(UTC).second
        return {"states": await store.counts(), "due_now": due, "oldest_late_s": late,
                "window_minutes": minutes, "reads": reads,
                "reads_per_s": round(reads / covered_s, 3),
                "reads_by_outcome": polls, "submissions_by_outcome": submits,
                "mean_lateness_s": round(late_sum / reads, 3) if reads else None,
                "max_lateness_s": round(late_max, 3),
                "stuck_claims": await store.stuck_claims(),
                "deliveries": await store.delivery_counts(),
                "backlog_by_account": await store.backlog_by_account(),
                "rate_buckets": await store.buckets()}

    stats = _on_store(collect)
    if as_json:
        click.echo(json.dumps(stats, default=_json_default))
        return
    for state, n in stats["states"].items():
        click.echo(f"{logs.printable(state):>12} {n}")  # a provider's word, as final states are
    click.echo(f"due now: {stats['due_now']}, oldest late by {stats['oldest_late_s']:.1f}s")
    errors = {k: v for k, v in stats["reads_by_outcome"].items()
              if k not in ("not_ready", "final")}
    click.echo(f"last {minutes} min: {stats['reads']} status reads ({stats['reads_per_s']:g}/s"
               f"), {stats['reads_by_outcome'].get('final', 0)} finished, errors by class: "
               f"{_counts(errors) or 'none'}; lateness mean "
               f"{stats['mean_lateness_s'] or 0:.2f}s, max {stats['max_lateness_s']:.2f}s")
    if stats["submissions_by_outcome"]:
        click.echo(f"last {minutes} min submissions: "
                   f"{_counts(stats['submissions_by_outcome'])}")
    for row in stats["stuck_claims"]:
        click.echo(f"  stuck: {_cell(row['claimed_by'])} holds {row['rows']} rows whose "
                   "lease ended "
                   f"(claimed since {row['since']:%Y-%m-%d %H:%M:%S})")
    for row in stats["backlog_by_account"]:
        click.echo(f"  account {_cell(row['account'])}: {row['due']} due, oldest late by "
                   f"{row['oldest_late_s']:.1f}s")
    for c in stats["deliveries"]:
        click.echo(f"  deliveries {_cell(c['consumer'])}: {c['pending']} pending ({c['waiting']} "
                   f"waiting, {c['retrying']} retrying), {c['failed']} failed")
    for b in stats["rate_buckets"]:
        rate = "unlimited" if b["rate_per_s"] is None else f"{b['rate_per_s'] * 60:g}/min"
        tokens = "" if b["tokens"] is None else f", {b['tokens']:.1f} tokens"
        paused = f", paused {b['paused_s']:.1f}s more" if b["paused_s"] > 0 else ""
        click.echo(f"  budget {_cell(b['account'])}/{b['kind']}: {rate}{tokens}{paused}; "
                   f"{b['server_pauses']} server pauses")


@jobs.command("list")
@click.option("--state", type=click.Choice(["pending", "finished", "completed", "failed",
                                           "canceled", "expired", "gave_up", "not_found"]),
              help="pending, finished, or one final state [default: every row].")
@click.option("--order", type=click.Choice([*ORDERS, "due"]),
              help="newest/oldest first by when each job was created (finished ones: by when "
                   "they finished); due: pending rows soonest due first [default: due with "
                   "--state pending, else newest].")
@click.option("--account", help="Only this account's rows.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--after", "cursor", help="The cursor printed under the previous page.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: rows (full job ids) and next cursor.")
def jobs_list(state: str | None, order: str | None, account: str | None, limit: int,
              cursor: str | None, as_json: bool) -> None:
    """Rows a page at a time, newest first (or --order); ids shortened to fit the terminal
    (--json has them whole). Paging is by cursor (--after), so
    pages never skip or repeat a row."""
    if order is None:
        order = "due" if state == "pending" else "newest"
    if order == "due" and state != "pending":
        raise click.UsageError("--order due lists pending rows: add --state pending")
    store_order = None if order == "due" else order
    try:
        rows, next_cursor = _on_store(lambda store: store.list_jobs(
            state, account, limit, cursor, store_order))
    except InvalidCursor as exc:
        _stderr(f"error: {exc} (use the cursor printed under a page)")
        sys.exit(EXIT_BAD_INPUT)
    if as_json:
        click.echo(json.dumps({"jobs": rows, "next": next_cursor}, default=_json_default))
        return
    console = Console(highlight=False)
    table = Table(title=f"jobs ({state or 'all'}, {_ORDER_WORDS[order]})",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0))  # with the box's divider: two spaces between columns
    pending = state == "pending"
    when = "due" if pending else "finished" if state is not None else "created"
    # widths for 80 columns: 13 + 9 + 12 + 8 + 5 + 4, the last error the rest (14+)
    for name, justify, width in (("job", "left", SHORT_ID_HEAD + 1 + SHORT_ID_TAIL),
                                 ("state", "left", 9), ("account", "left", 12),
                                 (when, "right", 8), ("polls", "right", 5),
                                 ("errs", "right", 4), ("last error", "left", None)):
        table.add_column(name, justify=justify, no_wrap=True,  # type: ignore[arg-type]
                         overflow="ellipsis", min_width=width, max_width=width)
    now = datetime.now(UTC)
    for r in rows:
        at = r["next_poll_at"] if pending else r["finished_at"] if state else r["created_at"]
        errors = f"{r['consecutive_errors']}" if r["consecutive_errors"] else ""
        table.add_row(_shown(short_id(r["job_id"])), _shown(r["state"]), _shown(r["account"]),
                      _since(at, now), str(r["polls"]), errors,
                      _shown(r["last_error_class"]))
    console.print(table)
    if not rows:
        click.echo("no jobs" + (" on this page" if cursor else ""))
    if next_cursor:
        click.echo(f"next page: --after {next_cursor}")


_ORDER_WORDS = {"newest": "newest first", "oldest": "oldest first", "due": "soonest due first"}
SHORT_ID_HEAD, SHORT_ID_TAIL = 8, 4


async def whole_id(store: PgStore, job_id: str) -> str:
    """`job_id`, or the one job id the shortened form `jobs list` prints (`abcdefgh…wxyz`)
    stands for; a LookupError (exit 1) when it stands for none or several."""
    head, sep, tail = job_id.partition("…")
    if not sep or len(head) != SHORT_ID_HEAD or len(tail) != SHORT_ID_TAIL:
        return job_id
    found = await store.jobs_by_short_id(head, tail)
    if len(found) == 1:
        return found[0]
    if not found:
        raise LookupError(f"no job {job_id!r}: no job id starts with {head!r} and ends with "
                          f"{tail!r}")
    raise LookupError(f"{job_id!r} is ambiguous: it shortens {found[0]}, {found[1]}"
                      f"{' and more' if len(found) > 2 else ''}; give the whole id "
                      "(`vidpoll jobs list --json` has it)")


def short_id(job_id: str) -> str:
    """A job id shortened for a table: its first 8 and last 4 characters (ids of 13 or fewer
    characters whole). `jobs show` and --json take and give the whole id."""
    if len(job_id) <= SHORT_ID_HEAD + SHORT_ID_TAIL + 1:
        return job_id
    return f"{job_id[:SHORT_ID_HEAD]}…{job_id[-SHORT_ID_TAIL:]}"


def _since(at: datetime | None, now: datetime) -> str:
    """A time as a table cell reads it: `12s ago`, `in 3m`, `2d ago` (--json has the time)."""
    if at is None:
        return ""
    seconds = (now - at).total_seconds()
    span = abs(seconds)
    for unit, size, limit in (("s", 1, 90), ("m", 60, 90 * 60), ("h", 3600, 36 * 3600),
                              ("d", 86400, float("inf"))):
        if span < limit:
            amount = f"{span / size:.0f}{unit}"
            break
    return f"{amount} ago" if seconds >= 0 else f"in {amount}"


@jobs.command("poll-now")
@click.argument("job_id")
def jobs_poll_now(job_id: str) -> None:
    """Make a pending job due now (a worker reads it within a second when listening)."""
    async def poll_now(store: PgStore) -> bool | None:
        nonlocal job_id
        job_id = await whole_id(store, job_id)
        return await store.poll_now(job_id)

    made_due = _on_store(poll_now)
    if made_due is None:
        _stderr(f"error: no pending job {job_id!r} (`vidpoll jobs resume` revives a "
                   "gave_up / not_found one)")
        sys.exit(1)
    shown_id = logs.printable(job_id)
    click.echo(f"{shown_id}: due now" if made_due else
               f"{shown_id}: being read right now; read again as soon as that read is recorded")


@jobs.command("prune")
@click.option("--finished-before", required=True, metavar="DATE",
              help="ISO date or time (UTC unless it says otherwise), e.g. 2026-11-01.")
@click.option("--batch", default=5000, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option("--events-older-than", metavar="DURATION",
              help="Delete the history (video_job_events) of jobs no longer in video_jobs "
                   "once all of it is this old: 90d, 12h, 30m, or off "
                   "[default: VIDPOLL_EVENTS_RETENTION, else 90d].")
@click.option("--webhook-events-older-than", metavar="DURATION",
              help="Delete webhook events (the replay de-duplication) received this long "
                   "ago, at least twice VIDPOLL_WEBHOOK_TOLERANCE_S, or off "
                   "[default: VIDPOLL_WEBHOOK_EVENTS_RETENTION, else that plus 1h].")
def jobs_prune(finished_before: str, batch: int, events_older_than: str | None,
               webhook_events_older_than: str | None) -> None:
    """Move rows finished before DATE to video_jobs_archive, in batches (each its own
    transaction): `jobs show` still finds them. Rows whose result or deliveries are still to
    do stay, counted by reason. Then delete, in batches too, the history of jobs no longer in
    video_jobs and old webhook events."""
    try:
        before = datetime.fromisoformat(finished_before)
    except ValueError:
        raise click.BadParameter("not an ISO date or time",
                                 param_hint="--finished-before") from None
    if before.tzinfo is None:
        before = before.replace(tzinfo=UTC)
    settings = _settings()
    try:
        events_s = (settings.events_retention_s if events_older_than is None
                    else parse_duration(events_older_than, "--events-older-than"))
        webhooks_s = (settings.webhook_retention_s() if webhook_events_older_than is None
                      else check_webhook_retention(
                          parse_duration(webhook_events_older_than,
                                         "--webhook-events-older-than"),
                          settings.webhook_tolerance_s, "--webhook-events-older-than"))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None

    async def prune(store: PgStore) -> None:
        dropped = await store.unarchived_columns()
        if dropped:
            _stderr(f"note: video_jobs has columns prune does not archive (not from "
                       f"vidpoll's migrations): {', '.join(dropped)}; their values go with "
                       "the rows it moves")
        moved = 0
        while n := await store.prune_finished(before, batch):
            moved += n
            _stderr(f"moved {moved} rows so far")
        click.echo(f"moved {moved} rows finished before {before.isoformat()} to "
                   "video_jobs_archive")
        kept = await store.prune_kept(before)
        if kept:
            click.echo(f"kept {sum(int(k['n']) for k in kept)} rows finished before then:")
        for k in kept:
            who = f" {_cell(k['consumer'])}" if k["consumer"] else ""
            click.echo(f"  {k['n']} {k['reason']}{who} (oldest finished "
                       f"{k['oldest_finished']:%Y-%m-%d %H:%M}): "
                       + PRUNE_KEPT_REASONS.get(k["reason"], k["reason"]).format(
                           consumer=k["consumer"]))
        if events_s is None:
            click.echo("history: kept for ever (--events-older-than off)")
        else:
            gone, old = await store.prune_job_events(
                events_s, batch, lambda n: _stderr(f"deleted {n} events so far"))
            click.echo(f"deleted {gone} history events of jobs no longer in video_jobs, all "
                       f"older than {_duration(events_s)}"
                       + (f"; kept {old} as old: their jobs are still in video_jobs or have "
                          "newer events" if old else ""))
        if webhooks_s is None:
            click.echo("webhook events: kept for ever (--webhook-events-older-than off)")
        else:
            gone = await store.prune_webhook_events(
                webhooks_s, batch,
                lambda n: _stderr(f"deleted {n} webhook events so far"))
            click.echo(f"deleted {gone} webhook events received over {_duration(webhooks_s)} "
                       "ago")

    _on_store(prune)


def _counts(counts: Mapping[str, Any]) -> str:
    """`server_error 3, timeout 1`: counts by name, biggest first (never a dict's repr)."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _duration(seconds: float) -> str:
    """90d, 1h10m, 45s: a retention as `jobs prune` takes it."""
    whole = round(seconds)
    if whole % 86400 == 0:
        return f"{whole // 86400}d"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v)


@main.command("doctor")
@click.option("--json", "as_json", is_flag=True)
def doctor_cmd(as_json: bool) -> None:
    """Check the schema, the claim query's plan, dead rows and bloat, autovacuum, the xmin
    horizon, connections, listeners and stuck claims, whether the database is the embedded
    one, and each account's base URL and key (one status read of a job id that cannot exist,
    which only the provider's own "not found" answers right); print what is wrong and the fix.
    Exit 0 if nothing failed (warnings included), 1 otherwise."""
    settings = _settings()
    report = _on_store(lambda store: store.doctor())
    findings = diagnose(report, len(migrations()),
                        None if settings.database_url else settings.home / "pgdata")
    findings += _run(check_providers(settings.sume_base_url, settings.account_keys,
                                     settings.http_timeout_s))
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(f) for f in findings]))
    else:
        console = Console(highlight=False)
        table = Table(title="vidpoll doctor", title_justify="left")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col, overflow="fold")
        style = {OK: "green", WARN: "yellow", FAIL: "bold red"}
        for f in findings:
            table.add_row(_shown(f.check), f"[{style[f.status]}]{f.status}[/]",
                          _shown(f.detail), _shown(f.fix))
        console.print(table)
    if any(f.status == FAIL for f in findings):
        sys.exit(1)


@main.group("deliveries")
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


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


@main.command("submit")
@click.option("--prompt", help="The prompt (the payload's `prompt` field).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Another payload field; VALUE is parsed as JSON when it can be.")
@click.option("--json", "json_source", type=click.File("r"), metavar="FILE|-",
              help="The payload as a JSON object (from a file, or - for stdin).")
@click.option("--key", help="Idempotency-Key to use [default: a new UUID]. The same key "
                            "again returns the existing intent, never a second render.")
@click.option("--priority", default=0, show_default=True, type=click.IntRange(-2**31, 2**31 - 1),
              help="Higher goes first; first in first out within a priority (with --file: "
                   "for lines without one).")
@click.option("--file", "bulk_file", type=click.File("r"), metavar="FILE|-",
              help="Record one intent per JSON line (resumable: keys are stable per line); "
                   "a running `vidpoll worker` sends them.")
@click.option("--key-prefix", default="", help="With --file: prefix of every derived key.")
@click.option("--queue-only", is_flag=True,
              help="Only record the intent; let a running worker send it.")
@click.option("--wait", "wait_", is_flag=True,
              help="Block until the job is final; exit 0 if it made a video, 7 otherwise. "
                   "Says within seconds when no worker serves the account (and waits on).")
@click.option("--timeout", type=click.FloatRange(0), help="With --wait: give up after S "
                                                          "seconds (exit 8); the job goes on.")
@click.option("--max-active", type=click.IntRange(1, 1_000_000),
              help="Admission cap for the immediate try [default: VIDPOLL_MAX_ACTIVE or 50].")
@click.option("--json-output", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--account", default="default", show_default=True,
              help="The account (API key: SUME_API_KEY_<NAME>) the render is billed to.")
def submit_cmd(prompt: str | None, params: tuple[str, ...], json_source: Any, key: str | None,
               priority: int, bulk_file: Any, key_prefix: str, queue_only: bool, wait_: bool,
               timeout: float | None, max_active: int | None, as_json: bool,
               account: str) -> None:
    """Record a paid submission durably, then send it once right away.

    Prints the job id when Sume answered 202, or says the intent is queued and why (exit 0 in
    both cases); a running `vidpoll worker` sends queued intents with the same key. Exit 9
    when Sume refused the configuration (the API key, or a base URL that does not answer as
    Sume): the intent is kept, queued, and a worker sends it once that is fixed; 5 when Sume
    rejected the request; 2 for a setting; 3 when PostgreSQL is unreachable.
    """
    settings = _settings()
    _quiet("vidpoll.submitter")  # its INFO line would repeat what submit says itself
    if bulk_file is not None:
        if prompt or params or json_source or key or wait_ or max_active or as_json:
            raise click.UsageError("--file takes no --prompt/--param/--json/--key/--wait/"
                                   "--max-active/--json-output (a worker sends its intents)")
        _submit_file(settings, bulk_file, key_prefix, priority, account)
        return
    payload = _payload(prompt, params, json_source)
    if max_active is not None:
        settings = dataclasses.replace(settings, max_active=max_active)
    if not queue_only:
        try:
            settings.require_api_key(account)
        except ConfigError as exc:
            _stderr(f"error: {exc} (or use --queue-only to let a worker send it)")
            sys.exit(2)

    async def go() -> tuple[Submission, str | None, str | None]:
        async with await Vidpoll.open(settings=settings) as vp:
            sub = await vp.record(payload, key=key, priority=priority, account=account,
                                  explain=False)
            if sub.new:
                # said at once: if anything fails from here on, this key is how to try again
                _stderr(f"recorded intent {sub.key}")
            if not queue_only and sub.intent.state == QUEUED:
                if not sub.new:
                    # the same key again, still queued (a refused key or URL, a lost
                    # answer): tried now, so the exit code says what Sume says today. Made
                    # due only if no one holds it, then sent through the same claim as
                    # any send: never two POSTs at once
                    await vp.store.requeue_intents([sub.key])
                sent = await vp.send(sub.key)
                sub = Submission(sent.intent, sub.new, sent.reason, sent.refused)
            sub = await vp.explained(sub)
            _report_submission(sub, as_json)
            if not wait_ or sub.refused:
                return sub, None, None
            _stderr("waiting for the job to end ...")
            try:
                job = await vp.wait(key=sub.key, timeout=timeout, on_no_worker=_warn_line)
            except TimeoutError as exc:
                return sub, None, str(exc)
            return sub, job.state, None

    sub, final, timed_out = _run(go())
    if sub.refused:
        # the reason (printed above) says what to fix and how the kept intent gets sent
        what = "API key" if sub.refused == "key" else "base URL (SUME_BASE_URL)"
        _stderr(f"error: Sume refused the {what}; the intent under key {sub.key!r} is kept, "
                "queued (exit 9)")
        sys.exit(EXIT_PROVIDER_REFUSED)
    if timed_out:
        _stderr(f"error: {timed_out}; `vidpoll submit --wait` with the same key and payload, "
                "or `vidpoll jobs watch JOB_ID`, waits again")
        sys.exit(EXIT_WAIT_TIMEOUT)
    if final is not None:
        click.echo(logs.printable(final))  # the provider's word
        if final not in SUCCESS_STATES:
            sys.exit(EXIT_NOT_COMPLETED)


def _quiet(logger: str) -> None:
    """`logger` logs warnings and errors only, unless --log-level was given: the command's
    own lines say what happened."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    if root is None or root.get_parameter_source("log_level") in (None, ParameterSource.DEFAULT):
        quieted = logging.getLogger(logger)
        before = quieted.level
        quieted.setLevel(logging.WARNING)
        if ctx is not None:  # as it was once the command ends (tests run several in-process)
            ctx.call_on_close(lambda: quieted.setLevel(before))


def _warn_line(line: str) -> None:
    _stderr(f"warning: {line}")


def _payload(prompt: str | None, params: tuple[str, ...], json_source: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    if json_source is not None:
        try:
            loaded = json.load(json_source)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--json") from None
        if not isinstance(loaded, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--json")
        payload.update(loaded)
    if prompt is not None:
        payload["prompt"] = prompt
    for text in params:
        try:
            name, value = parse_param(text)
        except InvalidIntent as exc:  # its text names --param already
            raise click.UsageError(str(exc)) from None
        payload[name] = value
    if not payload:
        raise click.UsageError("nothing to submit: give --prompt, --param, --json or --file")
    return payload


def _report_submission(sub: Submission, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"key": sub.key, "state": sub.state, "job_id": sub.job_id,
                               "new": sub.new, "reason": sub.reason, "refused": sub.refused}))
        return
    again = "" if sub.new else " (this key was already recorded)"
    if sub.job_id is not None:
        _stderr(f"submitted{again}: key {sub.key}")
        click.echo(_cell(sub.job_id))  # the provider's id: nothing in it moves the cursor
    else:
        click.echo(f"{sub.state}{again}: key {_cell(sub.key)}: {_cell(sub.reason)}")


def _submit_file(settings: Settings, source: Any, prefix: str, priority: int,
                 account: str) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    deriver = KeyDeriver(prefix, priority)
    bad: list[BadLine] = []
    conflicts: list[str] = []
    totals = {"new": 0, "seen": 0}

    async def go() -> None:
        store = await _open_store(settings)
        try:
            with Progress(TextColumn("recording intents"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[new]} new"), transient=False,
                          console=_stderr_console()) as progress:
                task = progress.add_task("record", total=None, new=0)
                line_no = 0
                while True:
                    lines = await asyncio.to_thread(_read_lines, source, BULK_BATCH)
                    if not lines:
                        break
                    batch = []
                    for text in lines:
                        line_no += 1
                        parsed = deriver.parse(line_no, text)
                        if isinstance(parsed, BadLine):
                            bad.append(parsed)
                        elif parsed is not None:
                            batch.append((parsed.key, parsed.payload, parsed.priority))
                    new, clash = await store.add_intents(batch, account)
                    totals["new"] += new
                    totals["seen"] += len(batch)
                    conflicts.extend(clash)
                    progress.update(task, advance=len(lines), new=totals["new"])
        finally:
            await store.close()

    _run(go())
    click.echo(f"recorded {totals['new']} new intents; {totals['seen'] - totals['new']} were "
               f"already recorded; {len(bad)} bad lines; {len(conflicts)} key conflicts. "
               "A running `vidpoll worker` sends them.")
    for line in bad[:20]:
        _stderr(f"line {line.line_no}: {line.reason}")
    for clash_key in conflicts[:20]:
        _stderr(f"key {clash_key!r} is already recorded with a different payload")
    if bad or conflicts:
        sys.exit(6)


def _read_lines(source: Any, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        line = source.readline()
        if not line:
            break
        lines.append(line)
    return lines


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@main.group("intents")
def intents() -> None:
    """Inspect and re-queue submission intents."""


def _intent_dict(intent: Intent) -> dict[str, Any]:
    return {f.name: getattr(intent, f.name) for f in dataclasses.fields(intent)}


@intents.command("show")
@click.argument("key")
def intents_show(key: str) -> None:
    """Print one intent (state, job id, attempts, Sume's error) as JSON."""
    intent = _on_store(lambda store: store.get_intent(key))
    if intent is None:
        _stderr(f"error: no intent with key {key!r}")
        sys.exit(1)
    click.echo(json.dumps(_intent_dict(intent), default=_json_default, indent=2,
                          sort_keys=True))


@intents.command("list")
@click.option("--state", type=click.Choice(["queued", "submitted", "rejected", "unknown"]),
              help="unknown: refused after an earlier attempt's reply was lost (a render may "
                   "be billed); `intents resolve` settles them.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True)
def intents_list(state: str | None, limit: int, as_json: bool) -> None:
    """Newest intents first."""
    rows = _on_store(lambda store: store.list_intents(state, limit))
    if as_json:
        click.echo(json.dumps([_intent_dict(i) for i in rows], default=_json_default))
        return
    for i in rows:
        detail = i.job_id or (f"{i.error_code}: {i.error_message}" if i.error_code
                              else (i.last_error or ""))
        click.echo(f"{_cell(i.key)}\t{i.state}\tattempts={i.attempts}\t{_cell(detail)}")


@intents.command("retry")
@click.argument("keys", nargs=-1)
@click.option("--all-rejected", is_flag=True, help="Re-queue every rejected intent.")
@click.option("--code", help="With --all-rejected: only those Sume rejected with this code "
                             "(e.g. insufficient_credits).")
def intents_retry(keys: tuple[str, ...], all_rejected: bool, code: str | None) -> None:
    """Re-queue rejected intents (same key), due now; a queued or unknown one is made due
    now (an unknown one stays unknown)."""
    if not keys and not all_rejected:
        raise click.UsageError("give KEY... or --all-rejected")
    done = _on_store(lambda store: store.requeue_intents(keys, all_rejected=all_rejected,
                                                         code=code))
    for k in done:
        click.echo(f"{k}: queued, due now")  # an `unknown` one stays unknown, due now
    missing = set(keys) - set(done)
    for k in sorted(missing):
        _stderr(f"error: {k!r}: no rejected or idle queued intent with this key")
    if missing or not done:
        sys.exit(1)


@intents.command("resolve")
@click.argument("key")
@click.option("--job-id", help="The job Sume started for this key (its dashboard, support): "
                               "the intent becomes submitted and the job is tracked.")
@click.option("--not-billed", is_flag=True,
              help="Nothing was billed for this key: the intent is rejected for good.")
def intents_resolve(key: str, job_id: str | None, not_billed: bool) -> None:
    """Settle an intent by hand, typically an `unknown` one (refused after a lost reply).

    Exit 0 when settled; 1 if there is no such intent, it is submitted already, it is being
    sent right now (try again in a few seconds), or the job id belongs to another key; 6 for
    a job id that cannot be stored.
    """
    if (job_id is None) == (not not_billed):
        raise click.UsageError("give exactly one of --job-id ID or --not-billed")

    async def go(store: PgStore) -> tuple[bool, Intent | None]:
        done = await store.resolve_intent(key, job_id=job_id, not_billed=not_billed)
        return done, await store.get_intent(key)

    done, intent = _on_store(go)  # a job id PostgreSQL cannot store: exit 6
    if done and intent is not None:
        if job_id is not None:
            click.echo(f"{_cell(key)}: submitted, job {_cell(intent.job_id)} tracked "
                       "(polled now)")
        else:
            click.echo(f"{_cell(key)}: rejected for good (resolved: not billed)")
        return
    if intent is None:
        _stderr(f"error: no intent with key {key!r}")
    elif intent.state == "submitted":
        _stderr(f"error: {key!r} is already submitted (job {intent.job_id})")
    elif job_id is not None:
        _stderr(f"error: {key!r} ({intent.state}) not settled: it is being sent right now, "
                   f"or job {job_id!r} is tracked under another key")
    else:
        _stderr(f"error: {key!r} ({intent.state}) not settled: it is being sent right now "
                   "(try again in a few seconds), or it is not queued or unknown")
    sys.exit(1)


@intents.command("stats")
@click.option("--json", "as_json", is_flag=True)
def intents_stats(as_json: bool) -> None:
    """Intents by state and what counts against --max-active."""

    async def collect(store: PgStore) -> dict[str, Any]:
        return {"states": await store.intent_counts(), **await store.admission()}

    stats = _on_store(collect)
    if as_json:
        click.echo(json.dumps(stats))
        return
    for state, n in stats["states"].items():
        click.echo(f"{state:>12} {n}")
    click.echo(f"active renders: {stats['pending_jobs']} pending jobs + "
               f"{stats['unconfirmed']} unconfirmed POSTs ({stats['unknown']} of them unknown: "
               "`intents list --state unknown`)")


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Beyond loopback it needs VIDPOLL_DASHBOARD_TOKEN.")
@click.option("--port", default=8800, show_default=True, type=click.IntRange(0, 65535))
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve /metrics and /readyz (and /healthz) on this port, not on --port: "
                   "open there unless VIDPOLL_METRICS_TOKEN is set.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="The address of --metrics-port.")
def serve_cmd(host: str, port: int, metrics_port: int | None, metrics_host: str) -> None:
    """Serve the dashboard (/), Prometheus /metrics, POST /webhooks/sume (needs
    SUME_WEBHOOK_SECRET), /healthz and /readyz. With VIDPOLL_METRICS_TOKEN, /metrics and
    /readyz need it as `Authorization: Bearer`; without it, /metrics on --port needs the
    dashboard token if there is one."""
    from vidpoll.web import GUARD, make_app, metrics_app, start_server

    settings = _settings()
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if not loopback and not settings.dashboard_token:
        _stderr(f"error: --host {host} exposes the dashboard beyond this machine; set "
                   "VIDPOLL_DASHBOARD_TOKEN first")
        sys.exit(2)
    if settings.dashboard_token and len(settings.dashboard_token) < MIN_TOKEN_CHARS:
        _stderr(f"error: VIDPOLL_DASHBOARD_TOKEN is shorter than {MIN_TOKEN_CHARS} "
                   "characters; use a long random one (python -c 'import secrets; "
                   "print(secrets.token_urlsafe(24))')")
        sys.exit(2)
    if settings.metrics_token and len(settings.metrics_token) < MIN_TOKEN_CHARS:
        _stderr(f"error: VIDPOLL_METRICS_TOKEN is shorter than {MIN_TOKEN_CHARS} characters; "
                "use a long random one")
        sys.exit(2)
    apart = metrics_port is not None

    async def go() -> None:
        store = await _open_store(settings)
        try:
            runner, url = await _listening(start_server(
                make_app(store, settings.webhook_secret or None, settings.webhook_tolerance_s,
                         dashboard_token=settings.dashboard_token or None,
                         loopback_only=loopback and not settings.dashboard_token,
                         metrics_token=settings.metrics_token or None, metrics_apart=apart,
                         trusted_proxies=settings.trusted_proxies,
                         webhook_events_retention_s=settings.webhook_events_retention_s),
                host, port), host, port, "--port")
            scrapes = "/metrics"
            if metrics_port is not None:
                metrics_runner, metrics_url = await _listening(start_server(
                    metrics_app(store, table_gauges=True, guard=runner.app[GUARD]),
                    metrics_host, metrics_port), metrics_host, metrics_port,
                    "--metrics-port", "--metrics-host")
                scrapes = f"{metrics_url}/metrics"
            if settings.metrics_token or (settings.dashboard_token and not apart):
                # (not "Bearer <word>": the log redactor would hide the word)
                scrapes += ", which asks for a token"
            # said once the settings, the database and the port are known good: a command
            # that cannot start says one line, its error
            if not settings.webhook_secret:
                _stderr("warning: SUME_WEBHOOK_SECRET is not set; /webhooks/sume answers 503")
            _stderr(f"vidpoll serving on {url} (dashboard at /, metrics at {scrapes})")
            await _until_signalled()
            if metrics_port is not None:
                await metrics_runner.cleanup()
            await runner.cleanup()
        finally:
            await store.close()

    _run(go())


@main.command("demo")
@click.option("--jobs", "n_jobs", default=40, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 16))
def demo_cmd(n_jobs: int, workers: int) -> None:
    """Embedded Postgres + fake Sume: submit jobs, poll them to the end, show it live.

    Logs warnings and errors only, unless --log-level is given (`vidpoll --log-level info
    demo`): the live view is the output."""
    from vidpoll.demo import run_demo

    root = click.get_current_context().find_root()
    if root.get_parameter_source("log_level") in (None, ParameterSource.DEFAULT):
        logs.setup("WARNING", root.params.get("log_format") or "text")

    _run(run_demo(_settings(), n_jobs, workers))


if __name__ == "__main__":
    main()
