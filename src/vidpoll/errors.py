"""The exception tree.

    VidpollError
    ├── ConfigError          a setting is missing or malformed
    ├── DatabaseUnavailable  PostgreSQL cannot be reached (or went away)
    ├── SchemaError          the schema is missing, too old or from a newer vidpoll
    ├── InvalidJobId         a job id vidpoll cannot store (empty, > 1024 bytes, NUL, surrogate)
    ├── InvalidIntent        an idempotency key or payload vidpoll cannot send or store
    ├── KeyConflict          an idempotency key already recorded with another payload
    ├── IntentRejected       the provider refused a submission for good (402, 422, ...)
    └── DownloadError        a media download attempt failed (retried later)
        ├── UrlExpired       the media host refused the link: fetch the result again
        ├── DiskError        the directory cannot take the file (full, read-only, ...)
        └── DownloadRefused  the fetch rules refuse the URL or the file's size: never retried
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


class InvalidIntent(VidpollError):
    """An idempotency key or payload that cannot be sent or stored; nothing was recorded."""


class KeyConflict(VidpollError):
    """The idempotency key is already recorded with a different payload; nothing was changed."""


class IntentRejected(VidpollError):
    """The provider refused the submission in its own words; `vidpoll intents retry KEY`
    re-queues it."""

    def __init__(self, key: str, code: str | None, message: str | None) -> None:
        super().__init__(f"intent {key!r} was rejected by the provider: {code or 'error'}: "
                         f"{message or 'no message'}")
        self.key = key
        self.code = code
        self.message = message


class DownloadError(VidpollError):
    """A download attempt failed; the delivery is retried later (the `.part` file is kept)."""


class UrlExpired(DownloadError):
    """The media host refused the link (401/403/404/410): fetch the result again for a new one."""


class DiskError(DownloadError):
    """The directory cannot take the file (full, read-only, not a directory, no permission)."""


class DownloadRefused(DownloadError):
    """A URL (or one of its redirects) the fetch rules refuse, or a file over the size limit:
    the delivery fails at once, never retried (vidpoll.fetch_guard)."""
