"""Security rules that need no database and no socket: plain http:// only to loopback, and SQL
never built from values (a scanner over queries.sql, the migrations and every module, shown
to catch the regressions it is there for)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from vidpoll.config import Settings, check_base_url, loopback_hostname
from vidpoll.errors import ConfigError
from vidpoll.sql import QUERIES, migrations

SRC = Path(__file__).resolve().parents[2] / "src" / "vidpoll"

# -- plain http:// only to loopback ------------------------------------------------------------


@pytest.mark.parametrize("base", [
    "http://localhost:8080", "http://LOCALHOST", "http://127.0.0.1:9000/api",
    "http://127.8.9.10", "http://[::1]:8800", "https://api.sume.com",
    "https://10.0.0.5:8443/prefix", "https://localhost"])
def test_https_anywhere_and_http_on_loopback_are_accepted(base: str) -> None:
    assert Settings.from_env({"SUME_BASE_URL": base}).sume_base_url == base


@pytest.mark.parametrize("base", [
    "http://api.sume.com", "http://10.0.0.5:8080", "http://0.0.0.0:8080", "http://[::]:80",
    "http://192.168.1.20/v1", "http://localhost.evil.example",
    "http://localhost@evil.example",  # userinfo: the host is evil.example
    "http://127.0.0.1.nip.io",  # resolves to loopback, but names can be made to resolve anywhere
    "http://[::ffff:10.0.0.1]"])
def test_plain_http_beyond_loopback_is_refused(base: str) -> None:
    with pytest.raises(ConfigError, match="VIDPOLL_ALLOW_INSECURE_HTTP=1") as caught:
        Settings.from_env({"SUME_BASE_URL": base})
    assert "clear text" in str(caught.value)


@pytest.mark.parametrize("allow", ["1", "on", "true"])
def test_plain_http_beyond_loopback_when_explicitly_allowed(allow: str) -> None:
    env = {"SUME_BASE_URL": "http://sume.internal:8080", "VIDPOLL_ALLOW_INSECURE_HTTP": allow}
    assert Settings.from_env(env).sume_base_url == "http://sume.internal:8080"


@pytest.mark.parametrize("allow", ["0", "off", ""])
def test_the_allowance_is_off_unless_set(allow: str) -> None:
    env = {"SUME_BASE_URL": "http://sume.internal:8080", "VIDPOLL_ALLOW_INSECURE_HTTP": allow}
    with pytest.raises(ConfigError, match="not loopback"):
        Settings.from_env(env)


def test_a_garbled_allowance_is_an_error_not_a_yes() -> None:
    with pytest.raises(ConfigError, match="VIDPOLL_ALLOW_INSECURE_HTTP"):
        Settings.from_env({"SUME_BASE_URL": "http://sume.internal",
                           "VIDPOLL_ALLOW_INSECURE_HTTP": "please"})


def test_loopback_hostname_rules() -> None:
    assert loopback_hostname("127.255.255.254") and loopback_hostname("::1")
    assert not loopback_hostname("128.0.0.1") and not loopback_hostname("::2")
    assert not loopback_hostname("localhost6")  # names other than localhost are not trusted
    with pytest.raises(ConfigError, match="no host"):
        check_base_url("http://:8080")


# -- SQL is never built from values ------------------------------------------------------------

EXECUTORS = {"execute", "executemany", "stream", "copy"}
"""Methods of psycopg connections and cursors that take a query."""
NAMED_QUERY_FUNCTIONS = {"_q"}
"""Functions that return a named query of queries.sql (nothing else)."""
QUERY_VARIABLES = {("migrate", "sql")}
"""(function, variable) pairs known to hold shipped SQL text: `migrate` runs each migration
file's text. A new entry here needs a reason as good as that one."""


