"""Issue 18, item 5: control characters in a job id or a provider's text cannot forge a line
of the text log nor move the terminal's cursor (`logs.printable`, used by the text formatter,
say() and the CLI's output)."""

from __future__ import annotations

import logging
import sys

import pytest

from vidpoll import logs

FORGED = "2026-01-01 00:00:00,000 ERROR vidpoll.worker: forged"
EVIL_ID = f"vid_1\n{FORGED}\r\x1b[2J\x1b[31mred\x1b[0m\x9b2J\u202eevil\u2028x\x7f\x00"
"""A job id as a hostile provider could choose it: a newline and a forged line, a carriage
return, ESC sequences (clear the screen, recolour), an 8-bit CSI, a right-to-left override,
a line separator, DEL and NUL."""
RAW = ("\n", "\r", "\x1b", "\x9b", "\u202e", "\u2028", "\x7f", "\x00")


def record(msg: str, *args: object, exc: bool = False, **fields: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError(f"provider said: {EVIL_ID}")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("vidpoll.worker", logging.WARNING, __file__, 1, msg, args,
                            exc_info)
    for key, value in logs.event(**fields).items():
        setattr(rec, key, value)
    return rec


def test_printable_escapes_controls_and_keeps_text():
    assert logs.printable("plain é 日本 \\n [bold]") == "plain é 日本 \\n [bold]"
    assert logs.printable("a\nb\rc\td\x1b[2Je\x9bf\u202eg\u2028h\x7fi\x00") == (
        "a\\nb\\rc\\td\\x1b[2Je\\x9bf\\u202eg\\u2028h\\x7fi\\x00")


def test_a_text_log_line_stays_one_line_whatever_the_job_id_and_error_hold():
    formatter = logs.TextFormatter(logs.Redactor(["sk-secret-123"]))
    line = formatter.format(record("job %s: HTTP 400: %s", EVIL_ID, "bad\r\nkey sk-secret-123",
                                   job_id=EVIL_ID, error_class="client_error\x1b[1A"))
    assert "\n" not in line and not any(c in line for c in RAW), repr(line)
    assert not line.startswith(FORGED)
    assert "vid_1\\n2026-01-01" in line and "\\x1b[2J" in line  # shown, escaped
    assert "sk-secret-123" not in line and "<redacted>" in line
    assert line.count("job_id=") == 1


def test_a_traceback_keeps_its_lines_but_none_can_pass_for_a_log_line():
    formatter = logs.TextFormatter(logs.Redactor([]))
    text = formatter.format(record("job %s: status read raised", EVIL_ID, exc=True))
    first, *rest = text.split("\n")
    assert rest and "Traceback" in rest[0] and "ValueError: provider said" in text
    assert all(line.startswith("  ") for line in rest), text  # continuation lines, indented
    assert not any(c in text for c in RAW if c != "\n"), repr(text)
    assert not first.startswith(FORGED) and not any(line.startswith(FORGED) for line in rest)


def test_say_writes_one_printable_line(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(logs, "_console", dict(logs._console))  # console() changes it
    logs.console("text", logs.Redactor([]))
    line = logs.say("error", f"no job {EVIL_ID}")
    assert not any(c in line for c in RAW), repr(line)
