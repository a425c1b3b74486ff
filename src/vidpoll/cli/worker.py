"""`vidpoll worker`: poll due jobs, send queued intents, deliver results, until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from vidpoll.aio import cancel_and_wait
from vidpoll.cli._common import (
    LaterOption,
    _listening,
    _open_store,
    _run,
    _settings,
    _stderr,
    log,
)
from vidpoll.errors import ConfigError, DiskError

if TYPE_CHECKING:
    from vidpoll.config import Settings
    from vidpoll.deliver import Deliverer
    from vidpoll.models import ClaimMode
    from vidpoll.submitter import Submitter
    from vidpoll.worker import Worker


@click.command("worker")
@click.option("--concurrency", default=50, show_default=True, type=click.IntRange(1, 10_000),
              help="Status reads in flight at once.")
@click.option("--claim", "claim_mode", default="lease", show_default=True,
              type=click.Choice(["lease", "lock"]),
              help="lease: commit the claim and fence writes (no transaction during HTTP); "
                   "lock: hold row locks during the read, as the seed's loop does.")
@click.option("--drain", is_flag=True,
              help="Exit 0 once no job is pending (and, when submitting, no intent queued).")
@click.option("--no-listen", is_flag=True, help="Do not LISTEN (for transaction poolers).")
@click.option("--batch-size", default=200, show_default=True, type=click.IntRange(1, 10_000),
              help="Rows one claim statement may take; half of min(this, --concurrency) is "
                   "kept claimed ahead for the next free slots (BENCHMARKS.md, \"Per-read "
                   "cost\": 200 takes half as many claims as 100 at --concurrency 200).")
@click.option("--lease-seconds", type=click.FloatRange(1, 3600),
              help="Lease length; default: HTTP timeout + 10 s.")
@click.option("--db-connections", default=4, show_default=True, type=click.IntRange(2, 100),
              help="PostgreSQL connections this process may hold, its one LISTEN connection "
                   "included (the pool gets the rest; lock mode uses all but one of the pool "
                   "for locked batches).")
@click.option("--vacuum-every", cls=LaterOption,
              default_from="vidpoll.worker:DEFAULT_VACUUM_EVERY_ROWS", show_default=True,
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
                   "those of vidpoll.toml, and SUME_API_KEY, SUME_API_KEY_<NAME>].")
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
@click.option("--processes", metavar="N|auto",
              help="Run N worker processes of this same command (auto: one per CPU core), "
                   "supervised by this one: one that crashes is started again with backoff; "
                   "SIGTERM/SIGINT/SIGHUP are passed on to each, and this one waits for them "
                   "within --shutdown-timeout; --metrics-port serves all of them on one "
                   "endpoint. Each has its own --concurrency and --db-connections. [default: "
                   "this process is the one worker]")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve Prometheus /metrics (and /healthz, /readyz) on this port.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option("--shutdown-timeout", cls=LaterOption,
              default_from="vidpoll.runner:SHUTDOWN_TIMEOUT_S", show_default=True,
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
               delivery_concurrency: int, processes: str | None, metrics_port: int | None,
               metrics_host: str, shutdown_timeout: float) -> None:
    """Poll due jobs and send queued intents until stopped (SIGTERM/SIGINT finish what is in
    flight, then exit 0)."""
    from vidpoll.accounts import client_for
    from vidpoll.config import DEFAULT_LEASE_MARGIN_S
    from vidpoll.deliver import Deliverer, DeliveryConfig
    from vidpoll.download import Downloader, inline_fetcher, media_refresher
    from vidpoll.models import ClaimMode
    from vidpoll.procs import processes_wanted, supervisor_pid
    from vidpoll.runner import default_worker_id
    from vidpoll.store import POLLS, SUBMITS, Serves
    from vidpoll.submitter import Submitter, SubmitterConfig
    from vidpoll.worker import Worker, WorkerConfig

    if poll_only and submit_only:
        raise click.UsageError("--poll-only and --submit-only exclude each other")
    supervisor = supervisor_pid()
    children = 0
    if processes is not None and supervisor is None:
        try:
            children = processes_wanted(processes)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--processes'") from None
    if supervisor is not None:
        metrics_port = None  # one of N: the supervisor serves every child's metrics
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
    if not accounts:
        for name, found in sorted(settings.accounts.items()):
            if not found.api_key and found.source == "file":
                _stderr(f"warning: account {name!r} is not served: {found.api_key_env} is not "
                        "set")
    served = accounts or tuple(sorted(settings.account_keys)) or ("default",)
    try:
        for a in served:
            settings.account(a)  # every account served has a key: its variable named if not
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
    timings, providers = settings.timings(served)
    try:
        poll_config = WorkerConfig(
            concurrency=concurrency, claim_mode=ClaimMode(claim_mode), lease_s=lease_s,
            batch_size=batch_size, lock_lanes=pool_size - 1, drain=drain,
            drain_waits_for_intents=not poll_only, listen=not no_listen,
            policy=settings.policy, worker_id=worker_id, accounts=served,
            budgets=settings.budgets("status", served), fetch_results=fetch_results,
            poll_floors={name: acc.min_poll_s for name, acc in settings.accounts.items()
                         if name in served and acc.min_poll_s is not None},
            vacuum_every_rows=vacuum_every, read_timeout_s=settings.http_timeout_s,
            shutdown_timeout_s=shutdown_timeout, spends=settings.spends(served),
            timings=timings, providers=providers)
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
                budgets=settings.budgets("create", served), shutdown_timeout_s=shutdown_timeout,
                resend_unknown=frozenset(name for name, acc in settings.accounts.items()
                                         if acc.on_unknown_create == "resend"),
                spends=settings.spends(served))
        except ConfigError as exc:
            _stderr(f"error: {exc} (--lease-seconds, VIDPOLL_HTTP_TIMEOUT)")
            sys.exit(2)

    if children:
        # every setting above was checked once here: a mistake exits 2 before any child starts
        _supervise(children, settings, db_connections, metrics_port, metrics_host,
                   shutdown_timeout)
        return
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
                clients = {a: await stack.enter_async_context(client_for(
                    settings, a, max_connections=concurrency + submit_concurrency))
                    for a in served}
                parts: list[Worker | Submitter] = []
                # one process, one view of the render times: the submitter plans a new
                # job's first read from the poller's learned schedules
                schedules = None
                if not submit_only:
                    poller = Worker(store, clients, poll_config)
                    schedules = poller.schedules
                    parts.append(poller)
                if submit_config is not None:
                    parts.append(Submitter(store, clients, submit_config,
                                           schedules=schedules))
                deliverer = None
                if hooks or download_dir is not None:
                    downloader = None
                    if download_dir is not None:
                        downloader = await stack.enter_async_context(Downloader.from_settings(
                            download_dir, settings,
                            {a: c.media_headers() for a, c in clients.items()},
                            {a: c.media_auth_hosts() for a, c in clients.items()},
                            max_connections=delivery_concurrency,
                            inline_fetch=inline_fetcher(clients),
                            fresh_media=media_refresher(clients)))
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
                loop.add_signal_handler(signal.SIGHUP, _reload_spends, parts, served)
                if supervisor is not None:
                    watch = asyncio.create_task(_watch_supervisor(supervisor, stopping))
                    stack.push_async_callback(cancel_and_wait, watch)
                    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                        # the supervisor's scrape reads the shared files: no scrape here flushes
                        # the batched counts, so a child idle after its last read flushes them
                        flusher = asyncio.create_task(_flush_counts())
                        stack.push_async_callback(cancel_and_wait, flusher)

                async def produce() -> None:
                    await asyncio.gather(*(p.run() for p in parts))
                    if deliverer is not None:
                        deliverer.producers_finished()

                await asyncio.gather(produce(), *([deliverer.run()] if deliverer else []))
        finally:
            await store.close()

    _run(go())


def _supervise(children: int, settings: Settings, db_connections: int,
               metrics_port: int | None, metrics_host: str, shutdown_timeout: float) -> None:
    """`--processes N`: run N children of this same command (vidpoll.procs) and, with
    --metrics-port, serve all their metrics here (prometheus_client's multiprocess mode:
    vidpoll.metrics.serve_processes). Exits with the supervisor's code."""
    import shutil
    import tempfile

    from vidpoll import metrics
    from vidpoll.procs import SUPERVISOR_VARIABLE, ProcessesConfig, Supervisor

    env = dict(os.environ)
    env[SUPERVISOR_VARIABLE] = str(os.getpid())
    shared = None
    if metrics_port is not None:
        shared = tempfile.mkdtemp(prefix="vidpoll-metrics-")
        env["PROMETHEUS_MULTIPROC_DIR"] = shared
    config = ProcessesConfig(processes=children,
                             command=[sys.executable, "-m", "vidpoll.cli", *sys.argv[1:]],
                             env=env, shutdown_timeout_s=shutdown_timeout)

    async def go() -> int:
        def ended(pid: int) -> None:
            if shared is not None:
                metrics.process_ended(pid, shared)

        procs = Supervisor(config, on_exit=ended)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, procs.signalled, sig)
        async with contextlib.AsyncExitStack() as stack:
            if shared is not None and metrics_port is not None:
                from vidpoll.web import metrics_app, start_server

                metrics.serve_processes(shared)
                # /readyz asks the database: one connection, for that alone
                store = await _open_store(settings, 1, "vidpoll supervisor")
                stack.push_async_callback(store.close)
                server, url = await _listening(
                    start_server(metrics_app(store), metrics_host, metrics_port),
                    metrics_host, metrics_port, "--metrics-port", "--metrics-host")
                stack.push_async_callback(server.cleanup)
                log.info("metrics of %d worker processes on %s/metrics", children, url)
            log.info("starting %d worker processes (each: up to %d database connections and "
                     "its own --concurrency)", children, db_connections)
            return await procs.run()

    try:
        code = _run(go())
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
    sys.exit(code)