def _name_of(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_text(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)


def _composed_is_safe(node: ast.Call) -> bool:
    """`SQL("literal")`, or `SQL("literal").format(Identifier(...), ...)`."""
    if _name_of(node.func) == "SQL":
        return len(node.args) == 1 and not node.keywords and _is_text(node.args[0])
    if isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = node.func.value
        parts = [*node.args, *(k.value for k in node.keywords)]
        return (isinstance(base, ast.Call) and _name_of(base.func) == "SQL"
                and _composed_is_safe(base)
                # Identifier quotes whatever it is given: a value can only name, never inject
                and all(isinstance(p, ast.Call) and (_name_of(p.func) == "Identifier"
                                                     or _composed_is_safe(p))
                        for p in parts))
    return False


def _query_is_safe(node: ast.expr, function: str) -> bool:
    if _is_text(node):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        # literal + named query (EXPLAIN of the claim): text only, no value can get in
        return _query_is_safe(node.left, function) and _query_is_safe(node.right, function)
    if isinstance(node, ast.Call):
        if _name_of(node.func) in NAMED_QUERY_FUNCTIONS:
            return True
        return _composed_is_safe(node)
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Name) and node.value.id == "QUERIES"
    if isinstance(node, ast.Name):
        return (function, node.id) in QUERY_VARIABLES
    return False  # f-strings, %, .format on str, str(), variables: a value may be in there


def unsafe_sql(source: str, filename: str = "<snippet>") -> list[str]:
    """Every place in `source` where a query handed to psycopg (or to `sql.SQL`) may be built
    from a value: `file:line: code`."""
    tree = ast.parse(source, filename)
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> Iterator[str]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Call):
            name = _name_of(node.func)
            query = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg == "query"), None)
            if (name in EXECUTORS and isinstance(node.func, ast.Attribute) and query is not None
                    and not _query_is_safe(query, function)):
                yield f"{filename}:{node.lineno}: {ast.unparse(node)[:120]}"
            if name == "SQL" and not _composed_is_safe(node):
                yield f"{filename}:{node.lineno}: {ast.unparse(node)[:120]}"
        for child in ast.iter_child_nodes(node):
            yield from visit(child, function)

    found.extend(visit(tree, "<module>"))
    return found


def test_no_module_builds_sql_from_values() -> None:
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 20, "the scan must see the package"
    found = [hit for path in modules
             for hit in unsafe_sql(path.read_text(encoding="utf-8"),
                                   str(path.relative_to(SRC)))]
    assert found == [], "SQL built from values:\n" + "\n".join(found)


def test_the_scan_sees_every_query_call() -> None:
    """The scanner must be looking at the real calls (if the store stopped calling `execute`,
    the test above would pass for nothing)."""
    calls = [n for path in sorted((SRC / "store").glob("*.py"))
             for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and _name_of(n.func) in EXECUTORS
             and isinstance(n.func, ast.Attribute)]
    assert len(calls) >= 20


@pytest.mark.parametrize("snippet", [
    'cur.execute(f"SELECT * FROM video_jobs WHERE job_id = \'{job_id}\'")',
    'cur.execute("SELECT * FROM video_jobs WHERE job_id = \'%s\'" % job_id)',
    'cur.execute("SELECT * FROM video_jobs WHERE job_id = \'{}\'".format(job_id))',
    'cur.execute("SELECT * FROM video_jobs WHERE job_id = \'" + job_id + "\'")',
    'cur.execute(_q("claim_due") + " AND account = " + account)',
    'cur.execute(query)',
    'cur.execute(query=f"DELETE FROM {table}")',
    'conn.execute(sql.SQL(f"LISTEN {channel}"))',
    'conn.execute(sql.SQL("LISTEN {}").format(sql.Literal(channel)))',
    'conn.execute(sql.SQL("DROP DATABASE {}").format(name))',
    'conn.execute(psycopg.sql.SQL("SELECT " + column))',
    'async def f():\n    await cur.executemany("INSERT INTO t VALUES (" + v + ")", rows)',
    'conn.execute(str(job_id))',
])
def test_the_scanner_flags_sql_built_from_values(snippet: str) -> None:
    assert unsafe_sql(snippet), snippet


