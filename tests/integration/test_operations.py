"""Operating vidpoll: the job CLI (list, show, stats, poll-now, prune), doctor, Prometheus
metrics, redacted logs. Real PostgreSQL, the CLI as a subprocess, real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from datetime import UTC, datetime, timedelta

import aiohttp
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from vidpoll import logs, metrics
from vidpoll.doctor import FAIL, diagnose
from vidpoll.sql import migrations
from vidpoll.web import make_app, metrics_app, start_server

from ..conftest import API_KEY, free_port, run_until
from .test_process import cli_env, spawn_worker
from .test_submit_process import run_cli

FAILED = [{"sume_status": "failed", "terminal": True}]


async def seed(db_url: str, pending: int, finished: int) -> None:
    """`pending` rows due one second apart, `finished` rows finished one minute apart."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO video_jobs (job_id, state, next_poll_at, account) "
            "SELECT 'p' || lpad(g::text, 6, '0'), 'pending', "
            "now() + make_interval(secs => g), CASE WHEN g %% 3 = 0 THEN 'acme' ELSE "
            "'default' END FROM generate_series(1, %(n)s) g", {"n": pending})
        await conn.execute(
            "INSERT INTO video_jobs (job_id, state, finished_at) "
            "SELECT 'f' || lpad(g::text, 6, '0'), CASE WHEN g %% 2 = 0 THEN 'failed' "
            "ELSE 'completed' END, now() - make_interval(mins => g) "
            "FROM generate_series(1, %(n)s) g", {"n": finished})


async def test_jobs_list_pages_with_a_cursor_in_the_documented_order(db_url, fake_url, store):
    await seed(db_url, 120, 30)
    env = cli_env(db_url, fake_url)
    seen: list[str] = []
    cursor = None
    while True:
        args = ["jobs", "list", "--state", "pending", "--limit", "50", "--json"]
        code, out, err = await run_cli(env, *args, *(["--after", cursor] if cursor else []))
        assert code == 0, err
        page = json.loads(out)
        seen += [r["job_id"] for r in page["jobs"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [f"p{i:06d}" for i in range(1, 121)]  # due order, no gap, no repeat
    rows, _ = await store.list_jobs("failed", limit=5)
    assert [r["job_id"] for r in rows] == ["f000002", "f000004", "f000006", "f000008", "f000010"]
    rows, nxt = await store.list_jobs("pending", account="acme", limit=3)
    assert [r["job_id"] for r in rows] == ["p000003", "p000006", "p000009"] and nxt
    rows, _ = await store.list_jobs(None, limit=2)
    assert [r["job_id"] for r in rows] == ["f000001", "f000002"]
    code, out, _ = await run_cli({**env, "COLUMNS": "200"}, "jobs", "list", "--state",
                                 "finished", "--limit", "3")
    assert code == 0 and "f000001" in out and "next page: --after" in out
    code, _, err = await run_cli(env, "jobs", "list", "--after", "not-a-cursor")
    assert code == 6 and "not a page cursor" in err
    # a cursor of one listing is refused by another, never silently page 1 again
    _, cursor = await store.list_jobs("pending", limit=2)
    code, _, err = await run_cli(env, "jobs", "list", "--state", "failed", "--after", cursor)
    assert code == 6 and "another listing" in err


async def test_every_final_row_gets_finished_at_so_paging_reaches_it(db_url, store):
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # the seed's own loop (or an operator) ends rows without knowing finished_at
        await conn.execute("INSERT INTO video_jobs (job_id, state) VALUES ('seed1', 'failed')")
        await conn.execute("INSERT INTO video_jobs (job_id) VALUES ('seed2'), ('seed3')")
        await conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id <> 'seed1'")
    seen, cursor = [], None
    for _ in range(5):
        rows, cursor = await store.list_jobs("finished", limit=1, cursor=cursor)
        seen += [r["job_id"] for r in rows]
        if cursor is None:
            break
    assert sorted(seen) == ["seed1", "seed2", "seed3"] and cursor is None


async def test_the_list_queries_use_their_indexes_on_a_big_table(db_url, store):
    await seed(db_url, 2000, 100_000)
    from vidpoll.sql import QUERIES

    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ANALYZE video_jobs")
        deep = datetime.now(UTC) - timedelta(days=30)
        for name, params, index in (
                ("list_finished", {"state": "failed", "account": None, "limit": 51,
                                   "after_at": deep, "after_id": "f050000"},
                 "video_jobs_finished_idx"),
                ("list_pending", {"account": None, "limit": 51,
                                  "after_at": datetime.now(UTC) + timedelta(seconds=1500),
                                  "after_id": "p001500"}, "video_jobs_next_poll_at_idx"),
                ("list_all", {"account": None, "limit": 51, "after_id": "f090000"},
                 "video_jobs_pkey")):
            cur = await conn.execute("EXPLAIN " + QUERIES[name], params)
            plan = "\n".join(r[0] for r in await cur.fetchall())
            assert index in plan and "Seq Scan" not in plan, plan
            # a deep page starts where it is: the cursor bounds the index scan itself
            assert "Index Cond" in plan, plan


async def test_poll_now_makes_a_job_due_and_a_listening_worker_reads_it(
        store, fake, fake_url, db_url, make_worker):
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=3600)
    worker = make_worker(idle_max_s=30.0)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.listening and worker.idle, 10)
        code, out, err = await run_cli(cli_env(db_url, fake_url), "jobs", "poll-now", "j1")
        assert code == 0 and "due now" in out, err
        # a third of the idle cap: only the NOTIFY poll-now sends can wake it this soon
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 10)
    finally:
        worker.stop()
        await task
    code, _, err = await run_cli(cli_env(db_url, fake_url), "jobs", "poll-now", "j1")
    assert code == 1 and "no pending job" in err


