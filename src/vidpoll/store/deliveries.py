"""After a job's terminal state: its result, fetched from a small leased queue of its own, and
its deliveries (one per registered consumer: the downloads, a hook), each claimed, extended,
handed back and recorded fenced on its token. Queries: deliveries.sql, deliver_shutdown.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from psycopg.types.json import Jsonb

from vidpoll.models import (
    DEFAULT_ACCOUNT,
    ClaimedDelivery,
    ClaimedResult,
    DeliveryOutcome,
    ResultOutcome,
)
from vidpoll.store.base import PgBase
from vidpoll.store.jobs import job_view


class PgDeliveries(PgBase):
    """Result fetches (video_jobs' result columns), vidpoll_consumers and vidpoll_deliveries."""

    async def claim_results(self, limit: int, lease_s: float, account: str = DEFAULT_ACCOUNT,
                            now: datetime | None = None) -> list[ClaimedResult]:
        """Claim completed jobs whose result is due to fetch (leased, committed at once)."""
        rows = await self._all("claim_results", {"limit": limit, "lease_s": lease_s,
                                                 "account": account, "now": now})
        return [ClaimedResult(r["job_id"], r["result_token"], r["result_attempts"],
                              r["account"], r.get("handle")) for r in rows]

    async def record_result(self, outcome: ResultOutcome, now: datetime | None = None) -> bool:
        """Write one result fetch's outcome, fenced on its token."""
        row = await self._one("record_result", {
            "job_id": outcome.job_id, "token": outcome.token, "state": outcome.state,
            "result": None if outcome.result is None else Jsonb(outcome.result),
            "error": outcome.error, "delay_s": outcome.delay_s, "now": now})
        return row is not None

    async def job_deliveries(self, job_id: str) -> list[dict[str, Any]]:
        """One job's deliveries (downloads, hooks) with their state and last error."""
        return await self._all("job_deliveries", {"job_id": job_id})

    async def register_consumer(self, name: str) -> bool:
        """Deliveries are wanted for `name` from now on; True if it was not registered."""
        row = await self._one("register_consumer", {"name": name})
        return bool(row and row["new"])

    async def claim_deliveries(self, consumer: str, limit: int, lease_s: float,
                               now: datetime | None = None) -> list[ClaimedDelivery]:
        """Lease up to `limit` claimable deliveries of `consumer` (committed at once)."""
        rows = await self._all("claim_deliveries", {"consumer": consumer, "limit": limit,
                                                    "lease_s": lease_s, "now": now})
        return [ClaimedDelivery(job_view(r, r["job_state"], r["files"]), r["consumer"],
                                r["token"], r["attempts"], r["detail"], r["generation"])
                for r in rows]

    async def extend_delivery(self, claim: ClaimedDelivery, lease_s: float) -> bool:
        """Push a running delivery's lease `lease_s` out; False if it is not ours any more."""
        row = await self._one("extend_delivery", {
            "job_id": claim.job.job_id, "consumer": claim.consumer, "token": claim.token,
            "lease_s": lease_s})
        return row is not None

    async def release_delivery(self, claim: ClaimedDelivery, delay_s: float,
                               error: str | None = None) -> bool:
        """Hand a running delivery back (its worker is stopping): due in `delay_s`, its try
        given back unless `error` says why it counts; fenced on its token; False if not ours."""
        row = await self._one("release_delivery", {
            "job_id": claim.job.job_id, "consumer": claim.consumer, "token": claim.token,
            "delay_s": delay_s, "error": error})
        return row is not None

    async def record_delivery(self, outcome: DeliveryOutcome) -> bool:
        """Write one delivery attempt's outcome, fenced on its token."""
        row = await self._one("record_delivery", {
            "job_id": outcome.job_id, "consumer": outcome.consumer, "token": outcome.token,
            "state": outcome.state, "delay_s": outcome.delay_s, "error": outcome.error,
            "detail": None if outcome.detail is None else Jsonb(outcome.detail),
            "refresh_result": outcome.refresh_result, "generation": outcome.generation})
        return row is not None

    async def next_delivery_due_in(self, consumers: Sequence[str]) -> float | None:
        """Seconds until the next claimable delivery is due; None if none."""
        row = await self._one("next_delivery_due_in", {"consumers": list(consumers)})
        return None if row is None else cast(float | None, row["next_due_in_s"])

    async def pending_deliveries(self, consumers: Sequence[str], within_s: float
                                 ) -> tuple[int, int]:
        """(deliveries not done, of which due within `within_s`)."""
        row = await self._one("pending_deliveries", {"consumers": list(consumers),
                                                     "within_s": within_s})
        assert row is not None
        return int(row["pending"]), int(row["due_soon"])

    async def delivery_counts(self) -> list[dict[str, Any]]:
        """Per registered consumer: pending, retrying, done, failed, oldest pending."""
        return await self._all("delivery_counts", {})

    async def failed_deliveries(self, consumer: str | None = None, limit: int = 20
                                ) -> list[dict[str, Any]]:
        """Failed and retrying deliveries with their last error, newest first."""
        return await self._all("failed_deliveries", {"consumer": consumer, "limit": limit})

    async def retry_deliveries(self, consumer: str | None = None, job_id: str | None = None
                               ) -> list[dict[str, Any]]:
        """Failed (or backing-off) deliveries due now with fresh tries; returns them."""
        return await self._all("retry_deliveries", {"consumer": consumer, "job_id": job_id})

    async def forget_consumer(self, name: str) -> tuple[int, int]:
        """Unregister a consumer; (consumers removed, undone deliveries removed)."""
        row = await self._one("forget_consumer", {"name": name})
        assert row is not None
        return int(row["consumers"]), int(row["dropped"])

    async def delivery_backlog(self) -> list[dict[str, Any]]:
        """Per consumer: pending, retrying and failed deliveries (cheap: partial indexes)."""
        return await self._all("delivery_backlog", {})
