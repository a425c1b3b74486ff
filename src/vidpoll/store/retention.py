"""Retention (`jobs prune`, and `vidpoll serve` for webhook events): finished rows moved to
video_jobs_archive, why the others stay, and old history and webhook events deleted a window at
a time. Queries: retention.sql, webhook.sql."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from vidpoll.store.base import PgBase

ARCHIVED_COLUMNS = (
    "job_id", "state", "next_poll_at", "created_at", "updated_at", "polling_since",
    "finished_at", "polls", "consecutive_errors", "errors_total", "not_found_count",
    "last_polled_at", "last_http_status", "last_error_class", "last_error", "last_request_id",
    "provider_status", "last_response", "claim_token", "claimed_by", "claimed_at",
    "idempotency_key", "account", "poked_at", "result", "result_state", "result_next_at",
    "result_attempts", "result_token", "result_error", "result_fetched_at", "provider",
    "outcome", "handle", "cost", "provider_cost", "provider_cost_unit", "tags", "model",
    "duration_key", "render_s", "poll_reason", "overdue_at", "running_seen_at")
"""The columns prune_finished copies to video_jobs_archive (named there, in the same order)."""
PRUNE_STALE_S = 900.0
"""Work (a result fetch, a delivery) due longer ago than this and untaken: no worker for it."""
PRUNE_KEPT_REASONS = {
    "already_archived": "its job id is already in the archive (tracked again after a prune)",
    "result_unfetched": "its result was due long ago and nobody fetched it: is a worker with "
                        "--fetch-results (the default) running for its account?",
    "result_pending": "its result is being fetched (or retried)",
    "consumer_gone": "a delivery is pending for a consumer no longer registered: "
                     "`vidpoll deliveries forget {consumer}` drops it",
    "delivery_stalled": "a delivery was due long ago and nobody took it: no worker runs that "
                        "consumer (if it is gone: `vidpoll deliveries forget {consumer}`)",
    "delivery_pending": "a delivery is being delivered (or retried)",
    "busy": "it was being written during the prune: the next prune moves it",
}
"""What each reason of prune_kept means, as `jobs prune` prints it ({consumer}: its name)."""


class PgRetention(PgBase):
    """Pruning: video_jobs to its archive, video_job_events, vidpoll_webhook_events."""

    async def prune_finished(self, before: datetime, batch: int = 5000) -> int:
        """Move one batch of rows finished before `before` to video_jobs_archive (the columns
        of ARCHIVED_COLUMNS; unarchived_columns() names any other)."""
        return len(await self._all("prune_finished", {"before": before, "batch": batch}))

    async def prune_kept(self, before: datetime,
                         stale_s: float = PRUNE_STALE_S) -> list[dict[str, Any]]:
        """Why rows finished before `before` are still in video_jobs: (reason, consumer, n,
        oldest_finished) rows, one reason per row; see PRUNE_KEPT_REASONS."""
        return await self._all("prune_kept", {"before": before, "stale_s": stale_s})

    async def unarchived_columns(self) -> list[str]:
        """Columns of video_jobs that prune does not archive (added outside the migrations)."""
        rows = await self._all("unarchived_columns", {"archived": list(ARCHIVED_COLUMNS)})
        return [r["column_name"] for r in rows]

    async def prune_job_events(self, older_than_s: float, batch: int = 5000,
                               progress: Callable[[int], None] | None = None
                               ) -> tuple[int, int]:
        """Delete the history of jobs no longer in video_jobs whose every event is older than
        `older_than_s` (the database's clock), a window of `batch` events per transaction,
        reading the table once; returns (deleted, kept: events that old of jobs still in
        video_jobs, or with newer events)."""
        after, deleted, old = 0, 0, 0
        while True:
            row = await self._one("prune_job_events", {
                "older_than_s": older_than_s, "after_id": after, "batch": batch})
            if row is None or not row["scanned"]:
                break
            after = int(row["last_id"])
            deleted += int(row["deleted"])
            old += int(row["old"])
            if progress is not None and row["deleted"]:
                progress(deleted)
            if not row["old"]:  # ids follow insertion: the rest is newer still
                break
        return deleted, old - deleted

    async def prune_webhook_events(self, older_than_s: float, batch: int = 5000,
                                   progress: Callable[[int], None] | None = None) -> int:
        """Delete the webhook events received more than `older_than_s` ago (the database's
        clock), a window of `batch` per transaction, reading the table once in event id
        order; returns how many."""
        after, deleted = "", 0
        while True:
            row = await self._one("prune_webhook_events", {
                "older_than_s": older_than_s, "after": after, "batch": batch})
            if row is None or not row["scanned"]:
                return deleted
            after = str(row["last_key"])
            deleted += int(row["deleted"])
            if progress is not None and row["deleted"]:
                progress(deleted)

    async def may_delete_webhook_events(self) -> bool:
        """Whether this role may delete webhook events (`vidpoll serve` prunes them if so)."""
        row = await self._one("may_delete_webhook_events", {})
        return bool(row and row["allowed"])