async def _flush_counts() -> None:
    """One of `--processes N --metrics-port P`: the batched read counts into the shared files
    every TALLY_FLUSH_S, read or no read (vidpoll.metrics._PollTally)."""
    from vidpoll import metrics

    while True:
        await asyncio.sleep(metrics.TALLY_FLUSH_S)
        metrics.POLL_TALLY.flush()


async def _watch_supervisor(supervisor: int, stopping: _Stopping) -> None:
    """One of `--processes N`: stop as after SIGTERM once the supervisor has died (a kill -9
    sends nothing on; the child must not poll on, unsupervised, for ever)."""
    from vidpoll.procs import parent_gone

    # no event tells a child that its parent died: a look a second (one syscall)
    while not parent_gone(supervisor):  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    log.warning("the supervisor (pid %d) is gone: stopping", supervisor)
    stopping.signalled(signal.SIGTERM)


def _reload_spends(parts: Sequence[Worker | Submitter], served: Sequence[str]) -> None:
    """SIGHUP: read the accounts file again and apply its prices and caps (a cap raised lets
    held intents go at once). Nothing else is reloaded: keys, URLs and rates need a restart.
    A file with a mistake changes nothing (the error is logged)."""
    from vidpoll.config import Settings
    from vidpoll.worker import Worker

    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        log.error("SIGHUP: the settings were not reloaded, the old prices and caps stay: %s",
                  exc)
        return
    spends = settings.spends(served)
    for part in parts:
        if isinstance(part, Worker):
            part.config = dataclasses.replace(part.config, spends=spends)
        else:
            part.reload_spends(spends)
    log.info("SIGHUP: prices and caps reloaded for %s", ", ".join(served))


def _load_hook(spec: str) -> Any:
    """load_hook, with an error raised while importing the user's module as one line too."""
    from vidpoll.deliver import load_hook

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
        from vidpoll.models import ClaimMode
        from vidpoll.submitter import Submitter
        from vidpoll.worker import Worker

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


def _override(rates: Mapping[str, float], per_min: float | None,
              settings: Settings) -> Mapping[str, float]:
    """A flag's rate applies to every account (it overrides the environment's)."""
    if per_min is None:
        return rates
    return {a: per_min for a in {"default", *settings.account_keys}}
