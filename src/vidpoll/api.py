"""The Python API: record a submission, send it once right away, wait for its job to end,
and run completion hooks and downloads in the application's own process.

    async with await Vidpoll.open() as vp:              # DATABASE_URL, SUME_* from the env
        sub = await vp.submit({"prompt": "a lighthouse at dawn"})
        job = await vp.wait(key=sub.key, timeout=900, with_result=True)  # a worker polls
        print(job.state, job.result)

    async with vp.deliveries(on_terminal=publish, download_dir="videos"):
        ...  # publish(job) runs once per job that ends, at least once, with job.files

The intent is committed before any POST; whatever happens next (timeout, crash, 5xx), a
running `vidpoll worker` sends it again with the same Idempotency-Key, never a second clip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from vidpoll.accounts import (
    base_url_setting,
    client_for,
    key_variable_of,
    media_auth,
    provider_of,
    title_of,
)
from vidpoll.aio import cancel_and_wait, wait_event
from vidpoll.config import Settings
from vidpoll.deliver import Deliverer, DeliveryConfig, DeliveryStore, Hook, hook_name
from vidpoll.download import Downloader, inline_fetcher, media_refresher
from vidpoll.embedded import resolve_database_url
from vidpoll.errors import ConfigError, IntentRejected
from vidpoll.models import (
    DEFAULT_ACCOUNT,
    HELD,
    QUEUED,
    RECONCILING,
    REJECTED,
    UNKNOWN,
    Intent,
    Job,
    SubmitOutcome,
)
from vidpoll.policy import RETRYABLE_4XX, AuthPause
from vidpoll.runner import SHUTDOWN_TIMEOUT_S
from vidpoll.spend import NoEstimate, check_tags, held_reason
from vidpoll.store import INTENTS_CHANNEL, JOB_DONE_CHANNEL, POLLS, SUBMITS, PgStore
from vidpoll.submitter import IntentStore, SubmitterConfig, submit_now
from vidpoll.worker import Store

WAIT_FALLBACK_S = 5.0
"""wait() re-reads the row at least this often, so a missed NOTIFY never hangs a caller."""
WORKER_CHECK_S = 5.0
"""wait() looks whether a worker serves the job's account at most this often."""
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Submission:
    """What submit() did: the intent as it stands now, and why if it is still queued."""

    intent: Intent
    new: bool
    reason: str | None = None
    refused: str | None = None
    """Set when Sume refused this process's configuration rather than the request: "key"
    (the API key, HTTP 401/403) or "url" (an answer that is not Sume's: a wrong
    SUME_BASE_URL, a proxy). The intent is kept, queued; `reason` says how it gets sent."""

    @property
    def key(self) -> str:
        """The idempotency key (also the handle to wait on)."""
        return self.intent.key

    @property
    def job_id(self) -> str | None:
        """Sume's job id once the POST was answered 202."""
        return self.intent.job_id

    @property
    def state(self) -> str:
        """queued, submitted or rejected."""
        return self.intent.state


RECONCILING_REASON = (
    "its create's outcome is unknown (no clear answer) and the provider's creates have no "
    "idempotency key, so it is never sent blindly again: a running `vidpoll worker` looks it "
    "up in the provider's own records within seconds, adopts the job found there, sends it "
    "again only when they prove nothing was created, and otherwise parks it as `unknown`")


def unknown_reason(intent: Intent) -> str:
    """Why an `unknown` intent has no job yet, and what settles it."""
    if intent.next_attempt_at.year >= intent.created_at.year + 5 and intent.last_error:
        # parked (a provider without an idempotency key): its look-up says why
        return intent.last_error
    refusal = (f"Sume refused it ({intent.error_code}: {intent.error_message or ''})"
               if intent.error_code else "Sume has not confirmed it")
    return (f"{refusal}, but an earlier attempt's reply was lost, so a render may be billed: a "
            "running `vidpoll worker` sends it again with the same key every minute or two "
            "(a top-up brings its job back); `vidpoll intents resolve KEY --job-id ID | "
            "--not-billed` settles it")


def config_refusal(result: SubmitOutcome | AuthPause | None) -> str | None:
    """"key" if Sume refused the API key, "url" if the answer was not Sume's (a 4xx without
    its error envelope: a wrong base URL, a proxy), else None (a refusal of the request
    itself, an outage, no answer yet: not a setting to fix)."""
    if isinstance(result, AuthPause):
        return "key" if result.http_status in (401, 403) else "url"
    if (isinstance(result, SubmitOutcome) and result.state == QUEUED
            and result.error_code is None and result.http_status is not None
            and 400 <= result.http_status < 500 and result.http_status not in RETRYABLE_4XX):
        return "url"
    return None


