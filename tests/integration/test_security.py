"""The security pass (issue 8), end to end: TLS is verified, secrets reach no log, error,
metric, page or column, oversized webhooks are refused unread, and a worker runs under the
least-privilege role that docs/SECURITY.md sets up (its SQL is run here as written)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import ssl
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import psycopg
import pytest
from aiohttp import web
from psycopg import sql

from vidpoll import logs
from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.errors import DatabaseUnavailable
from vidpoll.fetch_guard import FetchPolicy
from vidpoll.models import ErrorClass
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.webhooks import sign
from vidpoll.store import PgStore, migrate
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.web import make_app, start_server
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY, run_until, url_for

WEBHOOK_SECRET = "whsec-sec-5b1e9d77c2a4"
DASH_TOKEN = "dash-sec-token-0c4f8e2a19"
LEAK_SIG = "leakedsig0a1b2c3d4e5f"
"""A signature inside an error message the fake sends (a provider quoting a signed URL)."""
DONE = {"sume_status": "completed", "terminal": True}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "SECURITY.md"


# -- TLS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no CA signed, made now with the openssl CLI."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=30)
    return cert, key


async def test_a_self_signed_sume_is_refused_as_a_transport_error(self_signed, fake):
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    fake.add_job("tls-1", script=[DONE])
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    base = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        # the server itself works: a client that trusts this very certificate reads the job
        trusting = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http, http.get(
                f"{base}/v1/jobs/tls-1/status", ssl=trusting,
                headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
            assert resp.status == 200 and (await resp.json())["terminal"] is True
        reads_before = fake.reads["tls-1"]
        async with SumeClient(base, API_KEY, timeout_s=5) as client:
            answer = await client.read_status("tls-1")
            created = await client.create_video({"prompt": "x"}, "tls-key-1")
    finally:
        await runner.cleanup()
    for refused in (answer, created):
        assert refused.status is None and refused.transport_error is ErrorClass.CONNECTION
        assert "certificate" in (refused.detail or "").lower(), refused.detail
    # no request got through the handshake, so the key never left this process
    assert fake.reads["tls-1"] == reads_before and fake.creates == 0


# -- webhook bodies ----------------------------------------------------------------------------


@pytest.fixture
async def hook_server(store: PgStore) -> AsyncIterator[tuple[str, int]]:
    runner, url = await start_server(make_app(store, WEBHOOK_SECRET), "127.0.0.1", 0)
    yield url, runner.addresses[0][1]
    await runner.cleanup()


async def status_line(reader: asyncio.StreamReader) -> str:
    return (await reader.readline()).decode("latin-1").strip()


async def test_an_oversized_webhook_is_refused_before_it_is_read(hook_server):
    """A body declared at 1 GiB: the 413 comes back while the client has sent 1 KiB and is
    still 'sending' (reading the body first would wait for the rest forever)."""
    _, port = hook_server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        stamp = f"{time.time():.0f}"
        writer.write(("POST /webhooks/sume HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Content-Length: {1 << 30}\r\nContent-Type: application/json\r\n"
                      f"X-Sume-Timestamp: {stamp}\r\nX-Sume-Event-Id: evt-big\r\n"
                      f"X-Sume-Signature: v1={'0' * 64}\r\n\r\n").encode() + b"{" * 1024)
        await writer.drain()
        assert await asyncio.wait_for(status_line(reader), 10) == (
            "HTTP/1.1 413 Request Entity Too Large")
    finally:
        writer.close()


async def test_a_chunked_webhook_is_cut_off_at_the_limit(hook_server, store):
    """No length to refuse on: the server stops reading once the body passes the limit and
    answers 413, while the client still has most of a 64 MiB body to send."""
    _, port = hook_server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = b"a" * 65536
    sent = 0
    try:
        writer.write(b"POST /webhooks/sume HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
        answer = asyncio.create_task(status_line(reader))
        while not answer.done() and sent < 64 << 20:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            try:
                await asyncio.wait_for(writer.drain(), 3)
            except (ConnectionError, TimeoutError):
                break  # the server stopped reading (or closed): the answer is there
            await asyncio.sleep(0)
        assert await asyncio.wait_for(answer, 10) == "HTTP/1.1 413 Request Entity Too Large"
    finally:
        writer.close()
    assert sent < 64 << 20  # answered long before the body ended
    assert await store.has_pending() is False


# -- secrets -----------------------------------------------------------------------------------


@pytest.fixture
def captured_logs(monkeypatch) -> Iterator[dict[str, io.StringIO]]:
    """Every log line of this process through vidpoll's own formatters, text and JSON, with
    the secrets they learn from the environment (as `vidpoll` sets them up)."""
    monkeypatch.setenv("SUME_API_KEY", API_KEY)
    monkeypatch.setenv("SUME_WEBHOOK_SECRET", WEBHOOK_SECRET)
    monkeypatch.setenv("VIDPOLL_DASHBOARD_TOKEN", DASH_TOKEN)
    redactor = logs.Redactor(logs.secrets_from_env())
    out = {"text": io.StringIO(), "json": io.StringIO()}
    handlers = [logging.StreamHandler(out["text"]), logging.StreamHandler(out["json"])]
    handlers[0].setFormatter(logs.TextFormatter(redactor))
    handlers[1].setFormatter(logs.JsonFormatter(redactor))
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    for h in handlers:
        root.addHandler(h)
    yield out
    for h in handlers:
        root.removeHandler(h)
    root.setLevel(level)


async def dump_tables(url: str) -> dict[str, list[str]]:
    """Every row of every table in the schema, as JSON text (every column, any type)."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        tables = [r[0] for r in await (await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).fetchall()]
        dump = {}
        for table in tables:
            cur = await conn.execute(sql.SQL("SELECT to_jsonb(t)::text FROM {} t").format(
                sql.Identifier(table)))
            dump[table] = [r[0] for r in await cur.fetchall()]
    return dump


