"""vidpoll: paid AI video jobs tracked in one Postgres table, polled by any number of workers.

The Python API is `Vidpoll` (submit, wait, deliveries); the CLI is `vidpoll` (see the README).
"""

from vidpoll.api import Submission, Vidpoll
from vidpoll.errors import (
    ConfigError,
    DatabaseUnavailable,
    DiskError,
    DownloadError,
    IntentRejected,
    InvalidIntent,
    InvalidJobId,
    KeyConflict,
    SchemaError,
    UrlExpired,
    VidpollError,
)
from vidpoll.models import Intent, Job, MediaFile

__all__ = [
    "ConfigError",
    "DatabaseUnavailable",
    "DiskError",
    "DownloadError",
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
