"""The seed's poller, as the seed document gives it (one row per transaction, synchronous
`requests`, a 2 s sleep when nothing is due), with only its URL and key taken from the
environment so it can be pointed at the fake Sume. The baseline of bench/suite.py."""

import os
import time

import psycopg
import requests

H = {"Authorization": f"Bearer {os.environ['SUME_API_KEY']}"}
BASE = os.environ.get("SUME_BASE_URL", "https://api.sume.com")
CLAIM = ("SELECT job_id FROM video_jobs WHERE state='pending' "
         "AND next_poll_at <= now() ORDER BY next_poll_at "
         "FOR UPDATE SKIP LOCKED LIMIT 1")

with psycopg.connect(os.environ["DATABASE_URL"]) as db:
    while True:
        with db.transaction():
            row = db.execute(CLAIM).fetchone()
            if row:
                job_id = row[0]
                s = requests.get(
                    f"{BASE}/v1/jobs/{job_id}/status",
                    headers=H, timeout=15).json()
                if s.get("terminal"):
                    db.execute("UPDATE video_jobs SET state=%s WHERE job_id=%s",
                               (s["sume_status"], job_id))
                else:
                    wait = s.get("next_poll_after_seconds") or 15
                    db.execute("UPDATE video_jobs SET next_poll_at = now() "
                               "+ make_interval(secs => %s) WHERE job_id=%s",
                               (wait, job_id))
        if not row:
            time.sleep(2)
