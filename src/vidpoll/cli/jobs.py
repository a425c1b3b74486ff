"""`vidpoll jobs`: track, list, show, watch, resume and prune jobs."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import click

from vidpoll import logs
from vidpoll.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_NOT_COMPLETED,
    EXIT_WAIT_TIMEOUT,
    LaterChoice,
    _cell,
    _compact,
    _intent_dict,
    _json_default,
    _on_store,
    _run,
    _settings,
    _shown,
    _stderr,
    _warn_line,
)
from vidpoll.errors import ConfigError

if TYPE_CHECKING:
    from rich.table import Table

    from vidpoll.store import PgStore


@click.group("jobs")
def jobs() -> None:
    """Inspect and change tracked jobs."""


@jobs.command("add")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--delay", default=15.0, show_default=True, type=float,
              help="Seconds until the first read.")
@click.option("--account", default="default", show_default=True,
              help="The account whose API key reads these jobs.")
def jobs_add(job_ids: tuple[str, ...], delay: float, account: str) -> None:
    """Track job ids the account's provider already returned (never POSTs anything)."""
    from vidpoll.accounts import provider_of

    provider = provider_of(_settings(), account).name

    async def add_all(store: PgStore) -> int:
        return sum([await store.add_job(j, delay, account=account, provider=provider)
                    for j in job_ids])

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
    from rich.console import Console
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    from vidpoll.media import media_urls, without_signatures
    from vidpoll.models import DOWNLOAD

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
                 "claimed_by", "idempotency_key", "cost", "provider_cost",
                 "provider_cost_unit", "tags", "model", "duration_key", "render_s",
                 "overdue_at"):
        if shown.get(name) is not None:
            row.add_row(name, escape(_cell(shown[name])))
    if shown.get("state") == "pending" and shown.get("poll_reason"):
        # the worker's words for why the next read is when it is (a learned schedule's step,
        # the provider's hint, the fixed interval)
        row.add_row("next read", escape(_cell(shown["poll_reason"])))
    if shown["archived"]:
        row.add_row("archived_at", escape(_cell(shown.get("archived_at"))))
    console.print(Panel(row, title=f"job {_shown(job_id)}", expand=False))
    intent = shown["intent"]
    if intent is not None:
        grid = Table.grid(padding=(0, 2))
        for name in ("key", "state", "account", "priority", "attempts", "created_at",
                     "submitted_at", "error_code", "error_message", "resolution", "estimate",
                     "spend_status", "held_reason", "tags"):
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


