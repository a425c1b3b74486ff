"""vidpoll: paid AI video jobs tracked in one Postgres table, polled by any number of workers.

The Python API is `Vidpoll` (submit, wait); the CLI is `vidpoll` (see the README).
"""

from vidpoll.api import Submission, Vidpoll
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
from vidpoll.models import Intent, Job

__all__ = [
    "ConfigError",
    "DatabaseUnavailable",
    "Intent",
    "IntentRejected",
    "InvalidIntent",
    "InvalidJobId",
    "Job",
    "KeyConflict",
    "SchemaError",
    "Submission",
    "Vidpoll",
    "VidpollError",
]