async def test_secrets_never_reach_logs_errors_metrics_pages_or_the_database(
        captured_logs, db_url, store, fake, fake_url, client, make_worker, make_submitter,
        tmp_path):
    fake.config.media_expired_first = 1  # one link is dead on arrival: a download error
    leaky = f"https://cdn.example/v.mp4?sig={LEAK_SIG}"
    scripts = {
        # a 401 whose message echoes the key: the worker pauses and probes
        "leak-401": [{"http": 401, "code": "unauthorized",
                      "message": f"invalid API key {API_KEY}"}, DONE],
        # error envelopes that echo the key and a signed URL
        "leak-400": [{"http": 400, "code": "bad_request",
                      "message": f"key {API_KEY} may not read {leaky}"}, DONE],
        "leak-500": [{"http": 500, "code": "internal_error",
                      "message": f"upstream said Authorization: Bearer {API_KEY}"}, DONE],
        # a proxy's HTML page quoting the key
        "leak-502": [{"http": 502, "raw": f"<html>bad gateway for {API_KEY}</html>",
                      "content_type": "text/html"}, DONE],
        # a 200 that is not the end yet, carrying the key in a debug field
        "leak-200": [{"sume_status": "running", "terminal": False, "debug": API_KEY,
                      "next_poll_after_seconds": 0.05}, DONE],
    }
    for job_id, script in scripts.items():
        fake.add_job(job_id, script=script)
        await store.add_job(job_id, delay_s=0)
    for i in range(3):
        await store.add_intent(f"sec-{i}", {"prompt": f"a lighthouse {i}"})
    total = len(scripts) + 3

    async with Downloader(tmp_path / "videos", read_timeout_s=5,
                          policy=FetchPolicy.for_origin(fake_url)) as downloader:
        deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=3.0),
                              downloader)
        delivering = asyncio.create_task(deliverer.run())
        await deliverer.signals.wait_for(lambda: deliverer.idle or delivering.done(), 10)
        worker = make_worker()
        submitter = make_submitter()
        running = [asyncio.create_task(r.run()) for r in (worker, submitter)]
        try:
            await submitter.signals.wait_for(lambda: submitter.stats.submitted == 3, 10)
            await worker.signals.wait_for(
                # >=: the expired link's result is fetched a second time, maybe before the
                # last job ends
                lambda: worker.stats.finished == total and worker.stats.results_fetched >= total,
                15)
            await deliverer.signals.wait_for(
                lambda: deliverer.stats.deliveries_done == total, 15)
        finally:
            for r in (worker, submitter, deliverer):
                r.stop()
            await asyncio.wait_for(asyncio.gather(*running, delivering), 10)
    assert worker.stats.errors.get("auth", 0) >= 1  # the 401 was really answered and paused
    assert fake.auth_failures == 0  # (the key was right: the 401 was the script's)

    # the webhook endpoint and the dashboard, with secrets of their own
    runner, site = await start_server(make_app(store, WEBHOOK_SECRET, dashboard_token=DASH_TOKEN,
                                               loopback_only=False), "127.0.0.1", 0)
    pages: dict[str, str] = {}
    try:
        async with aiohttp.ClientSession() as http:
            for secret in (WEBHOOK_SECRET, "not-the-secret"):  # one valid, one forged
                body = json.dumps({"job_id": "leak-400", "note": leaky}).encode()
                stamp = f"{time.time():.0f}"
                async with http.post(f"{site}/webhooks/sume", data=body, headers={
                        "X-Sume-Timestamp": stamp, "X-Sume-Signature": sign(secret, stamp, body),
                        "X-Sume-Event-Id": f"evt-{secret[:3]}"}) as resp:
                    pages[f"webhook {secret[:3]}"] = await resp.text()
            bearer = {"Authorization": f"Bearer {DASH_TOKEN}"}
            paths = ["/", "/jobs", "/jobs?state=completed", "/jobs?state=pending",
                     "/intents?state=submitted", "/intents?state=queued",
                     "/intents?state=rejected", "/login", "/metrics", "/readyz", "/healthz",
                     *(f"/jobs/view?id={j}" for j in [*scripts, *fake.by_key.values()])]
            for path in paths:
                async with http.get(site + path, headers=bearer,
                                    allow_redirects=False) as resp:
                    assert resp.status == 200, path
                    pages[path] = await resp.text()
    finally:
        await runner.cleanup()
    assert "leak-400" in pages["/jobs/view?id=leak-400"]  # the pages are the real ones
    assert "vidpoll_polls_total" in pages["/metrics"]

    # errors raised to a caller
    errors = [repr(client), repr(store)]
    try:
        await PgStore.open(f"postgresql://vp:{DASH_TOKEN}@127.0.0.1:1/vidpoll", timeout_s=2)
    except DatabaseUnavailable as exc:
        errors += [str(exc), str(exc.__cause__)]
    else:
        pytest.fail("a closed port must not connect")

    signatures = [*fake.media_links, LEAK_SIG]
    assert len(signatures) >= total + 1  # every link handed out, the dead one and its refresh
    secrets = [API_KEY, WEBHOOK_SECRET, DASH_TOKEN, *signatures]
    dump = await dump_tables(db_url)
    # the one place signed links are kept on purpose (docs/SECURITY.md): the result itself;
    # finding them there shows the dump sees what it greps for
    results = "\n".join(r for r in dump["video_jobs"])
    assert all(sig in results for sig in list(fake.media_links)[-total:])
    dump["video_jobs"] = [json.dumps({k: v for k, v in json.loads(r).items() if k != "result"})
                          for r in dump["video_jobs"]]
    # and the errors were recorded: the grep below looks at real error texts
    assert any("bad_request" in r for r in dump["video_job_events"])
    assert "the link expired" in captured_logs["text"].getvalue()  # a URL in an error text

    places = {"text log": captured_logs["text"].getvalue(),
              "json log": captured_logs["json"].getvalue(),
              **{f"page {p}": html for p, html in pages.items()},
              **{f"error {i}": e for i, e in enumerate(errors)},
              **{f"table {t}": "\n".join(rows) for t, rows in dump.items()}}
    assert len(places["json log"].splitlines()) > 5
    leaks = sorted({(where, secret[:6] + "…") for where, text in places.items()
                    for secret in secrets if secret in text})
    assert leaks == [], leaks
    assert not any("sig=" in text for where, text in places.items()), [
        where for where, text in places.items() if "sig=" in text]


