"""Loads the named queries of the .sql files here and the migration files, once."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load_queries() -> dict[str, str]:
    """Every `-- name:` query of every .sql file in this folder (queries.sql and the files
    beside it, one per subject); a name defined twice is an error."""
    queries: dict[str, str] = {}
    files = sorted((e for e in resources.files(__package__).iterdir()
                    if e.name.endswith(".sql")), key=lambda e: e.name)
    for entry in files:
        parts = _NAME.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise ValueError(f"query {name!r} defined twice (again in {entry.name})")
            queries[name] = body.strip().rstrip(";")
    return queries


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every shipped migration, in order."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_\w+\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..N without gaps, got {versions}")
    return found


QUERIES: dict[str, str] = _load_queries()
