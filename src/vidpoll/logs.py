"""Log lines for people (`--log-format text`) or machines (`json`), redacted by construction.

Every line passes through `Redactor` after it is formatted, traceback included: the secrets of
this process (API keys, the webhook secret, the dashboard token, read from the environment)
become `<redacted>`, a Bearer token too, and every URL loses its query string (signed links).
No code path can log around it, because the formatter is the only way out.

Events carry fields (`extra=event(job_id=..., outcome=...)`); the JSON form puts them at the
top level of each line, the text form appends them as `key=value`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from vidpoll.media import redact_urls

EVENT_FIELDS = ("job_id", "account", "outcome", "http_status", "request_id", "key",
                "consumer", "worker_id", "error_class")
"""The fields an event may carry (anything else passed in `extra` is ignored)."""
SECRET_VARIABLES = ("VIDPOLL_DASHBOARD_TOKEN", "VIDPOLL_METRICS_TOKEN", "PGPASSWORD")
"""Besides every variable SECRET_NAME matches and the password in DATABASE_URL."""
SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|API_?TOKEN|TOKEN|SECRET|KEY|PASSWORD)(?:_|$)")
"""Variables that hold a provider's key or a webhook secret, whatever the provider:
SUME_API_KEY, SUME_API_KEY_<ACCOUNT>, SUME_WEBHOOK_SECRET, REPLICATE_API_TOKEN, FAL_KEY, and
any `api_key_env` an accounts file names that is spelled like one (Settings.secrets() has
the others)."""
_CONNINFO_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",]+")
_LOOSE_URL_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^:@/\s]*:(.*)@[^@]*$", re.I)
_LOOSE_PASSWORD = re.compile(r"^[^:@/\s]*:(.*)@[^@]*$")


def event(**fields: Any) -> dict[str, Any]:
    """`extra=` for a log call: the event's fields (job_id, account, outcome, ...)."""
    return {f"vp_{k}": v for k, v in fields.items() if v is not None}


MIN_SECRET = 3
"""Secrets at least this long are redacted wherever they appear; a shorter database password
is redacted where it stands as a word of its own (replacing every 'a' would garble every line
and hide nothing)."""


def secrets_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """The values that must never be logged, as this process knows them (at least MIN_SECRET
    characters; `short_secrets_from_env` has the database's shorter ones)."""
    found = [v for v in _env_secrets(env) if len(v) >= MIN_SECRET]
    return sorted(set(found), key=len, reverse=True)  # longest first: no partial leftovers


def short_secrets_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """The database passwords (DATABASE_URL, PGPASSWORD) shorter than MIN_SECRET: redacted
    as whole words only."""
    env = os.environ if env is None else env
    found = [*database_passwords(env.get("DATABASE_URL", "")), env.get("PGPASSWORD", "")]
    return sorted({v for v in found if 0 < len(v) < MIN_SECRET}, key=len, reverse=True)


def _env_secrets(env: Mapping[str, str] | None) -> list[str]:
    env = os.environ if env is None else env
    found = [v.strip() for k, v in env.items()
             if SECRET_NAME.search(k) or k in SECRET_VARIABLES]
    found += [v for k, v in env.items() if k == "PGPASSWORD"]  # as given, spaces included
    return found + database_passwords(env.get("DATABASE_URL", ""))


def _unquoted(text: str) -> list[str]:
    """`text`, and `text` without one pair of surrounding quotes (as docker --env-file and
    some .env readers keep them): a password is looked for in both."""
    forms = [text]
    while len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
        forms.append(text)
    return forms


def database_passwords(url: str) -> list[str]:
    """The password in a libpq URL or conninfo string, as written and decoded (an error may
    quote either), the string in quotes or not."""
    found: set[str] = set()
    for form in _unquoted(url.strip()):
        found |= _passwords(form)
    found |= {unquote(p) for p in found}
    return sorted(p for p in found if p)


def _passwords(url: str) -> set[str]:
    found: set[str] = set()
    if "://" in url:
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            found.add(password)
    match = _CONNINFO_PASSWORD.search(url)
    if match:
        value = match.group(1)
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        found.add(value)
    # malformed forms still carry one: `postgres:PW@host/db` (no //), `u:PW@host`, a URL
    # urlsplit refuses (`postgresql://u:PW@[::1/db`): whatever sits between the first ':'
    # of the authority and its last '@'
    loose = (_LOOSE_URL_PASSWORD.match(url) if "://" in url and not found
             else None if "://" in url or "=" in url else _LOOSE_PASSWORD.match(url))
    if loose and loose.group(1):
        found.add(loose.group(1))
    return found


class Redactor:
    """Removes secrets, Bearer tokens and URL query strings from text; `words` (short
    secrets) only where they stand alone, not inside a longer word."""

    def __init__(self, secrets: Iterable[str], words: Iterable[str] = ()) -> None:
        self.secrets = [s for s in secrets if s]
        self.short = sorted({w for w in words if w}, key=len, reverse=True)
        self.words = [re.compile(rf"(?<![^\W_]){re.escape(w)}(?![^\W_])") for w in self.short]

    def __call__(self, text: str) -> str:
        # URLs first: a secret inside a query string goes with it, whole
        text = _BEARER.sub(r"\1<redacted>", redact_urls(text))
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        for word in self.words:
            text = word.sub("<redacted>", text)
        return text


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                          "\u2066-\u2069]")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    return _SHORT_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100
                                        else f"\\u{ord(char):04x}")


