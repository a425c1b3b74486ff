"""The append-only job history: state changes and error-class changes, not routine polls."""

from __future__ import annotations

import json

import psycopg

from ..conftest import run_until
from .test_process import cli_env
from .test_submit_process import run_cli


async def test_history_records_changes_not_routine_polls(store, fake, make_worker):
    running = {"sume_status": "running", "terminal": False, "next_poll_after_seconds": 0.05}
    fake.add_job("j1", script=[{"http": 500}, {"http": 500}, running, running, running,
                               {"http": 429, "headers": {"Retry-After": "0.05"}},
                               {"sume_status": "completed", "terminal": True}])
    await store.add_job("j1", delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.finished == 1)
    kinds = [(e["kind"], e["to_state"], e["error_class"])
             for e in await store.job_history("j1")]
    assert kinds == [("tracked", "pending", None),
                     ("error", "pending", "server_error"),  # two 500s: one event
                     ("recovered", "pending", None),         # three reads: one event
                     ("error", "pending", "rate_limited"),
                     ("state", "completed", None)]
    assert fake.reads["j1"] == 7


async def test_history_records_changes_made_outside_vidpoll(store, db_url):
    await store.add_job("j1", delay_s=0)
    with psycopg.connect(db_url, autocommit=True) as conn:  # the seed's loop, or an operator
        conn.execute("UPDATE video_jobs SET state = 'canceled' WHERE job_id = 'j1'")
    [_, last] = await store.job_history("j1")
    assert (last["kind"], last["from_state"], last["to_state"]) == ("state", "pending",
                                                                    "canceled")


async def test_jobs_show_has_the_row_the_intent_and_the_history(store, fake, fake_url,
                                                                db_url, make_submitter):
    await store.add_intent("k1", {"prompt": "x"})
    sub = make_submitter()
    await run_until(sub, lambda: sub.stats.submitted == 1)
    job_id = fake.by_key["k1"]
    code, out, err = await run_cli(cli_env(db_url, fake_url), "jobs", "show", job_id, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["state"] == "pending" and shown["intent"]["key"] == "k1"
    assert [e["kind"] for e in shown["history"]] == ["tracked"]


async def test_jobs_watch(store, fake, fake_url, db_url, make_worker):
    import asyncio

    fake.add_job("j1", script=[{"sume_status": "running", "terminal": False,
                                "next_poll_after_seconds": 0.3},
                               {"sume_status": "completed", "terminal": True}])
    await store.add_job("j1", delay_s=0)
    await store.add_job("j2", delay_s=3600)
    env = cli_env(db_url, fake_url)
    watcher = asyncio.create_task(run_cli(env, "jobs", "watch", "j1", "--timeout", "20"))
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.finished == 1)
    code, out, err = await watcher
    assert (code, out.strip()) == (0, "completed"), err
    assert (await run_cli(env, "jobs", "watch", "j2", "--timeout", "0.5"))[0] == 8
    code, _, err = await run_cli(env, "jobs", "watch", "nope", "--timeout", "5")
    assert code == 1 and "no job 'nope'" in err