@pytest.mark.parametrize("snippet", [
    'cur.execute(_q("claim_due"), {"limit": limit})',
    'cur.execute("SET LOCAL lock_timeout = \'60s\'")',
    'cur.execute("EXPLAIN (FORMAT JSON) " + _q("claim_due"), params)',
    'cur.execute(QUERIES["claim_due"], params)',
    'conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))',
    'conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format('
    'sql.Identifier(name)))',
    'def migrate():\n    conn.execute(sql)',
])
def test_the_scanner_passes_parameterised_sql(snippet: str) -> None:
    assert unsafe_sql(snippet) == [], snippet


_VALID_PLACEHOLDER = re.compile(r"%\(\w+\)s|%%")
# EXECUTE FUNCTION/PROCEDURE (a trigger's), EXECUTE ON (a privilege granted or revoked)
_DYNAMIC_SQL = re.compile(r"\bEXECUTE\b(?!\s+(FUNCTION|PROCEDURE|ON)\b)|\bformat\s*\(",
                          re.IGNORECASE)
_FORMAT_FIELD = re.compile(r"\{\w*\}")
_NAMED_FIELD = re.compile(r"\{\w+\}")


def sql_text_problems(name: str, text: str, *, params: bool = True) -> list[str]:
    """What is wrong with one SQL text: a placeholder that is not `%(name)s` (psycopg's
    named form; `%%` is a literal percent), a str.format field, or dynamic SQL (PL/pgSQL
    EXECUTE of a string, format() building statements)."""
    problems = []
    code = re.sub(r"--[^\n]*", "", text)  # comments may say anything
    if params and "%" in _VALID_PLACEHOLDER.sub("", code):
        problems.append(f"{name}: a placeholder other than %(name)s")
    # `{name}` anywhere says "meant to be .format()ted"; an empty `'{}'` is an array literal
    if _NAMED_FIELD.search(code) or _FORMAT_FIELD.search(re.sub(r"'[^']*'", "''", code)):
        problems.append(f"{name}: a {{format}} field outside a string literal")
    if _DYNAMIC_SQL.search(code):
        problems.append(f"{name}: dynamic SQL (EXECUTE or format())")
    return problems


def test_named_queries_take_values_only_as_named_parameters() -> None:
    assert len(QUERIES) > 50
    problems = [p for name, text in QUERIES.items() for p in sql_text_problems(name, text)]
    assert problems == []
    assert sum("%(" in text for text in QUERIES.values()) > 40  # values do come in: as params


def test_migrations_build_no_dynamic_sql() -> None:
    # migrations run without parameters, so a % there is a literal one
    problems = [p for _, name, text in migrations()
                for p in sql_text_problems(name, text, params=False)]
    assert problems == []


@pytest.mark.parametrize("text", [
    "SELECT * FROM video_jobs WHERE job_id = %s",
    "SELECT * FROM video_jobs WHERE job_id = '{job_id}'",
    "SELECT * FROM video_jobs WHERE job_id = {}",
    "SELECT %(a)s, 100%",
    "DO $$ BEGIN EXECUTE 'DROP TABLE ' || tbl; END $$",
    "SELECT format('DELETE FROM %I', %(t)s)",
])
def test_the_sql_text_check_flags_what_it_should(text: str) -> None:
    assert sql_text_problems("sample", text)


def test_the_sql_text_check_passes_what_it_should() -> None:
    text = ("SELECT coalesce(c.reloptions, '{}') FROM t  -- a {comment} with %s\n"
            "WHERE q ILIKE 'LISTEN%%' AND id = %(job_id)s;\n"
            "CREATE TRIGGER x AFTER UPDATE ON t EXECUTE FUNCTION f();")
    assert sql_text_problems("sample", text) == []


@pytest.mark.parametrize("url", ["http://u:p4ssw0rd@127.0.0.1:9", "https://user@api.example",
                                 "http://evil.example\\@localhost/", "https://api.example/?a=1",
                                 "https://api.example/#frag", "http://localhost:99999"])
def test_a_base_url_the_client_cannot_use_is_refused_without_echoing_credentials(url):
    with pytest.raises(ConfigError) as err:
        check_base_url(url)
    assert "p4ssw0rd" not in str(err.value)
    with pytest.raises(ConfigError) as err:  # refused as plain http, still not echoed
        check_base_url("http://u:p4ssw0rd@evil.example")
    assert "p4ssw0rd" not in str(err.value)
