"""The page cursors of the job listings: URL-safe text that names its listing (a state and
an order) and the row a page ended at, so a cursor of one listing is refused by another.
Pure: the standard library only."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta


class InvalidCursor(ValueError):
    """A page cursor that is malformed, or from another listing."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def encode_cursor(kind: str, at: datetime | None, job_id: str) -> str:
    """The page cursor of listing `kind` that resumes after the row (`at`, `job_id`)."""
    # compact (microseconds since the epoch, exact): a page footer fits 80 columns
    micros = None if at is None else (at - _EPOCH) // timedelta(microseconds=1)
    raw = json.dumps([kind, micros, job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, kind: str) -> tuple[datetime | None, str | None]:
    """A page cursor of listing `kind` back to (time, job id)."""
    if not cursor:
        return None, None
    try:
        got, micros, job_id = json.loads(
            base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        when = None if micros is None else _EPOCH + timedelta(microseconds=int(micros))
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidCursor(f"not a page cursor: {cursor[:40]!r}") from exc
    if got != kind or (kind != "all" and when is None):
        raise InvalidCursor("a cursor of another listing (state or order); start from page 1")
    return when, str(job_id)