_CANNOT_CONNECT = re.compile(r"Cannot connect to host (\S+) ssl:\S+ \[(.*)\]")
_EXCEPTION_PREFIX = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): ")


def for_people(error: str) -> str:
    """A recorded attempt's error (`connection: ClientConnectorError: Cannot connect to host
    h:1 ssl:default [Connect call failed ('h', 1)]`) as a person reads it (`could not connect
    to h:1 (connection refused)`): no exception class names, no Python reprs."""
    kind, sep, detail = error.partition(": ")
    if not sep:
        kind, detail = "", error
    match = _CANNOT_CONNECT.search(detail)
    if match:
        where, why = match.group(1), match.group(2).lower()
        if "dns" in detail.lower() or "name" in why or "nodename" in why:
            reason = "its host name could not be resolved"
        elif "refused" in why or "connect call failed" in why:
            reason = "connection refused"
        elif "unreachable" in why:
            reason = "network unreachable"
        elif "timed out" in why or "timeout" in why:
            reason = "timed out"
        else:
            reason = "connection failed"
        return f"could not connect to {where} ({reason})"
    detail = _EXCEPTION_PREFIX.sub("", detail).strip()
    if kind == "connection":
        return f"connection failed: {detail}" if detail else "connection failed"
    return f"{kind}: {detail}" if kind and detail else detail or kind


def no_worker_notice(what: str, account: str, role: str) -> str:
    """The line wait() gives when no worker serves `account`."""
    does = "polls jobs" if role == POLLS else "sends intents"
    return (f"no `vidpoll worker` that {does} for account {account!r} is connected to this "
            f"database: {what} waits until one starts (still waiting)")


