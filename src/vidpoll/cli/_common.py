"""What every command module shares: one-line errors and exit codes, the settings and the
store, the value formats of tables and JSON, and options whose defaults or choices live in
modules a command only needs once it runs.

Nothing here imports aiohttp, psycopg, rich or the fake provider at module level: `vidpoll
--help` imports every command module (for each one's summary), so those wait until a command
runs (or its own --help shows a default that lives with them)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import importlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

import click

from vidpoll import logs
from vidpoll.errors import (
    ConfigError,
    DatabaseUnavailable,
    IntentRejected,
    InvalidIntent,
    InvalidJobId,
    KeyConflict,
    SchemaError,
    VidpollError,
)

if TYPE_CHECKING:
    from vidpoll.config import Settings
    from vidpoll.models import Intent
    from vidpoll.store import PgStore, Serves

T = TypeVar("T")
log = logging.getLogger("vidpoll.cli")  # the commands' one logger, whatever module they are in

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
EXIT_NOT_COMPLETED = 7
EXIT_WAIT_TIMEOUT = 8
EXIT_PROVIDER_REFUSED = 9


def _stderr(text: str) -> None:
    """One line on stderr in the log's format (json: an object), redacted: `error: ...`,
    `warning: ...` and `note: ...` keep their level, anything else is info."""
    level, sep, rest = text.partition(": ")
    if not sep or level not in ("error", "warning", "note"):
        level, rest = "info", text
    if logs.json_format():  # a JSON line names its logger: no "vidpoll: " before the text
        rest = rest.removeprefix("vidpoll: ")
    click.echo(logs.say(level, rest, "vidpoll.cli"), err=True)


EVENT_LOOP_VARIABLE = "VIDPOLL_EVENT_LOOP"
EVENT_LOOPS = ("auto", "asyncio", "uvloop")
DEFAULT_EVENT_LOOP = "asyncio"
"""VIDPOLL_EVENT_LOOP: `auto` runs on uvloop where it is installed, else on asyncio's own loop;
`asyncio` never uses uvloop; `uvloop` insists on it (exit 2 without it). BENCHMARKS.md ("Loop
choice") has the measurement behind the default."""


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop every command runs on (VIDPOLL_EVENT_LOOP); None: asyncio's own."""
    choice = os.environ.get(EVENT_LOOP_VARIABLE, "").strip().lower() or DEFAULT_EVENT_LOOP
    if choice not in EVENT_LOOPS:
        raise ConfigError(f"{EVENT_LOOP_VARIABLE} must be one of {', '.join(EVENT_LOOPS)}, "
                          f"not {choice[:32]!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(f"{EVENT_LOOP_VARIABLE}=uvloop, but uvloop is not installed "
                              "(pip install uvloop)") from None
        return None
    # typed or not: uvloop is no dependency (the `bench` extra installs it), so mypy may
    # not see it
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the chosen event loop (`_loop_factory`); turn vidpoll's errors into
    one clear line and an exit code."""
    async def with_task_dump() -> T:
        with contextlib.suppress(NotImplementedError, AttributeError):  # not on Windows
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, logs.dump_tasks)
        return await coro

    try:
        try:
            factory = _loop_factory()
        except ConfigError:
            coro.close()  # never awaited: no "coroutine was never awaited" warning
            raise
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(with_task_dump())
    except VidpollError as exc:
        _stderr(f"error: {exc}")
        sys.exit(next((c for t, c in EXIT_CODES.items() if isinstance(exc, t)), 1))
    except LookupError as exc:
        _stderr(f"error: {exc.args[0] if exc.args else exc}")
        sys.exit(1)


def _settings() -> Settings:
    """The environment's settings (exit 2 on a bad one). With DATABASE_URL unset and the
    embedded fallback turned off (VIDPOLL_EMBEDDED=off, `vidpoll --no-embedded`), exit 2 at
    once: before anything is recorded or sent. The embedded server's notice goes to stderr
    from here on (every command that may use it reads its settings here first)."""
    from vidpoll.config import Settings
    from vidpoll.embedded import refusal as embedded_refusal
    from vidpoll.embedded import set_notice as set_embedded_notice

    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        _stderr(f"error: {exc}")
        sys.exit(2)
    logs.add_secrets(settings.secrets())  # variables an accounts file names, too
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.find_root().params.get("no_embedded"):
        settings = dataclasses.replace(settings, embedded=False)
    if settings.database_url is None and not settings.embedded:
        _stderr(f"error: {embedded_refusal()}")
        sys.exit(2)
    set_embedded_notice(lambda line: _stderr(line))
    return settings


async def _open_store(settings: Settings, max_size: int = 4,
                      application_name: str = "vidpoll", serves: Serves | None = None
                      ) -> PgStore:
    from vidpoll.embedded import resolve_database_url
    from vidpoll.store import PgStore

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


async def _until_signalled() -> None:
    """Return on SIGTERM or SIGINT (the servers' way to stop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _compact(value: Any, limit: int = 2000) -> str:
    """A JSON value on one line (never a Python repr), cut at `limit` characters."""
    text = logs.printable(json.dumps(value, default=_json_default, ensure_ascii=False,
                                     separators=(", ", ": ")))
    return text if len(text) <= limit else text[:limit - 1] + "…"


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
    from rich.markup import escape

    return escape(_cell(value))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _warn_line(line: str) -> None:
    _stderr(f"warning: {line}")


def _intent_dict(intent: Intent) -> dict[str, Any]:
    return {f.name: getattr(intent, f.name) for f in dataclasses.fields(intent)}


class Later:
    """`module:NAME`, a value imported on first use: a default or choices an option shows,
    from a module its command needs anyway once it runs (the fake, the store, the worker)."""

    def __init__(self, ref: str) -> None:
        self.module, _, self.name = ref.partition(":")

    def value(self) -> Any:
        """The value (its module imported now, if it was not yet)."""
        found = getattr(importlib.import_module(self.module), self.name)
        return found() if callable(found) else found


class LaterOption(click.Option):
    """An option whose default is a `Later`: read when the command runs or its own --help
    shows it, never while `vidpoll --help` lists the commands."""

    def __init__(self, *args: Any, default_from: str, **kwargs: Any) -> None:
        self.default_from = Later(default_from)
        super().__init__(*args, **kwargs)

    @property  # click's attribute, read through
    def default(self) -> Any:
        """The default, from its module."""
        return self.default_from.value()

    @default.setter
    def default(self, _value: Any) -> None:
        """(click sets it from `default=`, which a LaterOption takes as `default_from=`)."""


if TYPE_CHECKING:
    _Choice = click.Choice[str]
else:
    _Choice = click.Choice  # not subscriptable at run time before click 8.2


class LaterChoice(_Choice):
    """click.Choice of a `Later` sequence (then `extra` choices), read when first needed."""

    def __init__(self, ref: str, extra: Sequence[str] = ()) -> None:
        self.later, self.extra = Later(ref), tuple(extra)
        super().__init__(())

    @property  # click's attribute, read through
    def choices(self) -> tuple[str, ...]:
        """The choices, from their module."""
        return (*self.later.value(), *self.extra)

    @choices.setter
    def choices(self, _value: Sequence[str]) -> None:
        """(click sets it from the choices given, none: they are read later)."""
