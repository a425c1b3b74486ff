"""The reconciler against a list that fails now and then (issue 28, item 0): a busy account's
list answers 5 % of its reads with a 5xx, 5 % with a 429 and 5 % with a body cut off mid-JSON,
and a look-up walks several pages of it. Every unknown create must still settle within 30 s
of its outcome turning unknown, with the default settle time (10 s) and skew (120 s): a failed
page is tried again in place (a 429 after its own wait), an interrupted walk resumes from the
page that failed, and one walk serves every unknown create that is due.

Real PostgreSQL, the fake Replicate over loopback, the real client and submitter. The test
waits on observed state; the 30 s is measured on the database's clock (from when each
intent's outcome was recorded unknown to when its job was adopted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from vidpoll.policy import PollPolicy
from vidpoll.providers.replicate.client import ReplicateClient
from vidpoll.providers.replicate.fake import (
    DEFAULT_MODEL,
    DEFAULT_TOKEN,
    DEFAULT_VERSIONS,
    FakeReplicate,
    ReplicateFakeConfig,
    start_fake_replicate,
)
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig

ACCOUNT = "busy"
MODEL = f"{DEFAULT_MODEL}:{DEFAULT_VERSIONS[-1]}"
POLICY = PollPolicy()
"""The shipped policy: settle 10 s, skew 120 s, deadline 600 s, and its backoff (which,
uncapped, took a failed look-up to 125 s)."""
UNKNOWN = 60
OTHERS = 30
"""Predictions of other inputs in the same window (another service on the account)."""
PAGE_SIZE = 12
"""So the window (90 predictions) is 8 pages, as the report's busy account's was."""
SETTLED_WITHIN_S = 30.0
SEEDS = (1,)
"""The fake's seeds run (each ~12 s); seed 2 gave the same result (10.0-11.1 s) when both
ran: `SEEDS = (1, 2)`."""


@asynccontextmanager
async def busy_list(seed: int) -> AsyncIterator[tuple[FakeReplicate, str]]:
    fake = FakeReplicate(ReplicateFakeConfig(
        starting_s=0.2, processing_s=0.5, seed=seed, list_page_size=PAGE_SIZE,
        list_5xx=0.05, list_429=0.05, list_garbled=0.05))
    runner, url = await start_fake_replicate(fake)
    try:
        yield fake, url
    finally:
        await runner.cleanup()


async def test_every_unknown_create_settles_within_30s_on_a_faulty_list(
        store: PgStore) -> None:
    for seed in SEEDS:
        async with busy_list(seed) as (fake, url), ReplicateClient(
                url, DEFAULT_TOKEN, timeout_s=2.0) as client:
            account = f"{ACCOUNT}{seed}"
            for n in range(OTHERS):  # the other service's renders, interleaved in the window
                other = await client.create_video({"prompt": f"other {seed}-{n}"}, "x", MODEL)
                assert other.status == 201
            keys = [f"s{seed}-u{n:02d}" for n in range(UNKNOWN)]
            for key in keys:
                await store.add_intent(key, {"prompt": f"heron {key}", "seed": seed},
                                       account=account, provider="replicate", model=MODEL)
            fake.script_creates(["lose_reply"] * UNKNOWN)  # each billed, its answer lost
            stats = await _settle(store, client, account, keys)
            intents = [await store.get_intent(k) for k in keys]
            waits = [(i.submitted_at - i.unknown_outcome_at).total_seconds()
                     for i in intents if i is not None and i.submitted_at is not None
                     and i.unknown_outcome_at is not None]
            fstats = fake.stats()
            billed = fake.created_inputs()
            print(f"\nfaulty list, seed {seed}: settled {len(waits)}/{UNKNOWN} in "
                  f"{min(waits):.1f}-{max(waits):.1f}s (median "
                  f"{sorted(waits)[len(waits) // 2]:.1f}s); list reads "
                  f"{fstats['list_pages']} (5xx {fstats.get('fault_list_5xx', 0)}, 429 "
                  f"{fstats.get('fault_list_429', 0)}, garbled "
                  f"{fstats.get('fault_list_garbled', 0)}); walks {stats['walks']}, resumed "
                  f"{stats['resumed']}, pages tried again {stats['page_retries']}; creates "
                  f"{fstats['creates']}")
            assert all(i is not None and i.state == "submitted" for i in intents)
            assert len(waits) == UNKNOWN
            assert max(waits) <= SETTLED_WITHIN_S, sorted(waits)[-5:]
            assert stats["adopted"] == UNKNOWN and stats["parked"] == 0
            assert all(n == 1 for n in billed.values())  # never billed twice
            # the faults happened (the test would prove nothing on a clean list)
            assert fstats.get("fault_list_5xx", 0) + fstats.get("fault_list_429", 0) + \
                fstats.get("fault_list_garbled", 0) > 0
            # one walk serves many: far fewer walks than look-ups
            assert stats["walks"] < UNKNOWN // 2, stats


async def _settle(store: PgStore, client: ReplicateClient, account: str,
                  keys: list[str]) -> dict[str, object]:
    """Run one submitter until every intent of `keys` is submitted (or fail after 120 s)."""
    sub = Submitter(store, {account: client}, SubmitterConfig(
        policy=POLICY, lease_s=30.0, http_timeout_s=2.0, first_poll_s=0.0, max_active=None,
        concurrency=16, accounts=(account,)))
    task = asyncio.create_task(sub.run())
    deadline = time.monotonic() + 120

    async def pending() -> list[str]:
        found = [await store.get_intent(k) for k in keys]
        return [k for k, i in zip(keys, found, strict=True) if i is None
                or i.state != "submitted"]
    try:
        while left := await pending():
            assert not task.done(), task
            assert time.monotonic() < deadline, left[:5]
            await asyncio.sleep(0.2)
    finally:
        sub.stop()
        await asyncio.wait_for(task, 15)
    return dataclasses.asdict(sub.stats) | {"walks": sub.lookups.walks,
                                            "resumed": sub.lookups.resumed,
                                            "page_retries": sub.lookups.page_retries}