def printable(text: str) -> str:
    """`text` safe for one line of a terminal or a text log: each control character (C0,
    DEL, C1: a newline that would start a forged log line, a carriage return that hides
    what came before, an ESC that moves the cursor or recolours the screen), the Unicode line
    and paragraph separators and the bidirectional controls that reorder what is shown,
    written as a visible escape (`\\n`, `\\x1b`, `\\u202e`). Everything else is kept as it is.

    Text logs, `say()` and the CLI's tables and lines pass job ids, errors and provider
    words through it; JSON lines need not (json escapes them)."""
    return _UNPRINTABLE.sub(_escape, text) if _UNPRINTABLE.search(text) else text


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`, redacted, on one line whatever the message
    and the fields hold (`printable`); a traceback follows on lines of its own, each indented,
    so no text in it can pass for a line of the log."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redact = redactor

    def format(self, record: logging.LogRecord) -> str:
        """The line, with the event's fields appended, redacted, then made printable."""
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        fields = _fields(record)
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        # redacted before it is escaped: an escape must not split a secret it would hide
        text = printable(self.redact(text))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        more = []
        if record.exc_text:
            more.append(record.exc_text)
        if record.stack_info:
            more.append(self.formatStack(record.stack_info))
        if more:
            text += "".join(f"\n  {printable(line)}"
                            for line in self.redact("\n".join(more)).split("\n"))
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the event's fields, exc."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redact = redactor

    def format(self, record: logging.LogRecord) -> str:
        """The JSON line, each string redacted before encoding."""
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name,
            "msg": self.redact(record.getMessage())}
        for key, value in _fields(record).items():
            line[key] = self._clean(value)
        if record.exc_info:
            line["exc"] = self.redact(self.formatException(record.exc_info))
        return json.dumps(line, default=str, ensure_ascii=False)


    def _clean(self, value: Any) -> Any:
        """A field's value with every string in it redacted (numbers stay numbers)."""
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, dict):
            return {str(k): self._clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set):
            return [self._clean(v) for v in value]
        return self.redact(value if isinstance(value, str) else str(value))


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(record, f"vp_{k}") for k in EVENT_FIELDS
            if getattr(record, f"vp_{k}", None) is not None}


_console: dict[str, Any] = {"json": False, "redact": Redactor([])}
_installed: list[Redactor] = []
"""The redactor of the log handler setup() installed (add_secrets extends it)."""


def add_secrets(secrets: Iterable[str]) -> None:
    """Redact these too from now on, in the log and in say(): the keys and webhook secrets
    of accounts an accounts file names, whose variables secrets_from_env cannot know."""
    extra = [s for s in secrets if len(s) >= MIN_SECRET]
    for redactor in (*_installed, _console["redact"]):
        merged = set(redactor.secrets) | set(extra)
        redactor.secrets = sorted(merged, key=len, reverse=True)
SAY_MIN_TOKEN = 8
"""say() redacts the dashboard token only when at least this long (see setup)."""


def say(level: str, message: str, logger: str = "vidpoll") -> str:
    """One line for stderr, as a command tells its user something, in the log's format: as
    text `error: ...`, `warning: ...`, `note: ...` or (info) the message alone; in json an
    object like every log line. Always one line, redacted like the log."""
    text = " ".join(str(message).split())
    redact: Redactor = _console["redact"]
    if not _console["json"]:
        return printable(redact(text if level == "info" else f"{level}: {text}"))
    return json.dumps({"ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                       "level": "info" if level == "note" else level, "logger": logger,
                       "msg": redact(text)},
                      ensure_ascii=False)


def json_format() -> bool:
    """Whether say() writes JSON lines."""
    return bool(_console["json"])


def console(fmt: str, redactor: Redactor | None = None) -> None:
    """say()'s format and redaction (setup() calls it; the CLI calls it alone for an error
    found before its options are read)."""
    if redactor is None:
        redactor = Redactor(secrets_from_env(), short_secrets_from_env())
    # a command's own lines never quote a secret on purpose; a short dashboard token (refused
    # as too short) would only blank out ordinary words ("<redacted>er than 16"). Every other
    # secret, the database password above all, is redacted at any length.
    token = os.environ.get("VIDPOLL_DASHBOARD_TOKEN", "").strip()
    exempt = token if len(token) < SAY_MIN_TOKEN else None
    _console.update(json=fmt == "json",
                    redact=Redactor((s for s in redactor.secrets if s != exempt),
                                    redactor.short))


def setup(level: str, fmt: str, secrets: Iterable[str] | None = None) -> None:
    """Route every log line of the process to stderr through one redacting formatter."""
    words = short_secrets_from_env()
    redactor = Redactor(secrets_from_env() if secrets is None else secrets, words)
    console(fmt, redactor)
    _installed[:] = [redactor]
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(redactor) if fmt == "json" else TextFormatter(redactor))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log is noise; the pool's reconnect warnings repeat what the worker's
    # own "database unavailable ... reachable again" lines say once.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where a task waits: every coroutine of its await chain, outermost first, as
    `function (file:line)`. Task.get_stack() gives one frame for a suspended coroutine."""
    where: list[str] = []
    step: Any = task.get_coro()
    while step is not None:
        frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
        if frame is None:  # a future, or a finished coroutine
            where.append(f"<{type(step).__name__}>")
            break
        where.append(f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}"
                     f":{frame.f_lineno})")
        step = getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
    return where


def dump_tasks() -> None:
    """SIGUSR1 (`kill -USR1 <pid>`): one WARNING line per task of the running loop, with
    where it waits, so a process that looks stuck can say on what."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    log = logging.getLogger("vidpoll.tasks")
    log.warning("SIGUSR1: %d tasks", len(tasks))
    for task in tasks:
        log.warning("task %s waits in %s", task.get_name(), " > ".join(await_chain(task)))
