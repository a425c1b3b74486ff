"""The exception tree.

    VidpollError
    ├── ConfigError          a setting is missing or malformed
    ├── DatabaseUnavailable  PostgreSQL cannot be reached (or went away)
    ├── SchemaError          the schema is missing, too old or from a newer vidpoll
    └── InvalidJobId         a job id vidpoll cannot store (empty, too long, NUL)
"""

from __future__ import annotations


class VidpollError(Exception):
    """Base of every error vidpoll raises on purpose."""


class ConfigError(VidpollError):
    """A setting is missing or malformed."""


class DatabaseUnavailable(VidpollError):
    """PostgreSQL cannot be reached; nothing was written."""


class SchemaError(VidpollError):
    """The database schema is missing, too old, or newer than this vidpoll."""


class InvalidJobId(VidpollError):
    """A job id that cannot be stored as given."""
