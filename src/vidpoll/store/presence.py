"""Presence: what a worker process serves, said in the application_name of its LISTEN
connection and read back from pg_stat_activity (presence.sql, run by PgOperations.serving).
Pure rules: no I/O here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

APP_NAME_MAX_BYTES = 63
"""PostgreSQL keeps this much of an application_name (NAMEDATALEN - 1)."""
POLLS, SUBMITS = "p", "s"
"""What a worker does for its accounts, as presence_name spells it: reads jobs, sends intents."""
_PRESENCE = re.compile(r"^vidpoll (\S+) serves ([ps]+):([a-z0-9_,]+);$")


@dataclass(frozen=True)
class Serves:
    """What one worker process does (POLLS, SUBMITS or both) for which accounts."""

    roles: str
    accounts: tuple[str, ...]


def app_name(name: str) -> str:
    """`name` cut to what PostgreSQL keeps of an application_name (whole characters)."""
    return name.encode()[:APP_NAME_MAX_BYTES].decode(errors="ignore")


def presence_name(application_name: str, serves: Serves) -> str:
    """The application_name of a worker's LISTEN connection: `vidpoll <worker id> serves
    ps:default,acme;` (p: polls, s: sends intents). If it does not fit in 63 bytes, the plain
    name: the worker is then taken as serving every account (never a false "no worker")."""
    full = f"{application_name} serves {serves.roles}:{','.join(sorted(serves.accounts))};"
    return full if len(full.encode()) <= APP_NAME_MAX_BYTES else app_name(application_name)


def names_serve(names: Sequence[str], account: str, role: str) -> bool:
    """Whether the application_names of a database's sessions show a worker process that does
    `role` (POLLS or SUBMITS) for `account`. A worker's connections are named `vidpoll <worker
    id>` and its LISTEN connection says what it serves (presence_name); a worker without one
    (--no-listen, a name cut at 63 bytes, an older vidpoll) counts as serving everything."""
    known: dict[str, bool] = {}
    for name in names:
        if not name.startswith("vidpoll ") or name.startswith("vidpoll migrate"):
            continue
        match = _PRESENCE.match(name)
        if match is not None:
            known[match.group(1)] = (role in match.group(2)
                                     and account in match.group(3).split(","))
        else:
            known.setdefault(name.split(" ")[1], True)
    return any(known.values())
