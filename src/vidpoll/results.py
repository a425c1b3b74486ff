"""Result fetches: a succeeded job's result (its media links and metadata), from a provider
whose results come from a call of their own (`ResultSource.SEPARATE`); a provider whose
results come inline has them written with the status answer and never reaches here.

Fetches are claimed with the poller's read tokens (the account's status budget is one budget
for every read; the worker's claim turn gives results their share first, `RESULTS_TURN`), are
leased and fenced like status reads, and their failures come back later with backoff
(policy.decide_result).
"""

from __future__ import annotations

import logging
import random
from datetime import datetime
from typing import Protocol

from vidpoll import metrics
from vidpoll.errors import DatabaseUnavailable
from vidpoll.models import ClaimedResult, HttpAnswer, ResultOutcome, WorkerStats
from vidpoll.policy import PollPolicy, decide_result
from vidpoll.providers.base import Rules

log = logging.getLogger(__name__)


class ResultStore(Protocol):
    """What result fetches need from the job table."""

    async def claim_results(self, limit: int, lease_s: float, account: str = ...
                            ) -> list[ClaimedResult]:
        """Claim succeeded jobs whose result is due to fetch (leased, committed at once)."""

    async def record_result(self, outcome: ResultOutcome) -> bool:
        """Write one result fetch's outcome, fenced."""


class ResultReader(Protocol):
    """An account's client, as far as results go (vidpoll.providers.base.Client)."""

    @property
    def rules(self) -> Rules: ...

    async def read_result(self, job_id: str) -> HttpAnswer:
        """Read a job's result; failures come back as answers, never raised."""


class ResultFetcher:
    """Claims and fetches results for one process's poller, which spends its read tokens."""

    def __init__(self, store: ResultStore, policy: PollPolicy, stats: WorkerStats) -> None:
        self.store = store
        self.policy = policy
        self.stats = stats
        self._seen: dict[str, bool] = {}

    def seen(self, account: str) -> bool:
        """Whether the last claim of `account` found results to fetch (then they get their
        share of the next turn's tokens first)."""
        return self._seen.get(account, False)

    async def claim(self, account: str, limit: int, lease_s: float) -> list[ClaimedResult]:
        """Up to `limit` due result fetches of `account`."""
        claims = await self.store.claim_results(limit, lease_s, account)
        self._seen[account] = bool(claims)
        return claims

    async def fetch(self, claim: ClaimedResult, reader: ResultReader, now: datetime,
                    rng: random.Random) -> HttpAnswer | None:
        """Read one result and record it (its URLs are never logged); the answer, for the
        server's pause, or None when the fetch failed before an answer. DatabaseUnavailable
        is raised (the lease ends and the fetch is due again); any other error is logged."""
        try:
            # a handle only where the job has one (as the worker's status reads)
            answer = await (reader.read_result(claim.job_id) if claim.handle is None
                            else reader.read_result(claim.job_id, claim.handle))  # type: ignore[call-arg]
            decision = decide_result(claim, answer, now, self.policy, rng, reader.rules)
            if await self.store.record_result(decision):
                metrics.RESULT_FETCHES.labels(decision.state).inc()
                if decision.state == "fetched":
                    self.stats.results_fetched += 1
                else:
                    self.stats.result_retries += decision.state == "pending"
                    log.info("job %s: result %s (%s)", claim.job_id, decision.state,
                             decision.error)
            return answer
        except DatabaseUnavailable:
            raise
        except Exception:
            log.exception("job %s: unexpected error fetching its result; retried when its "
                          "lease ends", claim.job_id)
            return None