async def test_a_provider_echoing_the_key_is_never_stored(store, fake, make_worker, db_url):
    leaky = f"https://cdn.example/v.mp4?sig={LEAK_SIG}"
    fake.add_job("echo", script=[{"http": 400, "code": "bad_request",
                                  "message": f"key {API_KEY} may not read {leaky}"}])
    await store.add_job("echo", delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.reads >= 1)
    dump = await dump_tables(db_url)
    row = (await store.get_job("echo")) or {}
    assert row.get("last_error_class") == "client_error"  # the error was recorded
    leaks = [t for t, rows in dump.items() for r in rows if API_KEY in r or LEAK_SIG in r]
    assert leaks == []


def test_the_database_password_is_redacted_too():
    env = {"DATABASE_URL": "postgresql://vidpoll_worker:s3cr%40t-pw@db.internal/vidpoll",
           "PGPASSWORD": "other-pw-123"}
    redact = logs.Redactor(logs.secrets_from_env(env))
    line = redact("login failed for s3cr@t-pw, s3cr%40t-pw and other-pw-123")
    assert "s3cr" not in line and "other-pw" not in line
    conninfo = {"DATABASE_URL": "host=db user=w password='it''s long' dbname=v"}
    assert logs.database_passwords("host=db password='a b\\'c' user=u") == ["a b'c"]
    assert logs.database_passwords(conninfo["DATABASE_URL"]) == ["it"]  # libpq: '' is not an escape
    assert logs.database_passwords("postgresql://u@h/db") == []


