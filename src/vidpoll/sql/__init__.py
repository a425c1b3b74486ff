"""Loads the named queries once: the .sql files here (the migration runner's, schema.sql) and
beside the store's modules (vidpoll/store/: each domain's queries next to the code that runs
them), and the migration files of migrations/.

A query is a `-- name: <name>` block, from its marker to the next one; a file's lines before
its first marker say what the file holds and belong to no query. Parameters are named
(`%(job_id)s`); `now` may be passed to inject time in tests, else NULL.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _query_folders() -> list[tuple[str, Traversable]]:
    """(label, folder) of every folder holding named queries: this one, then the store's if
    there is one (found as a folder of vidpoll, not imported: the store imports this module)."""
    here = resources.files(__package__)
    store = resources.files("vidpoll").joinpath("store")
    return [("sql", here)] + ([("store", store)] if store.is_dir() else [])


def _load_queries() -> dict[str, str]:
    """Every `-- name:` query of every .sql file in those folders (in each, one file per
    domain or subject); a name defined twice is an error."""
    queries: dict[str, str] = {}
    defined_in: dict[str, str] = {}
    for label, folder in _query_folders():
        files = sorted((e for e in folder.iterdir() if e.name.endswith(".sql")),
                       key=lambda e: e.name)
        for entry in files:
            where = f"{label}/{entry.name}"
            parts = _NAME.split(entry.read_text(encoding="utf-8"))
            for name, body in zip(parts[1::2], parts[2::2], strict=True):
                if name in queries:
                    raise ValueError(f"query {name!r} defined twice (in {defined_in[name]} "
                                     f"and {where})")
                queries[name] = body.strip().rstrip(";")
                defined_in[name] = where
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
