"""The migration files' format (vidpoll.schema): steps, marks for rolling deploys, and the
rules that keep the shipped files online (no long lock on a table the seed's loop uses)."""

from __future__ import annotations

import re

import pytest

from vidpoll.schema import Migration, level_of_each, parse_migration, refusal
from vidpoll.sql import migrations

FILE = """-- header
-- vidpoll: expand
-- vidpoll: step
ALTER TABLE t ADD COLUMN IF NOT EXISTS c text;
-- vidpoll: step no-transaction
-- why
CREATE INDEX CONCURRENTLY IF NOT EXISTS t_c_idx ON t (c);
-- vidpoll: step batched t id
UPDATE t SET c = 'x' WHERE id BETWEEN %(first)s AND %(last)s AND c IS NULL;
"""


def test_a_file_splits_into_its_steps() -> None:
    m = parse_migration(12, "0012_x.sql", FILE)
    assert m.expand and m.oldest_code is None
    assert [s.kind for s in m.steps] == ["transaction", "no-transaction", "batched"]
    assert m.steps[1].index == "t_c_idx"
    assert m.steps[1].sql.startswith("CREATE INDEX CONCURRENTLY")  # comments left out
    assert (m.steps[2].table, m.steps[2].key) == ("t", "id")


def test_a_file_without_directives_is_one_transaction() -> None:
    m = parse_migration(3, "0003_x.sql", "-- a comment\nCREATE TABLE a (i int);\nSELECT 1;\n")
    assert [s.kind for s in m.steps] == ["transaction"]
    assert not m.expand and m.oldest_code is None


@pytest.mark.parametrize(("text", "error"), [
    ("-- vidpoll: step sideways\nSELECT 1;", "unknown step directive"),
    ("-- vidpoll: expnad\nSELECT 1;", "unknown directive"),
    ("-- vidpoll: step\n-- only a comment\n-- vidpoll: step\nSELECT 1;", "empty step"),
    ("-- vidpoll: step no-transaction\nSELECT 1; SELECT 2;", "one statement"),
    ("-- vidpoll: step batched t id\nUPDATE t SET c = 1;", r"%\(first\)s"),
    ("-- vidpoll: step batched t\nUPDATE t SET c = 1;", "unknown step directive"),
    ("-- vidpoll: oldest-code 9\nSELECT 1;", "newer than the migration"),
    ("-- vidpoll: expand\n-- vidpoll: oldest-code 2\nSELECT 1;", "exclusive"),
    ("-- nothing but a comment\n", "no SQL"),
])
def test_a_malformed_file_is_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_migration(5, "0005_x.sql", text)


def m(version: int, *, expand: bool = False, oldest: int | None = None) -> Migration:
    return Migration(version, f"{version:04d}_x.sql", (), expand, oldest)


def test_expand_keeps_the_previous_level_and_contract_raises_it() -> None:
    found = [m(1), m(2, expand=True), m(3), m(4, expand=True), m(5, oldest=4),
             m(6, oldest=2), m(7, expand=True)]
    # 6 says code from 2 works with its own change, but 5's change still needs 4
    assert level_of_each(found) == {1: 1, 2: 1, 3: 3, 4: 3, 5: 4, 6: 4, 7: 4}


def test_refusal_says_what_the_code_needs() -> None:
    assert refusal(11, "0011_x.sql", 10, 11) is None  # the same level
    assert refusal(12, "0012_x.sql", 11, 11) is None  # newer, marked compatible
    why = refusal(12, "0012_x.sql", 12, 11)
    assert why is not None
    assert "newer" in why and "0012_x.sql" in why and "level 12" in why
    assert "upgrade vidpoll" in why
    assert refusal(12, "0012_x.sql", None, 11) is not None  # not recorded: not compatible


# -- the shipped files stay online -------------------------------------------------------------


def shipped() -> list[Migration]:
    return [parse_migration(v, n, t) for v, n, t in migrations()]


def without_bodies(sql: str) -> str:
    """The SQL without $$ function bodies (their statements run later, in triggers)."""
    return re.sub(r"\$\$.*?\$\$", "$$ $$", sql, flags=re.DOTALL)


def test_every_index_is_built_concurrently_in_a_step_of_its_own() -> None:
    for mig in shipped():
        for step in mig.steps:
            code = without_bodies(step.sql)
            builds = re.findall(r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\b(\s+CONCURRENTLY)?", code,
                                re.IGNORECASE)
            drops = re.findall(r"\bDROP\s+INDEX\b(\s+CONCURRENTLY)?", code, re.IGNORECASE)
            for concurrently in builds + drops:
                assert concurrently and step.kind == "no-transaction", (mig.name, step.sql)
            if builds:
                assert step.index is not None, (mig.name, step.sql)  # rebuilt if INVALID


def test_every_row_update_is_batched() -> None:
    for mig in shipped():
        for step in mig.steps:
            code = without_bodies(step.sql)
            if re.search(r"^\s*(UPDATE|DELETE)\b", code, re.IGNORECASE | re.MULTILINE):
                assert step.kind == "batched", (mig.name, step.sql)


def test_checks_are_added_not_valid_then_validated() -> None:
    for mig in shipped():
        later = " ".join(s.sql for s in mig.steps)
        for step in mig.steps:
            for added in re.finditer(r"ALTER TABLE (\w+) ADD CONSTRAINT (\w+)\s+CHECK\b[^;]*;",
                                     step.sql, re.IGNORECASE):
                assert "NOT VALID" in added.group(0), (mig.name, added.group(0))
                assert f"VALIDATE CONSTRAINT {added.group(2)}" in later, mig.name


def volatile_defaults(sql: str) -> list[str]:
    """The defaults of ADD COLUMN clauses in `sql` that are volatile."""
    return [d for d in re.findall(r"ADD COLUMN[^,;]*?\bDEFAULT\b([^,;]*)", without_bodies(sql),
                                  re.IGNORECASE)
            if re.search(r"random|uuid|clock_timestamp|timeofday|nextval", d, re.IGNORECASE)]


def test_no_added_column_has_a_volatile_default() -> None:
    # a volatile default (unlike now(), which is evaluated once) rewrites the whole table under
    # its ACCESS EXCLUSIVE lock: add the column bare, backfill in batches, then SET DEFAULT
    assert volatile_defaults("ALTER TABLE t ADD COLUMN a uuid, ADD COLUMN b timestamptz "
                             "DEFAULT now(), ADD COLUMN c uuid DEFAULT gen_random_uuid()"
                             ) == [" gen_random_uuid()"]
    for mig in shipped():
        for step in mig.steps:
            assert volatile_defaults(step.sql) == [], mig.name


def test_the_latest_shipped_levels() -> None:
    # 0011 only rewrites a trigger function: code of level 10 works beside it
    levels = level_of_each(shipped())
    assert levels[11] == 10
    assert all(levels[v] == v for v in range(1, 11))
