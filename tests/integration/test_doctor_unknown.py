"""`vidpoll doctor` names intents left `unknown` (a render may be billed and is not tracked)."""

from __future__ import annotations

import psycopg

from vidpoll.doctor import OK, WARN, diagnose
from vidpoll.sql import migrations


async def test_doctor_warns_of_unknown_intents_and_says_how_to_settle_them(store, db_url):
    findings = {f.check: f for f in diagnose(await store.doctor(), len(migrations()))}
    assert findings["unknown intents"].status == OK
    await store.add_intent("key-1", {"prompt": "a"})
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE video_intents SET state = 'unknown', "
                     "unknown_outcome_at = now() WHERE idempotency_key = 'key-1'")
    finding = {f.check: f for f in diagnose(await store.doctor(), len(migrations()))}[
        "unknown intents"]
    assert finding.status == WARN and finding.detail.startswith("1 intent(s)")
    assert "intents resolve" in finding.fix