def _table(title: str, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Table:
    """A rich table of `rows` (dicts) with these columns; values escaped, times shortened."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")  # wrapped, never cut: an id is read whole
    for r in rows:
        table.add_row(*(escape(_cell(r.get(c))) for c in columns))
    return table


@jobs.command("watch")
@click.argument("job_id")
@click.option("--timeout", type=click.FloatRange(0), help="Give up after S seconds (exit 8).")
def jobs_watch(job_id: str, timeout: float | None) -> None:
    """Block until a job is final (LISTEN/NOTIFY, with a re-read every 5 s); print its state.

    Says on stderr, within seconds, when no worker polling the job's account is connected
    (and waits on). Exit 0 if it ended with a video (completed, succeeded, ...), 7 if it
    ended otherwise, 8 on --timeout (the line names the job and its key).
    """
    from vidpoll.api import Vidpoll
    from vidpoll.models import Job

    settings = _settings()

    async def go() -> tuple[Job | None, str | None]:
        nonlocal job_id
        async with await Vidpoll.open(settings=settings) as vp:
            job_id = await whole_id(vp.store, job_id)
            try:
                return await vp.wait(job_id, timeout=timeout, on_no_worker=_warn_line), None
            except TimeoutError as exc:
                return None, str(exc)

    try:
        job, timed_out = _run(go())
    except KeyboardInterrupt:
        _stderr(f"stopped watching {job_id} (it goes on)")
        sys.exit(128 + signal.SIGINT)
    if job is None:
        _stderr(f"error: {timed_out}")
        sys.exit(EXIT_WAIT_TIMEOUT)
    click.echo(logs.printable(job.state))  # the provider's word
    if not job.succeeded:
        sys.exit(EXIT_NOT_COMPLETED)


@jobs.command("stats")
@click.option("--minutes", default=10, show_default=True, type=click.IntRange(1, 10_080),
              help="The window for rates and errors.")
@click.option("--durations", is_flag=True,
              help="Render times instead: per account, provider and model (and duration key) "
                   "the finished jobs counted and their p10/p50/p90/p99 in seconds, as the "
                   "learned poll schedule uses them.")
@click.option("--json", "as_json", is_flag=True)
def jobs_stats(minutes: int, durations: bool, as_json: bool) -> None:
    """Counts by state, the due backlog and how late it is, polls per second and errors by
    class over the last minutes, stuck claims, deliveries and rate buckets."""
    if durations:
        _duration_stats(as_json)
        return

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


def _duration_stats(as_json: bool) -> None:
    """`jobs stats --durations`: the render-time summary (refreshed first if stale)."""
    from vidpoll.schedule import ANY_KEY, LEARN_AFTER_JOBS

    groups = _on_store(lambda store: store.render_stats())
    rows = [{"account": d.account, "provider": d.provider, "model": d.model,
             "duration_key": None if d.duration_key == ANY_KEY else d.duration_key,
             "jobs": d.jobs, "learned": d.jobs >= LEARN_AFTER_JOBS,
             **{f"p{p}": round(d.quantile(p / 100), 2) for p in (10, 50, 90, 99)}}
            for d in groups]
    if as_json:
        click.echo(json.dumps({"durations": rows, "learn_after_jobs": LEARN_AFTER_JOBS}))
        return
    if not rows:
        click.echo("no render times yet: they are recorded as jobs end (succeeded or failed)")
        return
    click.echo(f"render times (seconds from create to end; a schedule is learned from "
               f"{LEARN_AFTER_JOBS} finished jobs):")
    click.echo(f"{'account':<12} {'provider':<10} {'model':<24} {'key':<10} {'jobs':>6} "
               f"{'p10':>7} {'p50':>7} {'p90':>7} {'p99':>7}")
    for r in rows:
        key = "(all)" if r["duration_key"] is None else r["duration_key"] or "-"
        click.echo(f"{_cell(r['account']):<12.12} {_cell(r['provider']):<10.10} "
                   f"{_cell(r['model']) or '(none)':<24.24} {_cell(key):<10.10} "
                   f"{r['jobs']:>6} {r['p10']:>7.1f} {r['p50']:>7.1f} {r['p90']:>7.1f} "
                   f"{r['p99']:>7.1f}")


@jobs.command("list")
@click.option("--state", type=LaterChoice("vidpoll.providers.registry:job_states"),
              help="pending, finished, or one final state [default: every row].")
@click.option("--order", type=LaterChoice("vidpoll.store:ORDERS", extra=["due"]),
              help="newest/oldest first by when each job was created (finished ones: by when "
                   "they finished); due: pending rows soonest due first [default: due with "
                   "--state pending, else newest].")
@click.option("--account", help="Only this account's rows.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--after", "cursor", help="The cursor printed under the previous page.")
@click.option("--overdue", is_flag=True,
              help="Only pending jobs running past their model's p99 render time times the "
                   "account's overdue_factor, the longest overdue first.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: rows (full job ids) and next cursor.")
def jobs_list(state: str | None, order: str | None, account: str | None, limit: int,
              cursor: str | None, overdue: bool, as_json: bool) -> None:
    """Rows a page at a time, newest first (or --order); ids shortened to fit the terminal
    (--json has them whole). Paging is by cursor (--after), so
    pages never skip or repeat a row."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from vidpoll.store import InvalidCursor

    if overdue:
        if state not in (None, "pending") or order is not None or cursor is not None:
            raise click.UsageError("--overdue lists pending jobs, longest overdue first: "
                                   "without --state, --order or --after")
        _overdue(account, limit, as_json)
        return

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
    # a cost column only where a row has one (accounts with prices: vidpoll.spend)
    costed = any(r.get("cost") is not None for r in rows)
    columns: list[tuple[str, Literal["left", "right"], int | None]] = [
        ("job", "left", SHORT_ID_HEAD + 1 + SHORT_ID_TAIL), ("state", "left", 9),
        ("account", "left", 12), (when, "right", 8), ("polls", "right", 5),
        ("errs", "right", 4), *((("cost", "right", 7),) if costed else ()),
        ("last error", "left", None)]
    for name, justify, width in columns:
        table.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis",
                         min_width=width, max_width=width)
    now = datetime.now(UTC)
    for r in rows:
        at = r["next_poll_at"] if pending else r["finished_at"] if state else r["created_at"]
        errors = f"{r['consecutive_errors']}" if r["consecutive_errors"] else ""
        cost = [] if not costed else ["" if r.get("cost") is None else f"{r['cost']:.2f}"]
        table.add_row(_shown(short_id(r["job_id"])), _shown(r["state"]), _shown(r["account"]),
                      _since(at, now), str(r["polls"]), errors, *cost,
                      _shown(r["last_error_class"]))
    console.print(table)
    if not rows:
        click.echo("no jobs" + (" on this page" if cursor else ""))
    if next_cursor:
        click.echo(f"next page: --after {next_cursor}")


def _overdue(account: str | None, limit: int, as_json: bool) -> None:
    """`jobs list --overdue`."""
    rows = _on_store(lambda store: store.list_overdue(account, limit))
    if as_json:
        click.echo(json.dumps({"jobs": rows, "next": None}, default=_json_default))
        return
    if not rows:
        click.echo("no overdue jobs")
        return
    now = datetime.now(UTC)
    for r in rows:
        late = _duration((now - r["overdue_at"]).total_seconds()) or "0s"
        click.echo(f"{_shown(r['job_id'])}  {_shown(r['account'])}  "
                   f"{_shown(r['model'] or '(no model)')}  running "
                   f"{_duration(r['age_s']) or '0s'}, overdue for {late}, "
                   f"{r['polls']} polls, "
                   f"{_shown(r['provider_status'] or '')}")


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
    from vidpoll.config import check_webhook_retention, parse_duration
    from vidpoll.store import PRUNE_KEPT_REASONS

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