class Vidpoll:
    """One application's handle on the job table (and on Sume, to send right away)."""

    def __init__(self, store: PgStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.wait_reads = 0
        """Rows read by wait() so far (LISTEN is always in place before the first)."""
        self.worker_checks = 0
        """Looks wait() took at who serves an account (each one told what it found)."""

    @classmethod
    async def open(cls, database_url: str | None = None, *,
                   settings: Settings | None = None, max_connections: int = 4) -> Vidpoll:
        """Connect to DATABASE_URL (or the embedded PostgreSQL) with settings from the env."""
        settings = settings or Settings.from_env()
        url = resolve_database_url(database_url or settings.database_url, settings.home)
        return cls(await PgStore.open(url, max_size=max_connections,
                                      prepare=settings.prepared_statements), settings)

    async def __aenter__(self) -> Vidpoll:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the database connections."""
        await self.store.close()

    async def submit(self, payload: dict[str, Any], *, key: str | None = None,
                     priority: int = 0, send_now: bool = True,
                     account: str = DEFAULT_ACCOUNT,
                     tags: Mapping[str, str] | None = None) -> Submission:
        """Record an intent (committed first), then try the POST once if its turn has come.

        `key` defaults to a new UUID; the same key again returns the existing intent (and
        raises KeyConflict if the payload differs). Raises IntentRejected if Sume refused it.
        If Sume refused the configuration instead (the API key, or a base URL that does not
        answer as Sume), the intent stays queued and `Submission.refused` says which.
        The admission cap is `settings.max_active` (VIDPOLL_MAX_ACTIVE). An error raised after
        the intent was committed carries a note with its key: submit again with that key.
        """
        if send_now:
            # before recording: nothing that no one could send
            self.settings.require_api_key(account)
        sub = await self.record(payload, key=key, priority=priority, account=account,
                                explain=False, tags=tags)
        if not (sub.new and send_now):
            return await self.explained(sub)
        try:
            sent = await self.send(sub.key)
        except BaseException as exc:
            exc.add_note(f"the intent is recorded under key {sub.key!r}; submit again with "
                         "that key (or let a worker send it), never with a new one")
            raise
        return Submission(sent.intent, True, sent.reason)

    async def record(self, payload: dict[str, Any], *, key: str | None = None,
                     priority: int = 0, account: str = DEFAULT_ACCOUNT,
                     explain: bool = True, model: str | None = None,
                     tags: Mapping[str, str] | None = None) -> Submission:
        """Record an intent without sending it (a running worker sends it), for `account`'s
        provider; `model`: the model its create runs, required by a provider whose creates
        name one, refused by one whose do not (ConfigError).

        `explain=False` skips the queries behind `reason`, for a caller about to send it.
        `tags`: name -> value, kept with the intent, its job and its cost (`vidpoll spend`).
        """
        key = key or str(uuid.uuid4())
        provider = provider_of(self.settings, account)
        if model is not None and not provider.rules.takes_model:
            raise ConfigError(f"{provider.title} creates name no model (account {account!r}): "
                              "leave out the model; the request body says everything")
        if model is None and provider.rules.takes_model:
            raise ConfigError(f"{provider.title} creates run a model: name one for account "
                              f"{account!r} (`submit --model`)")
        model_problem = getattr(provider.rules, "model_problem", None)
        problem = model_problem(model) if model is not None and callable(model_problem) else None
        if problem:
            raise ConfigError(f"--model for account {account!r} ({provider.title}): {problem}")
        # optional (providers/base.py): a body this provider cannot take with that model
        payload_problem = getattr(provider.rules, "payload_problem", None)
        problem = payload_problem(payload, model) if callable(payload_problem) else None
        if problem:
            raise ConfigError(f"the request body for account {account!r} ({provider.title}): "
                              f"{problem}")
        spend = self.settings.spends([account]).get(account)
        if spend is not None and spend.capped:
            try:  # a capped account sends nothing it cannot price
                spend.estimate(payload, model)
            except NoEstimate as exc:
                raise ConfigError(f"account {account!r} has spend caps and {exc}") from None
        intent, new = await self.store.add_intent(key, payload, priority, account,
                                                  provider=provider.name, model=model,
                                                  tags=check_tags(tags))
        if intent.state == REJECTED:
            raise IntentRejected(key, intent.error_code, intent.error_message)
        sub = Submission(intent, new)
        return await self.explained(sub) if explain else sub

    async def explained(self, sub: Submission) -> Submission:
        """`sub` with the reason it is still queued (or unknown) filled in (if it is)."""
        if sub.intent.state == UNKNOWN and sub.reason is None:
            return Submission(sub.intent, sub.new, unknown_reason(sub.intent))
        if sub.intent.state == RECONCILING and sub.reason is None:
            return Submission(sub.intent, sub.new, RECONCILING_REASON)
        if sub.intent.state == HELD and sub.reason is None:
            return Submission(sub.intent, sub.new, held_reason(sub.intent))
        if sub.intent.state != QUEUED or sub.reason is not None:
            return sub
        return Submission(sub.intent, sub.new, await self.queued_reason(sub.key))

    async def send(self, key: str) -> Submission:
        """Try the POST of a recorded intent once, if its turn has come under the cap and
        its account's create budget has a token."""
        intent = await self.store.get_intent(key)
        if intent is None:
            raise LookupError(f"no intent with key {key!r}")
        account = intent.account
        cap = self.settings.max_active
        config = SubmitterConfig(concurrency=1, max_active=cap,
                                 lease_s=self.settings.http_timeout_s + 10.0,
                                 http_timeout_s=self.settings.http_timeout_s,
                                 first_poll_s=self.settings.first_poll_s,
                                 policy=self.settings.policy, listen=False,
                                 accounts=(account,),
                                 budgets=self.settings.budgets("create", [account]),
                                 spends=self.settings.spends([account]))
        async with client_for(self.settings, account) as client:
            result = await submit_now(self.store, client, config, key, account)
        intent = await self.store.get_intent(key)
        if intent is None:
            raise LookupError(f"no intent with key {key!r}")
        if intent.state == REJECTED:
            raise IntentRejected(key, intent.error_code, intent.error_message)
        reason = refused = None
        if intent.state == QUEUED:
            refused = config_refusal(result)
            if refused is not None:
                reason = self._refusal_reason(key, account, refused, result)
            else:
                reason = await self._why_queued(key, result, cap)
        elif intent.state == UNKNOWN:
            reason = unknown_reason(intent)
        elif intent.state == RECONCILING:
            reason = RECONCILING_REASON
        elif intent.state == HELD:
            reason = held_reason(intent)
        return Submission(intent, False, reason, refused)


    def _refusal_reason(self, key: str, account: str, refused: str,
                        result: SubmitOutcome | AuthPause | None) -> str:
        kept = (f"the intent is kept, queued under key {key!r}: once that is fixed, a running "
                "`vidpoll worker` sends it with the same key, never a second render "
                f"(`vidpoll intents retry {key}` makes it due at once)")
        if refused == "key":
            detail = result.detail if isinstance(result, AuthPause) else "refused"
            return (f"{title_of(self.settings, account)} refused the API key of account "
                    f"{account!r} ({detail}); "
                    f"check {key_variable_of(self.settings, account)}; {kept}")
        status = result.http_status if result is not None else None
        url = client_for(self.settings, account).shown_create_url()
        title, setting = title_of(self.settings, account), base_url_setting(self.settings,
                                                                             account)
        return (f"POST {url} was answered HTTP {status} without {title}'s error envelope: "
                f"{setting} looks wrong (a wrong path or host, or a proxy in between); {kept}")

    async def queued_reason(self, key: str) -> str:
        """A sentence on why an intent is still queued."""
        return await self._why_queued(key, None, self.settings.max_active)

    async def _why_queued(self, key: str, result: SubmitOutcome | AuthPause | None,
                          cap: int | None) -> str:
        later = "a running `vidpoll worker` sends it with the same key"
        if isinstance(result, SubmitOutcome):
            return (f"the provider did not confirm it: "
                    f"{for_people(result.error or 'no answer')}; {later} in about "
                    f"{result.delay_s:.0f}s, so at most one clip is billed")
        intent = await self.store.get_intent(key)
        account = intent.account if intent is not None else DEFAULT_ACCOUNT
        counts = await self.store.admission(account)
        active = counts["pending_jobs"] + counts["unconfirmed"]
        if cap is not None and active >= cap:
            return (f"{active} renders of account {account!r} are active and the limit is "
                    f"{cap} (--max-active); {later}")
        ahead = await self.store.intents_ahead(key)
        if ahead:
            return f"{ahead} queued intents go out before it; {later}"
        if self.settings.budget("create", account) is not None:
            return (f"the create budget of account {account!r} has no token left just now, "
                    f"or another process is sending it; {later}")
        return f"it is not due yet or another process is sending it; {later}"

    async def intent(self, key: str) -> Intent | None:
        """An intent by key."""
        return await self.store.get_intent(key)

    async def job(self, job_id: str) -> Job | None:
        """A tracked job by id."""
        return await self.store.job(job_id)

    @contextlib.asynccontextmanager
    async def deliveries(self, on_terminal: Hook | Mapping[str, Hook] | None = None, *,
                         download_dir: str | os.PathLike[str] | None = None,
                         concurrency: int = 4, hook_timeout_s: float = 300.0,
                         drain: bool = False,
                         shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S
                         ) -> AsyncIterator[Deliverer]:
        """Run completion hooks (and downloads) in this process while the block runs.

        `on_terminal(job)` is called for every job that ends from the first start on, after
        its result is fetched and its files are downloaded, at least once: tracked in the
        database, retried with backoff, re-run after a crash. A sync hook runs in a thread.
        Its deliveries are tracked under `module:qualname` (or the keys of a mapping), so
        keep that name stable. With `drain`, `await d.drained()` waits until nothing is due.
        Leaving the block stops it: what runs may finish within `shutdown_timeout_s`, the rest
        is handed back to other workers (a sync hook still running then ends this process,
        exit 75: see vidpoll.deliver).
        """
        hooks: Mapping[str, Hook] = ({} if on_terminal is None else
                                     on_terminal if isinstance(on_terminal, Mapping) else
                                     {hook_name(on_terminal): on_terminal})
        config = DeliveryConfig(hooks=hooks, concurrency=concurrency,
                                hook_timeout_s=hook_timeout_s, drain=drain,
                                shutdown_timeout_s=shutdown_timeout_s,
                                policy=self.settings.policy)
        async with contextlib.AsyncExitStack() as stack:
            downloader = None
            if download_dir is not None:
                headers, header_hosts = media_auth(self.settings)
                # videos that came back as bytes in the provider's answer (Vertex AI), and
                # links signed anew on each read (Runway), are read again through the
                # account's own client, never stored in the database
                clients = {name: await stack.enter_async_context(client_for(self.settings, name))
                           for name, account in self.settings.accounts.items()
                           if account.api_key}
                downloader = await stack.enter_async_context(
                    Downloader.from_settings(download_dir, self.settings, headers,
                                             header_hosts, max_connections=concurrency,
                                             inline_fetch=inline_fetcher(clients),
                                             fresh_media=media_refresher(clients)))
            deliverer = Deliverer(self.store, config, downloader)
            deliverer.producers_finished()  # the pollers run elsewhere
            await deliverer.prepare()  # registered before the block runs: no job slips by
            task = asyncio.create_task(deliverer.run())
            deliverer.task = task
            try:
                yield deliverer
            finally:
                deliverer.stop()
                await task

    async def wait(self, job_id: str | None = None, *, key: str | None = None,
                   timeout: float | None = None,  # noqa: ASYNC109 (the documented API)
                   with_result: bool = False,
                   on_no_worker: Callable[[str], None] | None = None) -> Job:
        """Block until the job (given by id, or by the key that submits it) is final; with
        `with_result`, also until a completed job's result is fetched (job.result).

        Listens for NOTIFY and re-reads the row at least every 5 s, so a missed notification
        costs seconds, never a hang. When no worker process serving the job's account is
        connected (none sends the intent, or none polls the job), says so within seconds,
        once per absence, and keeps waiting: `on_no_worker(line)`, else a WARNING in the log.
        Raises TimeoutError (naming the job and its key) after `timeout` seconds,
        IntentRejected if the key's submission was rejected, LookupError for an unknown id.
        """
        if (job_id is None) == (key is None):
            raise ConfigError("wait() needs exactly one of job_id or key")
        woken = asyncio.Event()
        listening = asyncio.Event()
        seen = {"job_id": job_id, "key": key}
        tell = on_no_worker or (lambda line: log.warning("%s", line))

        async def listen() -> None:
            with contextlib.suppress(Exception):  # only a hint: the re-reads carry on
                async for note in self.store.notifications((JOB_DONE_CHANNEL,
                                                            INTENTS_CHANNEL)):
                    if not note.channel:
                        listening.set()
                    if note.channel != JOB_DONE_CHANNEL or note.payload in ("", job_id):
                        woken.set()
            listening.set()

        listener = asyncio.create_task(listen())
        watch = _WorkerWatch(self, tell)
        try:
            async with asyncio.timeout(timeout):
                # LISTEN first, then read: a change between the two is never missed
                await wait_event(listening, WAIT_FALLBACK_S)
                while True:
                    woken.clear()
                    if job_id is None:
                        assert key is not None
                        intent = await self.store.get_intent(key)
                        if intent is None:
                            raise LookupError(f"no intent with key {key!r}")
                        if intent.state == REJECTED:
                            raise IntentRejected(key, intent.error_code, intent.error_message)
                        job_id = seen["job_id"] = intent.job_id
                        if job_id is None:
                            await watch.check(intent.account, SUBMITS,
                                              f"the intent under key {key!r}")
                    if job_id is not None:
                        job = await self.store.job(job_id)
                        self.wait_reads += 1
                        if job is None:
                            raise LookupError(f"no job {job_id!r}")
                        seen["key"] = seen["key"] or job.idempotency_key
                        if job.result_settled if with_result else job.is_final:
                            return job
                        await watch.check(job.account, POLLS, f"job {job_id}")
                    await wait_event(woken, WAIT_FALLBACK_S)
        except TimeoutError:
            assert timeout is not None
            raise TimeoutError(f"{_named(seen['job_id'], seen['key'])} is not final after "
                               f"{timeout:g}s; it goes on") from None
        finally:
            await cancel_and_wait(listener)


def _named(job_id: str | None, key: str | None) -> str:
    """`job J (key K)`, `the intent under key K (no job yet)`, as a wait knows them."""
    if job_id is None:
        return f"the intent under key {key!r} (no job yet)"
    return f"job {job_id}" + (f" (key {key!r})" if key else " (no idempotency key)")


class _WorkerWatch:
    """wait()'s look at who serves an account, at most every WORKER_CHECK_S: tells once when
    none does, and again only after one was back."""

    def __init__(self, vp: Vidpoll, tell: Callable[[str], None]) -> None:
        self.vp = vp
        self.tell = tell
        self.checked_at: float | None = None
        self.absent = False

    async def check(self, account: str, role: str, what: str) -> None:
        now = asyncio.get_running_loop().time()
        if self.checked_at is not None and now - self.checked_at < WORKER_CHECK_S:
            return
        self.checked_at = now
        served = await self.vp.store.serving(account, role)
        try:
            if served is None:
                return  # cannot tell: say nothing
            if not served and not self.absent:
                self.tell(no_worker_notice(what, account, role))
            elif served and self.absent:
                log.info("a worker serving account %r is connected now", account)
            self.absent = not served
        finally:
            self.vp.worker_checks += 1


def _a_store_serves_every_runner(store: PgStore) -> tuple[Store, IntentStore, DeliveryStore]:
    """Never called: mypy checks here that PgStore is what each runner asks for (one protocol
    a runner, vidpoll.worker.Store, vidpoll.submitter.IntentStore,
    vidpoll.deliver.DeliveryStore, built from the shared ones in vidpoll.runner and
    vidpoll.results)."""
    return store, store, store