async def test_prune_moves_finished_rows_to_the_archive_and_keeps_the_rest(
        store, fake_url, db_url):
    await seed(db_url, 5, 40)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # a finished job whose hook has not run yet must stay on the hot table
        await conn.execute("INSERT INTO vidpoll_deliveries (job_id, consumer) "
                           "VALUES ('f000039', 'hook:app:h')")
    cutoff = (datetime.now(UTC) - timedelta(minutes=10, seconds=30)).isoformat()
    code, out, err = await run_cli(cli_env(db_url, fake_url), "jobs", "prune",
                                   "--finished-before", cutoff, "--batch", "7")
    assert code == 0, err
    assert "moved 29 rows" in out  # f000011..f000040 but f000039
    counts = await store.counts()
    assert counts == {"pending": 5, "completed": 6, "failed": 5}
    assert await store.get_job("f000039") is not None
    archived = await store.get_archived_job("f000030")
    assert archived is not None and archived["state"] == "failed"
    assert archived["archived_at"] is not None
    code, out, _ = await run_cli(cli_env(db_url, fake_url), "jobs", "show", "f000030", "--json")
    assert code == 0 and json.loads(out)["archived"] is True


async def test_the_archive_has_every_column_of_the_job_table(db_url):
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cols = {}
        for table in ("video_jobs", "video_jobs_archive"):
            cur = await conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = %s ORDER BY ordinal_position", (table,))
            cols[table] = await cur.fetchall()
    # same names and types, plus archived_at (prune names every column: a column a migration
    # adds to both tables comes after archived_at in the archive)
    assert sorted(cols["video_jobs_archive"]) == sorted(
        [*cols["video_jobs"], ("archived_at", "timestamp with time zone")])


