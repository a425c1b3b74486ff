"""vidpoll: paid AI video jobs tracked in one Postgres table, polled by any number of workers.

The Python API is `Vidpoll` (submit, wait, deliveries); the CLI is `vidpoll` (see the README).
The package is typed (PEP 561: `py.typed`).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

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

try:
    __version__ = _version("vidpoll")
    """The installed distribution's version (pyproject.toml's, as `vidpoll --version` says)."""
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

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
