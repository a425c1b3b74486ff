"""vidpoll: paid AI video jobs tracked in one Postgres table, polled by any number of workers.

The Python API is `Vidpoll` (submit, wait, deliveries); the CLI is `vidpoll` (see the README).
The package is typed (PEP 561: `py.typed`).

The names below are imported on first use (PEP 562): `import vidpoll` alone loads neither
aiohttp nor psycopg, so the `vidpoll` command starts fast (`vidpoll --help` never needs them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vidpoll.api import Submission, Vidpoll
    from vidpoll.errors import (
        ConfigError,
        DatabaseUnavailable,
        DiskError,
        DownloadError,
        DownloadRefused,
        IntentRejected,
        InvalidIntent,
        InvalidJobId,
        KeyConflict,
        SchemaError,
        UrlExpired,
        VidpollError,
    )
    from vidpoll.models import Intent, Job, MediaFile

    __version__: str

__all__ = [
    "ConfigError",
    "DatabaseUnavailable",
    "DiskError",
    "DownloadError",
    "DownloadRefused",
    "Intent",
    "IntentRejected",
    "InvalidIntent",
    "InvalidJobId",
    "Job",
    "KeyConflict",
    "MediaFile",
    "SchemaError",
    "Submission",
    "UrlExpired",
    "Vidpoll",
    "VidpollError",
]

# where each public name lives: imported (and then cached in this module) on first use
_HOMES = {
    "Submission": "vidpoll.api",
    "Vidpoll": "vidpoll.api",
    "Intent": "vidpoll.models",
    "Job": "vidpoll.models",
    "MediaFile": "vidpoll.models",
    **{name: "vidpoll.errors" for name in (
        "ConfigError", "DatabaseUnavailable", "DiskError", "DownloadError", "DownloadRefused",
        "IntentRejected", "InvalidIntent", "InvalidJobId", "KeyConflict", "SchemaError",
        "UrlExpired", "VidpollError")},
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use; `__version__` is the installed
    distribution's version (pyproject.toml's, as `vidpoll --version` says)."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("vidpoll")
        except PackageNotFoundError:  # run from a source tree that was never installed
            value = "0+unknown"
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later look-ups never reach __getattr__
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included (for `dir(vidpoll)` and completion)."""
    return sorted({*globals(), *__all__, "__version__"})
