"""Render times: the summary a learned schedule plans from, and the overdue jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from vidpoll.schedule import Durations
from vidpoll.store.base import PgBase

RENDER_STATS_MAX_AGE_S = 60.0
"""How old the summary may be before a reader refreshes it (one refresher at a time)."""


class PgDurations(PgBase):
    """The render-time summary (0018) and the jobs running past it."""

    async def render_stats(self, max_age_s: float = RENDER_STATS_MAX_AGE_S,
                           now: datetime | None = None) -> list[Durations]:
        """Every group's render times (refreshed first when older than `max_age_s` and new
        ones ended since), as `Durations`; groups whose quantiles cannot be read are left
        out (a hand-edited row)."""
        out = []
        name = "render_stats" if now is None else "render_stats_at"
        for r in await self._all(name, {"max_age_s": max_age_s, "now": now}):
            try:
                out.append(Durations(r["account"], r["provider"], r["model"],
                                     r["duration_key"], int(r["jobs"]),
                                     tuple(float(q) for q in r["quantiles"])))
            except (TypeError, ValueError):
                continue
        return out

    async def list_overdue(self, account: str | None = None, limit: int = 50,
                           now: datetime | None = None) -> list[dict[str, Any]]:
        """Pending jobs past their `overdue_at`, the longest overdue first."""
        return await self._all("list_overdue", {"account": account, "limit": limit,
                                                "now": now})

    async def count_overdue(self, now: datetime | None = None) -> dict[str, int]:
        """account -> how many of its pending jobs are overdue now."""
        return {r["account"]: int(r["overdue"])
                for r in await self._all("count_overdue", {"now": now})}
