"""Spend from the command line: a cap holds a submission (exit 0, the reason printed), `intents
list --state held` shows it, `vidpoll spend --json` adds it up, `intents release` sends it past
the cap, and a worker settles every job's cost. The real commands (click, in this process, for
speed), a real PostgreSQL and the fake Sume as its own process over loopback HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.conftest import free_port
from vidpoll.cli import main

KEY = "sk-spend-e2e-0042"


@pytest.fixture
def fake_base() -> Iterator[str]:
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "vidpoll.cli", "fake-sume", "--port",
                             str(port), "--api-key", KEY, "--render-seconds", "0.2",
                             "--next-poll-after", "0.1", "--auto-create"],
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:  # up when it answers (its own start, not a timer)
            try:
                urllib.request.urlopen(f"{base}/_fake/stats", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or fake.poll() is not None:
                    raise
                time.sleep(0.05)
        yield base
    finally:
        fake.terminate()
        fake.wait(10)


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_a_capped_account_from_submit_to_spend(db_url: str, fake_base: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "vidpoll.toml"
    config.write_text('[accounts.default]\nprovider = "sume"\napi_key_env = "SPEND_KEY"\n'
                      f'base_url = "{fake_base}"\nprice_per_job = 0.50\ncap_per_day = 1.0\n')
    for name in ("SUME_API_KEY", "SUME_BASE_URL", "VIDPOLL_MAX_ACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("VIDPOLL_CONFIG", str(config))
    monkeypatch.setenv("VIDPOLL_ALLOW_INSECURE_HTTP", "1")
    monkeypatch.setenv("VIDPOLL_FIRST_POLL_S", "0")
    monkeypatch.setenv("SPEND_KEY", KEY)

    jobs = []
    for key in ("k1", "k2"):
        sent = _run("submit", "--prompt", f"clip {key}", "--key", key, "--tag", "team=ads")
        assert sent.exit_code == 0, sent.output
        jobs.append(sent.stdout.strip())
    held = _run("submit", "--prompt", "clip k3", "--key", "k3", "--tag", "team=ads")
    assert held.exit_code == 0, held.output
    assert held.stdout.startswith("held: key k3: held, not sent: cap_per_day 1.00 USD "
                                  "reached: 1.00 USD used (0.00 USD spent, 1.00 USD reserved)")
    assert "intents release k3" in held.stdout
    listed = _run("intents", "list", "--state", "held")
    assert listed.stdout.startswith("k3\theld\tattempts=0\tcap_per_day 1.00 USD reached")

    report = json.loads(_run("spend", "--json").stdout)
    totals = report["accounts"]["default"]
    assert (totals["spent"], totals["reserved"], totals["held"], totals["creates"]) == (
        0.0, 1.0, 1, 2)
    assert totals["caps"] == {"cap_per_day": 1.0} and totals["currency"] == "USD"
    assert [(t["tag"], t["value"], t["reserved"]) for t in report["by_tag"]] == [
        ("team", "ads", 1.0)]

    released = _run("intents", "release", "k3")
    assert released.exit_code == 0 and "released past the cap" in released.stdout
    again = _run("intents", "release", "k3")
    assert again.exit_code == 1 and "no held intent" in again.stderr
    hook_log = tmp_path / "hooks.log"
    monkeypatch.setenv("HOOK_LOG", str(hook_log))
    drained = _run("worker", "--drain", "--concurrency", "4", "--on-terminal",
                   "tests.integration.hook_fixtures:record_cost")
    assert drained.exit_code == 0, drained.output
    # a hook sees what each job cost: the fake Sume's 50 credits per render, no unit price
    # for credits on this account, so the estimate (0.50) and the figure as given
    seen = {line.split()[1]: line.split(maxsplit=2)[2]
            for line in hook_log.read_text().splitlines()}
    assert len(seen) == 3 and set(jobs) <= set(seen)
    assert set(seen.values()) == {"0.5 50 credit [('team', 'ads')]"}

    report = json.loads(_run("spend", "--json").stdout)
    totals = report["accounts"]["default"]
    # three creates, one of them past the cap by an operator's decision; each job's cost is
    # the provider's figure where the account prices it, else the estimate (0.50)
    assert (totals["creates"], totals["held"], totals["reserved"]) == (3, 0, 0.0)
    shown = json.loads(_run("jobs", "show", jobs[0], "--json").stdout)
    assert shown["state"] == "completed" and shown["tags"] == {"team": "ads"}
    assert shown["cost"] is not None and totals["spent"] == pytest.approx(
        3 * float(shown["cost"]))
    assert shown["intent"]["spend_status"] == "spent"


def test_a_bad_cap_stops_the_command_naming_account_and_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "vidpoll.toml"
    config.write_text('[accounts.ads]\nprovider = "sume"\napi_key_env = "SPEND_KEY"\n'
                      'cap_per_day = 10\n')
    monkeypatch.setenv("VIDPOLL_CONFIG", str(config))
    monkeypatch.setenv("SPEND_KEY", KEY)
    result = _run("spend")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {config}: [accounts.ads] cap_per_day: a cap on spend needs prices "
        f"(price_per_job, or [accounts.NAME.prices]); without them, max_creates_per_hour caps "
        f"the number of creates")
