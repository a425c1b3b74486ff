"""Sume lives in its own folder: the core names no provider (issue 19).

Outside the providers' own folders (`vidpoll/providers/<name>/`: Replicate's webhook event is
also called "completed", and so is Luma's end), `demo.py` (which drives every bundled fake in
its own words) and the migrations that came before the seam (0001-0013),
no source file holds Sume's paths, its status fields, its webhook headers or its success word;
the core's modules import no provider's package (import-linter's "The core names no
provider" contract says the same for imports, this test for the text).
"""

from __future__ import annotations

import re
from pathlib import Path

import vidpoll

SRC = Path(vidpoll.__file__).parent
SUME_NAMES = re.compile(r"sume_status|next_poll_after_seconds|X-Sume-|['\"]completed['\"]|"
                        r"/v1/jobs|/v1/videos|job_not_completed", re.IGNORECASE)
SEAM_VERSION = 14
"""The first migration written behind the seam."""


def _outside_sume() -> list[Path]:
    found = []
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".py", ".sql", ".html", ".js", ".toml") or not path.is_file():
            continue
        rel = path.relative_to(SRC)
        if rel.parts[0] == "providers" and len(rel.parts) > 2:
            continue  # a provider's own folder
        if rel.parts == ("demo.py",):
            continue  # the bundled fakes' driver: Luma's fake ends renders as "completed"
        if rel.parts[:2] == ("sql", "migrations") and int(path.name[:4]) < SEAM_VERSION:
            continue
        found.append(path)
    return found


def test_no_sume_name_outside_its_folder() -> None:
    hits = [f"{p.relative_to(SRC)}:{n}: {line.strip()}"
            for p in _outside_sume()
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if SUME_NAMES.search(line)]
    assert hits == []


def test_the_scan_sees_the_core_and_would_see_a_sume_name() -> None:
    files = {str(p.relative_to(SRC)) for p in _outside_sume()}
    assert {"worker.py", "policy.py", "submitter.py", "deliver.py", "models.py",
            "sql/migrations/0014_provider_outcome.sql"} <= files
    assert not any(f.startswith("providers/sume/") for f in files)
    assert SUME_NAMES.search('if state == "completed":')
    assert SUME_NAMES.search("headers['X-Sume-Signature']")
    assert any(SUME_NAMES.search(line)
               for line in (SRC / "providers/sume/rules.py").read_text().splitlines())
