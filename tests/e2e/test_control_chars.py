"""Issue 18, item 5: a job id, an error, a provider's word or a hook name holding newlines,
carriage returns, ESC sequences or rich markup is shown escaped by `jobs list`, `jobs show`,
`deliveries list` and `intents list`: one line per row, nothing that moves the cursor or
recolours the terminal, markup as text. The commands run in-process (click's runner) against
this test's database."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

from vidpoll.cli import main

FORGED = "2026-01-01 00:00:00,000 ERROR vidpoll.worker: forged"
EVIL = f"\n{FORGED}\r\x1b[2J\x1b[31m[bold]red[/bold]\x1b[0m\x9b2J\u202e"
EVIL_ID = f"vid\x1b[1A{EVIL}_end"
HOOK = f"hook:app\x1b]0;title\x07:{EVIL}"
RAW = ("\r", "\x1b", "\x9b", "\u202e", "\x07")


@pytest.fixture
def seeded(db_url: str) -> Iterator[dict[str, str]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO video_jobs (job_id, state, account, provider_status, "
                     "last_error_class, last_error, finished_at) "
                     "VALUES (%s, 'failed', %s, %s, %s, %s, now())",
                     (EVIL_ID, "acme", f"failed{EVIL}", "client_error", f"HTTP 400: {EVIL}"))
        conn.execute("INSERT INTO vidpoll_consumers (name) VALUES (%s)", (HOOK,))
        conn.execute("INSERT INTO vidpoll_deliveries (job_id, consumer, state, attempts, "
                     "last_error) VALUES (%s, %s, 'failed', 3, %s)",
                     (EVIL_ID, HOOK, f"RuntimeError: {EVIL}"))
        conn.execute("INSERT INTO video_intents (idempotency_key, payload, state, error_code, "
                     "error_message) VALUES (%s, %s, 'rejected', 'bad', %s)",
                     (f"key{EVIL}", Jsonb({"prompt": EVIL}), f"refused: {EVIL}"))
    yield {"DATABASE_URL": db_url, "COLUMNS": "200"}


def vidpoll(env: dict[str, str], *args: str) -> tuple[list[str], list[str]]:
    """The command's lines, and what is wrong with them: a raw control character, a line
    that begins with the forged text (a newline in the data was written as one)."""
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.stdout
    lines = out.splitlines()
    wrong = [f"raw {c!r}" for c in RAW if c in out]
    wrong += [f"forged line: {line!r}" for line in lines if line.lstrip().startswith(FORGED)]
    return lines, wrong


@pytest.mark.usefixtures("own_logging")
def test_tables_and_lines_show_control_characters_escaped(seeded):
    wrong = {}
    listed, wrong["jobs list"] = vidpoll(seeded, "jobs", "list")
    shown, wrong["jobs show"] = vidpoll(seeded, "jobs", "show", EVIL_ID)
    deliveries, wrong["deliveries list"] = vidpoll(seeded, "deliveries", "list")
    intents, wrong["intents list"] = vidpoll(seeded, "intents", "list")
    assert {k: v for k, v in wrong.items() if v} == {}

    assert sum("vid\\x1b" in line for line in listed) == 1, listed  # its one row
    assert "\\x1b[2J" in "\n".join(shown)
    assert "[bold]red[/bold]" in "\n".join(shown)  # markup shown as text, not applied
    problems = [line for line in deliveries if line.startswith("  ")]
    assert len(problems) == 1 and "\\n2026-01-01" in problems[0], deliveries
    assert problems[0].lstrip().startswith("vid\\x1b[1A\\n"), problems
    assert len(intents) == 1 and "refused: \\n" in intents[0], intents