async def test_stats_report_reads_per_second_and_errors_by_class(
        store, fake, fake_url, db_url, make_worker):
    for i in range(6):
        script = ([{"http": 503}] if i % 2 else []) + FAILED
        fake.add_job(f"j{i}", script=script)
        await store.add_job(f"j{i}", delay_s=0)
    worker = make_worker(drain=True)
    await asyncio.wait_for(worker.run(), 20)  # its last flush happens as it stops
    code, out, err = await run_cli(cli_env(db_url, fake_url), "jobs", "stats", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert stats["reads_by_outcome"] == {"final": 6, "unavailable": 3}
    assert stats["reads"] == 9 and stats["reads_per_s"] > 0
    assert stats["states"] == {"failed": 6} and stats["mean_lateness_s"] is not None
    code, out, _ = await run_cli(cli_env(db_url, fake_url), "jobs", "stats")
    assert "errors by class: unavailable 3" in out


async def test_doctor_passes_on_a_healthy_database_and_names_a_missing_index(
        db_url, fake_url):
    env = cli_env(db_url, fake_url)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # big enough that an index is the planner's right choice, and analyzed
        await conn.execute("INSERT INTO video_jobs (job_id, state, next_poll_at) "
                           "SELECT 'x' || g, CASE WHEN g % 20 = 0 THEN 'pending' "
                           "ELSE 'completed' END, now() FROM generate_series(1, 20000) g")
        await conn.execute("ANALYZE video_jobs")
    code, out, err = await run_cli(env, "doctor", "--json")
    findings = {f["check"]: f for f in json.loads(out)}
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        autovacuum = (await (await conn.execute("SHOW autovacuum")).fetchone())[0]
    # a server run with autovacuum off (this machine's is) is a failure doctor must name
    assert findings["autovacuum"]["status"] == ("ok" if autovacuum == "on" else "fail")
    failed = [f["check"] for f in findings.values() if f["status"] == "fail"]
    assert failed == ([] if autovacuum == "on" else ["autovacuum"]), out
    assert code == (0 if autovacuum == "on" else 1), err
    assert findings["schema"]["status"] == "ok"
    assert findings["claim query"]["status"] == "ok", findings["claim query"]
    assert findings["xmin horizon"]["status"] in ("ok", "warn")
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("DROP INDEX video_jobs_account_due_idx")
        await conn.execute("DROP INDEX video_jobs_next_poll_at_idx")
    code, out, _ = await run_cli(env, "doctor")
    assert code == 1 and "claim query" in out and "sequential scan" in out


def test_doctor_rules_on_reports_that_would_be_dangerous():
    report = {
        "schema_version": len(migrations()) - 1, "claim_plan": [],
        "tables": [{"table_name": "video_jobs", "live": 1000, "dead": 50_000,
                    "last_vacuum": None, "options": ["fillfactor=80"]}],
        "indexes": [{"index_name": "video_jobs_next_poll_at_idx", "bytes": 50_000_000,
                     "pending_rows": 1000, "scans": 5}],
        "xmin": [{"holder": "session", "who": "4242", "detail": "psql", "age_s": 7200.0,
                  "xmin_age": 1_000_000}],
        "connections": {"used": 95, "max_connections": 100, "listeners": 0,
                        "notify_queue_usage": 0.9, "autovacuum": "off", "track_counts": "on"},
        "stuck_claims": [{"claimed_by": "host:1:abc", "rows": 3,
                          "since": datetime(2026, 1, 1, tzinfo=UTC)}]}
    report["hot_rows_estimate"] = 100_000
    findings = {f.check: f for f in diagnose(report, len(migrations()))}
    assert findings["schema"].status == FAIL and "vidpoll migrate" in findings["schema"].fix
    assert findings["claim query"].status == FAIL
    assert findings["dead rows: video_jobs"].status == "warn"
    assert findings["autovacuum settings"].status == "warn"
    assert "REINDEX" in findings["index bloat: video_jobs_next_poll_at_idx"].fix
    assert findings["xmin horizon"].status == FAIL and "4242" in findings["xmin horizon"].detail
    assert findings["connections"].status == "warn"
    assert findings["autovacuum"].status == FAIL
    assert findings["listeners"].status == "warn"
    assert "host:1:abc" in findings["stuck claims"].detail
    # a small table is not judged by its plan (a sequential scan is right there)
    report["hot_rows_estimate"] = 30
    assert diagnose(report, len(migrations()))[1].status == "ok"
    # a session whose age this role cannot see is judged by how old its snapshot is
    report["xmin"][0].update(age_s=None, xmin_age=50_000_000)
    report["connections"]["sees_all_sessions"] = False
    findings = {f.check: f for f in diagnose(report, len(migrations()))}
    assert findings["xmin horizon"].status == "warn" and findings["visibility"].status == "warn"


async def test_metrics_scrape_cleanly_and_count_what_the_worker_did(
        store, fake, make_worker):
    # through the registry: a collection first adds the reads still batched (_PollTally)
    before = metrics.REGISTRY.get_sample_value(
        "vidpoll_polls_total", {"account": "default", "outcome": "final"}) or 0.0
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.finished == 1)
    runner, url = await start_server(make_app(store, None), "127.0.0.1", 0)  # `serve`
    worker_runner, worker_url = await start_server(metrics_app(store), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain; version=")
                text = await resp.text()
            async with http.get(f"{worker_url}/metrics") as resp:
                worker_text = await resp.text()
    finally:
        await runner.cleanup()
        await worker_runner.cleanup()
    # a worker exports its own counters, not the table's (a sum over a fleet stays right)
    assert "vidpoll_polls_total" in worker_text and "vidpoll_jobs" not in worker_text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(metrics.metric_names()) <= {n for f in families.values()
                                           for n in [f.name, *(s.name for s in f.samples)]}
    polls = {(s.labels["account"], s.labels["outcome"]): s.value
             for s in families["vidpoll_polls"].samples if s.name == "vidpoll_polls_total"}
    assert polls[("default", "final")] == before + 1
    jobs = {s.labels["state"]: s.value for s in families["vidpoll_jobs"].samples}
    assert jobs["failed"] == 1
    assert API_KEY not in text


async def test_worker_metrics_port_serves_metrics(store, fake, fake_url, db_url):

    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    port = free_port()
    proc = await spawn_worker(cli_env(db_url, fake_url), "--poll-only", "--metrics-port",
                              str(port))
    try:
        async def scraped() -> str:
            async with aiohttp.ClientSession() as http, http.get(
                    f"http://127.0.0.1:{port}/metrics") as resp:
                return await resp.text()

        text = ""
        sample = 'vidpoll_polls_total{account="default",outcome="final"} 1.0'
        async with asyncio.timeout(20):
            # a subprocess: nothing to wait on but its answers (bounded by the timeout)
            while sample not in text:
                with contextlib.suppress(aiohttp.ClientError):
                    text = await scraped()
                await asyncio.sleep(0.1)
        assert list(text_string_to_metric_families(text))
    finally:
        proc.terminate()
        await proc.wait()


def test_log_lines_are_redacted_by_construction(capsys, own_logging):
    secret = "sk-live-0123456789abcdef"
    logs.setup("INFO", "json", secrets=[secret])
    log = logging.getLogger("vidpoll.test")
    try:
        raise RuntimeError(f"GET https://cdn.example/v.mp4?X-Amz-Signature=abc with {secret}")
    except RuntimeError:
        log.exception("job %s: failed with Authorization: Bearer %s", "j1", secret,
                      extra=logs.event(job_id="j1", account="acme", outcome="error",
                                       http_status=500, request_id="req_1"))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    shown = json.loads(line)
    assert secret not in line and "X-Amz-Signature" not in line
    assert shown["job_id"] == "j1" and shown["account"] == "acme"
    assert shown["http_status"] == 500 and shown["request_id"] == "req_1"
    assert "https://cdn.example/v.mp4" in shown["exc"]
    # fields that are not strings are redacted too
    log.warning("odd fields", extra=logs.event(key=[f"https://h/v?sig={secret}"],
                                               consumer=secret.encode()))
    line = capsys.readouterr().err
    assert secret not in line and "sig=" not in line and json.loads(line)["key"] == [
        "https://h/v"]
    logs.setup("INFO", "text", secrets=[secret])
    log.warning("key %s", secret, extra=logs.event(job_id="j2"))
    text = capsys.readouterr().err
    assert secret not in text and "job_id=j2" in text


async def test_counters_survive_a_failed_flush_and_a_stop(store, fake, make_worker,
                                                          monkeypatch, caplog):
    real = store.add_minutes
    failures = []

    async def flaky(rows):
        if not failures:
            failures.append(len(rows))
            raise RuntimeError("permission denied for table vidpoll_minutes")
        await real(rows)

    monkeypatch.setattr(store, "add_minutes", flaky)
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    worker = make_worker(drain=True)
    worker.minutes.add(datetime.now(UTC), "poll", "default", "not_ready", 0.5)
    await worker._flush_minutes(store)  # fails: the count is kept
    await asyncio.wait_for(worker.run(), 20)  # its last flush, as it stops, writes both
    assert failures == [1]
    assert "could not write the per-minute counters" in caplog.text
    rows = await store.minutes_since(5)
    assert sorted((r["outcome"], r["n"]) for r in rows if r["kind"] == "poll") == [
        ("final", 1), ("not_ready", 1)]


async def test_a_json_logging_worker_never_logs_the_key_or_a_signature(
        store, fake, fake_url, db_url):
    fake.add_job("j1", script=[{"http": 500}, {"sume_status": "completed", "terminal": True}])
    await store.add_job("j1", delay_s=0)
    env = cli_env(db_url, fake_url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidpoll.cli", "--log-level", "DEBUG", "--log-format", "json",
        "worker", "--drain", "--poll-only", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = [json.loads(line) for line in err.decode().splitlines()]  # every line is JSON
    assert API_KEY not in err.decode() and "sig=" not in err.decode()
    finished = [x for x in lines if x.get("outcome") == "completed"]
    assert finished and finished[0]["job_id"] == "j1" and finished[0]["account"] == "default"
    failed = [x for x in lines if x.get("outcome") == "server_error"]
    assert failed and failed[0]["http_status"] == 500 and failed[0]["request_id"]