# -- least privilege ---------------------------------------------------------------------------


def documented_sql() -> list[str]:
    """The two ```sql blocks of docs/SECURITY.md: as a superuser, then as the owner."""
    blocks = re.findall(r"```sql\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2, "docs/SECURITY.md must keep its two SQL blocks"
    return blocks


def with_names(block: str, owner: str, worker: str, database: str) -> str:
    block = re.sub(r"\bvidpoll_owner\b", owner, block)
    block = re.sub(r"\bvidpoll_worker\b", worker, block)
    return re.sub(r"\bDATABASE vidpoll\b", f'DATABASE "{database}"', block)


@pytest.fixture
def least_privilege(empty_db: str) -> Iterator[dict[str, str]]:
    """docs/SECURITY.md's roles on an empty database of this test: owner and worker URLs."""
    tag = uuid.uuid4().hex[:8]
    owner, worker = f"vp_owner_{tag}", f"vp_worker_{tag}"
    database = str(psycopg.conninfo.conninfo_to_dict(empty_db)["dbname"])
    as_superuser, _ = documented_sql()
    with psycopg.connect(empty_db, autocommit=True) as admin:
        admin.execute(with_names(as_superuser, owner, worker, database).encode())
    yield {"owner": psycopg.conninfo.make_conninfo(empty_db, user=owner),
           "worker": psycopg.conninfo.make_conninfo(empty_db, user=worker),
           "names": f"{owner} {worker} {database}"}
    with psycopg.connect(empty_db, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(
            sql.Identifier(database)))
        for name in (worker, owner):
            admin.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
    # the database is dropped by empty_db's teardown; roles after it (they own nothing now)
    with psycopg.connect(url_for(empty_db, "postgres"), autocommit=True) as admin:
        for name in (worker, owner):
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


LP_TOKEN = "least-privilege-dashboard-token"


async def test_a_least_privilege_worker_role_does_everything_a_worker_does(
        least_privilege, fake, fake_url, tmp_path):
    owner, worker_url = least_privilege["owner"], least_privilege["worker"]
    owner_name, worker_name, database = least_privilege["names"].split()
    assert await migrate(owner) != []  # the owner creates the schema
    _, as_owner = documented_sql()
    async with await psycopg.AsyncConnection.connect(owner, autocommit=True) as conn:
        await conn.execute(with_names(as_owner, owner_name, worker_name, database).encode())

    store = await PgStore.open(worker_url, max_size=6)  # the schema check passes as worker
    try:
        fake.add_job("lp-1", script=[{"sume_status": "running", "terminal": False,
                                      "next_poll_after_seconds": 0.05}, DONE])
        await store.add_job("lp-1", delay_s=0)
        await store.add_intent("lp-key", {"prompt": "least privilege"})
        async with SumeClient(fake_url, API_KEY, timeout_s=2) as client, \
                Downloader(tmp_path / "videos", read_timeout_s=5,
                           policy=FetchPolicy.for_origin(fake_url)) as downloader:
            deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=3.0),
                                  downloader)
            delivering = asyncio.create_task(deliverer.run())
            await deliverer.signals.wait_for(lambda: deliverer.idle or delivering.done(), 10)
            worker = Worker(store, client, WorkerConfig(policy=FAST_POLICY, lease_s=5,
                                                        vacuum_every_rows=2))
            submitter = Submitter(store, client, SubmitterConfig(
                policy=FAST_POLICY, lease_s=5, http_timeout_s=2, first_poll_s=0,
                max_active=10))
            running = [asyncio.create_task(r.run()) for r in (worker, submitter)]
            try:
                await submitter.signals.wait_for(lambda: submitter.stats.submitted == 1, 10)
                await worker.signals.wait_for(lambda: worker.stats.finished == 2
                                              and worker.stats.results_fetched == 2, 10)
                await deliverer.signals.wait_for(lambda: deliverer.stats.deliveries_done == 2,
                                                 10)
            finally:
                for r in (worker, submitter, deliverer):
                    r.stop()
                await asyncio.wait_for(asyncio.gather(*running, delivering), 10)
        assert worker.stats.db_errors == 0 and submitter.stats.db_errors == 0
        assert worker.stats.vacuums == 0  # not the owner: left to autovacuum (asked once)
        job = await store.get_job("lp-1")
        assert job is not None and job["state"] == "completed" and job["result_state"] == (
            "fetched")
        assert [e["kind"] for e in await store.job_history("lp-1")][-1] == "state"
        assert len(list((tmp_path / "videos").rglob("*.mp4"))) == 2

        # `vidpoll serve` as the worker: a webhook and a dashboard action
        await store.add_job("lp-2", delay_s=3600)
        runner, site = await start_server(make_app(store, WEBHOOK_SECRET), "127.0.0.1", 0)
        try:
            body = json.dumps({"job_id": "lp-2"}).encode()
            stamp = f"{time.time():.0f}"
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{site}/webhooks/sume", data=body, headers={
                        "X-Sume-Timestamp": stamp, "X-Sume-Event-Id": "evt-lp",
                        "X-Sume-Signature": sign(WEBHOOK_SECRET, stamp, body)}) as resp:
                    assert (resp.status, (await resp.json())["status"]) == (200, "poked")
                for path in ("/", "/jobs", "/jobs/view?id=lp-1", "/intents?state=submitted"):
                    async with http.get(site + path) as resp:
                        assert resp.status == 200, path
        finally:
            await runner.cleanup()
        assert await store.resume("lp-1") is None  # a Sume terminal state is never resumed

        # `vidpoll serve` with a token, as the worker: the salt (made by this first start),
        # a session added at sign-in, read on every page, deleted at sign-out
        runner, site = await start_server(make_app(store, None, dashboard_token=LP_TOKEN,
                                                   loopback_only=False), "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                for _ in range(2):  # sign in, a page, sign out; then sign in again
                    async with http.post(site + "/login", data={"token": LP_TOKEN},
                                         allow_redirects=False) as resp:
                        assert resp.status == 303
                    async with http.get(site + "/jobs") as resp:
                        assert resp.status == 200
                        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', await resp.text())
                    assert csrf
                    async with http.post(site + "/logout", data={"csrf": csrf.group(1)},
                                         allow_redirects=False) as resp:
                        assert resp.status == 303
                    async with http.get(site + "/jobs", allow_redirects=False) as resp:
                        assert resp.status == 303  # signed out: to the login form
        finally:
            await runner.cleanup()
    finally:
        await store.close()

    # what the worker role may not do
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(worker_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for statement in ("DROP TABLE video_jobs", "TRUNCATE video_jobs",
                          "ALTER TABLE video_jobs ADD COLUMN x int",
                          "DELETE FROM video_jobs", "DELETE FROM video_job_events",
                          "UPDATE video_job_events SET kind = 'x'",
                          "DROP TRIGGER vidpoll_jobs_changed_event ON video_jobs",
                          "CREATE TABLE public.mine (i int)",
                          "INSERT INTO vidpoll_schema_migrations VALUES (99, 'x')",
                          "VACUUM video_jobs"):
            if statement.startswith("VACUUM"):
                # not an error: a warning, and nothing is vacuumed
                await conn.execute(statement)
                assert any("skipping" in n for n in notices), notices
                continue
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(statement)


async def test_the_worker_role_ends_a_job_without_naming_an_outcome_with_no_new_grant(
        least_privilege):
    """The seed's own loop (or a worker of the previous release) running as the documented
    worker role writes only the state: 0014's trigger reads the outcome words as the schema's
    owner (SECURITY DEFINER), so no grant on vidpoll_outcome_words is needed."""
    owner, worker_url = least_privilege["owner"], least_privilege["worker"]
    owner_name, worker_name, database = least_privilege["names"].split()
    await migrate(owner)
    _, as_owner = documented_sql()
    async with await psycopg.AsyncConnection.connect(owner, autocommit=True) as conn:
        await conn.execute(with_names(as_owner, owner_name, worker_name, database).encode())
    async with await psycopg.AsyncConnection.connect(worker_url, autocommit=True) as conn:
        await conn.execute("INSERT INTO video_jobs (job_id, state, next_poll_at) "
                           "VALUES ('seed-1', 'pending', now())")
        await conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id = 'seed-1'")
        cur = await conn.execute("SELECT outcome FROM video_jobs WHERE job_id = 'seed-1'")
        assert await cur.fetchone() == ("succeeded",)
