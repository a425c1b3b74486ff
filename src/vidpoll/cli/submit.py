"""`vidpoll submit` (one paid submission, or a file of them) and `vidpoll intents`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from vidpoll import logs
from vidpoll.cli._common import (
    EXIT_NOT_COMPLETED,
    EXIT_PROVIDER_REFUSED,
    EXIT_WAIT_TIMEOUT,
    _cell,
    _intent_dict,
    _json_default,
    _on_store,
    _open_store,
    _run,
    _settings,
    _stderr,
    _warn_line,
    log,
)
from vidpoll.errors import ConfigError, InvalidIntent

if TYPE_CHECKING:
    from vidpoll.api import Submission
    from vidpoll.config import Settings
    from vidpoll.models import Intent
    from vidpoll.spend import AccountSpend
    from vidpoll.store import PgStore

BULK_BATCH = 200


@click.command("submit")
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
              help="The account the render is billed to (vidpoll.toml's [accounts.NAME], or "
                   "the key SUME_API_KEY_<NAME>).")
@click.option("--tag", "tag_args", multiple=True, metavar="NAME=VALUE",
              help="A tag kept with the intent, its job and its cost (`vidpoll spend` sums "
                   "by tag); repeatable.")
@click.option("--model", help="The model the create runs, for a provider whose creates name "
                              "one (Sume's do not: its request body says everything).")
def submit_cmd(prompt: str | None, params: tuple[str, ...], json_source: Any, key: str | None,
               priority: int, bulk_file: Any, key_prefix: str, queue_only: bool, wait_: bool,
               timeout: float | None, max_active: int | None, as_json: bool,
               account: str, model: str | None, tag_args: tuple[str, ...]) -> None:
    """Record a paid submission durably, then send it once right away.

    Prints the job id when Sume answered 202, or says the intent is queued and why (exit 0 in
    both cases); a running `vidpoll worker` sends queued intents with the same key. Exit 9
    when Sume refused the configuration (the API key, or a base URL that does not answer as
    Sume): the intent is kept, queued, and a worker sends it once that is fixed; 5 when Sume
    rejected the request; 2 for a setting; 3 when PostgreSQL is unreachable.
    """
    # aiohttp and psycopg load here, once the command runs: never for --help
    from vidpoll.api import Submission, Vidpoll
    from vidpoll.models import QUEUED, Job

    settings = _settings()
    _quiet("vidpoll.submitter")  # its INFO line would repeat what submit says itself
    tags = _tags(tag_args)
    if bulk_file is not None:
        if prompt or params or json_source or key or wait_ or max_active or as_json or model:
            raise click.UsageError("--file takes no --prompt/--param/--json/--key/--wait/"
                                   "--max-active/--json-output/--model (a worker sends its "
                                   "intents)")
        _submit_file(settings, bulk_file, key_prefix, priority, account, tags)
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

    async def go() -> tuple[Submission, Job | None, str | None]:
        async with await Vidpoll.open(settings=settings) as vp:
            sub = await vp.record(payload, key=key, priority=priority, account=account,
                                  explain=False, model=model, tags=tags)
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
            return sub, job, None

    sub, final, timed_out = _run(go())
    if sub.refused:
        # the reason (printed above) says what to fix and how the kept intent gets sent
        from vidpoll.accounts import base_url_setting, title_of

        what = ("API key" if sub.refused == "key"
                else f"base URL ({base_url_setting(settings, sub.intent.account)})")
        _stderr(f"error: {title_of(settings, sub.intent.account)} refused the {what}; the "
                f"intent under key {sub.key!r} is kept, queued (exit 9)")
        sys.exit(EXIT_PROVIDER_REFUSED)
    if timed_out:
        _stderr(f"error: {timed_out}; `vidpoll submit --wait` with the same key and payload, "
                "or `vidpoll jobs watch JOB_ID`, waits again")
        sys.exit(EXIT_WAIT_TIMEOUT)
    if final is not None:
        click.echo(logs.printable(final.state))  # the provider's word
        if not final.succeeded:
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


def _payload(prompt: str | None, params: tuple[str, ...], json_source: Any) -> dict[str, Any]:
    from vidpoll.bulk import parse_param

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


def _tags(tag_args: tuple[str, ...]) -> dict[str, str] | None:
    """`--tag name=value ...`, checked (exit 2 on a bad one, before anything is recorded)."""
    from vidpoll.spend import check_tags, parse_tag

    try:
        return check_tags(dict(parse_tag(t) for t in tag_args))
    except InvalidIntent as exc:
        raise click.BadParameter(str(exc), param_hint="--tag") from None


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
                 account: str, tags: dict[str, str] | None = None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from vidpoll.accounts import provider_of
    from vidpoll.bulk import BadLine, KeyDeriver

    found = provider_of(settings, account)
    if found.rules.takes_model:
        # a prompt file's lines name no model, and every create of this provider runs one
        raise click.UsageError(f"{found.title} creates run a model, which a --file line cannot "
                               f"name (account {account!r}): submit each request with --json "
                               f"and --model")
    provider = found.name
    deriver = KeyDeriver(prefix, priority)
    known = settings.accounts.get(account)
    # a capped account records nothing it cannot price (as `submit` refuses one request)
    spend = known.spend if known is not None and known.spend.capped else None
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
                            unpriced = _unpriced(spend, parsed.payload)
                            if unpriced is not None:
                                bad.append(BadLine(line_no, unpriced))
                                continue
                            batch.append((parsed.key, parsed.payload, parsed.priority))
                    new, clash = await store.add_intents(batch, account, provider=provider,
                                                         tags=tags)
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


def _unpriced(spend: AccountSpend | None, payload: dict[str, Any]) -> str | None:
    """Why a capped account cannot price a request (None: it can, or it has no cap)."""
    from vidpoll.spend import NoEstimate

    if spend is None:
        return None
    try:
        spend.estimate(payload, None)
    except NoEstimate as exc:
        return f"the account has spend caps and {exc}"
    return None


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


@click.group("intents")
def intents() -> None:
    """Inspect and re-queue submission intents."""


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
@click.option("--state", type=click.Choice(["queued", "held", "reconciling", "submitted",
                                           "rejected", "unknown"]),
              help="held: a spend cap holds it (`intents release` sends one past it); "
                   "reconciling: a create without an idempotency key whose outcome is unknown, "
                   "being looked up in the provider's records; unknown: a render may be "
                   "billed and no answer settles it; `intents resolve` settles them.")
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
                              else (i.held_reason or "") if i.state == "held"
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


@intents.command("release")
@click.argument("key")
def intents_release(key: str) -> None:
    """Send a held intent past its spend cap (an operator's decision, logged): it is queued,
    due now, and its cost counts like any other. Exit 1 if no intent of that key is held."""
    account = _on_store(lambda store: store.release_held(key))
    if account is None:
        _stderr(f"error: no held intent with key {key!r} (`vidpoll intents list --state held`)")
        sys.exit(1)
    log.warning("intent %s released past its spend cap by an operator (account %s)", key,
                account)
    click.echo(f"{_cell(key)}: released past the cap, queued, due now")


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
               f"`intents list --state unknown`; {stats['reconciling']} being looked up in "
               "the provider's records)")
