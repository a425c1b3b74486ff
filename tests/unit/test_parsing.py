"""Parsers and loaders: Retry-After, poll hints, job URLs, settings, the SQL files."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import platformdirs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import vidpoll.sql
from vidpoll.config import DEFAULT_HTTP_TIMEOUT_S, DEFAULT_SUME_BASE_URL, ROOT_HOME, Settings
from vidpoll.errors import ConfigError
from vidpoll.policy import PollPolicy, next_poll_delay, parse_retry_after
from vidpoll.providers.sume.client import job_path_segment, status_url
from vidpoll.sql import QUERIES, migrations

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
POLICY = PollPolicy()
API_KEY = "sk-live-9d2e4b7a-do-not-leak"


# --- parse_retry_after -----------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    ("120", 120.0),
    ("0", 0.0),
    (" 7 ", 7.0),
    ("2.5", 2.5),
    ("0.25", 0.25),
    ("-3", 0.0),
    (format_datetime(NOW + timedelta(seconds=90), usegmt=True), 90.0),
    (format_datetime(NOW + timedelta(hours=2), usegmt=True), 7200.0),
    (format_datetime(NOW - timedelta(seconds=30), usegmt=True), 0.0),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ("Sun, 01 Jun 2025 14:00:30 +0200", 30.0),   # same instant as 12:00:30 UTC
    ("Sun, 01 Jun 2025 12:01:00 -0000", 60.0),   # no zone: read as UTC
])
def test_parse_retry_after_usable(value: str, expected: float) -> None:
    assert parse_retry_after(value, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("value", [
    None, "", "   ", "soon", "12 seconds", "inf", "-inf", "Infinity", "nan", "NaN", "1e999",
    "Mon, 99 Foo 2025", "Sun, 01 Jun 99999 12:00:00 GMT",
])
def test_parse_retry_after_unusable(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None


@given(st.text(max_size=40))
def test_parse_retry_after_never_raises(value: str) -> None:
    result = parse_retry_after(value, NOW)
    assert result is None or (math.isfinite(result) and result >= 0)


# --- next_poll_delay -------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "expected"), [
    (30, 30.0),
    (30.5, 30.5),
    ("30", 30.0),
    (" 4.5\n", 4.5),
    ("1e3", 1000.0),
    (1, 1.0),
    (0, 1.0),
    (0.001, 1.0),
    ("0", 1.0),
    (3600, 3600.0),
    (3601, 3600.0),
    (1e12, 3600.0),
    (None, 15.0),
    (-1, 15.0),
    (-0.001, 15.0),
    ("-5", 15.0),
    ("abc", 15.0),
    ("", 15.0),
    (True, 15.0),
    (False, 15.0),
    (math.nan, 15.0),
    (math.inf, 15.0),
    (-math.inf, 15.0),
    ("nan", 15.0),
    ("inf", 15.0),
    ([5], 15.0),
    ({"s": 5}, 15.0),
])
def test_next_poll_delay(raw: Any, expected: float) -> None:
    assert next_poll_delay(raw, POLICY) == expected


def test_next_poll_delay_clamps_the_default_too() -> None:
    assert next_poll_delay(None, PollPolicy(min_poll_s=20.0)) == 20.0
    assert next_poll_delay(None, PollPolicy(max_poll_s=10.0)) == 10.0
    assert next_poll_delay(None, PollPolicy(default_poll_s=42.0)) == 42.0


@given(st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats()
       | st.text(max_size=20))
def test_next_poll_delay_is_always_within_the_window(raw: Any) -> None:
    delay = next_poll_delay(raw, POLICY)
    assert POLICY.min_poll_s <= delay <= POLICY.max_poll_s


# --- job ids in URLs -------------------------------------------------------------------------

@pytest.mark.parametrize(("job_id", "segment"), [
    ("vid_123", "vid_123"),
    ("a-b.c~d", "a-b.c~d"),
    ("a/../b", "a%2F..%2Fb"),
    ("../../admin", "..%2F..%2Fadmin"),
    ("x?y=1", "x%3Fy%3D1"),
    ("#", "%23"),
    ("%", "%25"),
    ("%2F", "%252F"),
    ("..", "%2E%2E"),
    (".", "%2E"),
    ("...", "..."),
    ("a b", "a%20b"),
    ("+", "%2B"),
    ("vidéo", "vid%C3%A9o"),
    ("日本", "%E6%97%A5%E6%9C%AC"),
    ("a\\b", "a%5Cb"),
])
def test_job_path_segment(job_id: str, segment: str) -> None:
    assert job_path_segment(job_id) == segment
    assert unquote(segment) == job_id


@pytest.mark.parametrize(("job_id", "segment"), [
    ("a/../b", "a%2F..%2Fb"),
    ("x?y=1", "x%3Fy%3D1"),
    ("#frag", "%23frag"),
    ("..", "%2E%2E"),
    (".", "%2E"),
    ("%41", "%2541"),
    ("a b", "a%20b"),
    ("日本", "%E6%97%A5%E6%9C%AC"),
])
@pytest.mark.parametrize(("base", "prefix"), [
    ("https://api.sume.com", "https://api.sume.com"),
    ("https://api.sume.com/", "https://api.sume.com"),
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("https://gw.example/sume", "https://gw.example/sume"),
    ("https://gw.example/sume/", "https://gw.example/sume"),
])
def test_status_url_keeps_the_id_as_one_segment(base: str, prefix: str, job_id: str,
                                                segment: str) -> None:
    url = status_url(base, job_id)
    assert str(url) == f"{prefix}/v1/jobs/{segment}/status"
    assert url.raw_parts[-2:] == (segment, "status")
    assert url.raw_query_string == ""
    assert url.raw_fragment == ""


def test_status_url_with_a_custom_path() -> None:
    url = status_url("https://h.example/base/", "a/b", path="/jobs/{job_id}")
    assert str(url) == "https://h.example/base/jobs/a%2Fb"


@given(st.text(min_size=1, max_size=30))
def test_encoded_segment_is_one_segment_and_round_trips(job_id: str) -> None:
    segment = job_path_segment(job_id)
    assert not {"/", "?", "#"} & set(segment)
    assert segment not in (".", "..")
    assert segment.isascii()
    assert unquote(segment) == job_id
    url = status_url("https://api.sume.com/p/", job_id)
    assert url.raw_parts == ("/", "p", "v1", "jobs", segment, "status")
    assert url.raw_query_string == ""
    assert url.raw_fragment == ""


# --- Settings.from_env -----------------------------------------------------------------------

def test_settings_defaults() -> None:
    s = Settings.from_env({})
    assert s.database_url is None
    assert s.sume_base_url == DEFAULT_SUME_BASE_URL == "https://api.sume.com"
    assert s.sume_api_key == ""
    assert s.http_timeout_s == DEFAULT_HTTP_TIMEOUT_S == 15.0
    # as root /var/lib/vidpoll (the embedded server runs as another user, who must traverse
    # to its data: never under /root), else the platform's user data directory
    assert s.home == (ROOT_HOME if os.geteuid() == 0
                      else Path(platformdirs.user_data_dir("vidpoll")))
    assert s.policy == PollPolicy()


def test_settings_blank_values_mean_defaults() -> None:
    env = {"DATABASE_URL": "  ", "SUME_BASE_URL": " ", "VIDPOLL_MIN_POLL_S": "",
           "VIDPOLL_HTTP_TIMEOUT": "  ", "VIDPOLL_HOME": ""}
    s = Settings.from_env(env)
    assert s.database_url is None
    assert s.sume_base_url == DEFAULT_SUME_BASE_URL
    assert s.policy.min_poll_s == 1.0
    assert s.http_timeout_s == 15.0


def test_settings_read_every_variable() -> None:
    env = {
        "DATABASE_URL": " postgresql://u@db/vid ",
        "SUME_BASE_URL": " http://localhost:9000/api ",
        "SUME_API_KEY": f"  {API_KEY}\n",
        "VIDPOLL_HTTP_TIMEOUT": "2.5",
        "VIDPOLL_HOME": "/srv/vidpoll",
        "VIDPOLL_MIN_POLL_S": "0.5",
        "VIDPOLL_MAX_POLL_S": "120",
        "VIDPOLL_MAX_POLL_AGE_S": "7200",
        "VIDPOLL_NOT_FOUND_MAX_TRIES": "3",
        "VIDPOLL_NOT_FOUND_MAX_AGE_S": "600",
        "VIDPOLL_BACKOFF_MAX_S": "30",
    }
    s = Settings.from_env(env)
    assert s.database_url == "postgresql://u@db/vid"
    assert s.sume_base_url == "http://localhost:9000/api"
    assert s.sume_api_key == API_KEY
    assert s.require_api_key() == API_KEY
    assert s.http_timeout_s == 2.5
    assert s.home == Path("/srv/vidpoll")
    p = s.policy
    assert (p.min_poll_s, p.max_poll_s, p.max_age_s) == (0.5, 120.0, 7200.0)
    assert p.not_found_max_tries == 3
    assert isinstance(p.not_found_max_tries, int)
    assert (p.not_found_max_age_s, p.backoff_max_s) == (600.0, 30.0)


def test_settings_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUME_BASE_URL", "https://staging.sume.example")
    monkeypatch.setenv("SUME_API_KEY", API_KEY)
    monkeypatch.setenv("VIDPOLL_MAX_POLL_S", "99")
    s = Settings.from_env()
    assert s.sume_base_url == "https://staging.sume.example"
    assert s.sume_api_key == API_KEY
    assert s.policy.max_poll_s == 99.0


@pytest.mark.parametrize(("raw", "prepare"), [("", True), ("on", True), ("OFF", False),
                                              ("0", False), ("true", True)])
def test_db_prepare_switch(raw: str, prepare: bool) -> None:
    assert Settings.from_env({"VIDPOLL_DB_PREPARE": raw}).prepared_statements is prepare


def test_db_prepare_switch_refuses_anything_else() -> None:
    with pytest.raises(ConfigError, match="VIDPOLL_DB_PREPARE='sometimes' must be on or off"):
        Settings.from_env({"VIDPOLL_DB_PREPARE": "sometimes"})


NUMERIC_VARS = ["VIDPOLL_MIN_POLL_S", "VIDPOLL_MAX_POLL_S", "VIDPOLL_MAX_POLL_AGE_S",
                "VIDPOLL_NOT_FOUND_MAX_TRIES", "VIDPOLL_NOT_FOUND_MAX_AGE_S",
                "VIDPOLL_BACKOFF_MAX_S", "VIDPOLL_HTTP_TIMEOUT"]


@pytest.mark.parametrize("name", NUMERIC_VARS)
@pytest.mark.parametrize("raw", ["abc", "10s", "1,5", "nan", "inf", "-1"])
def test_settings_bad_numbers_name_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(name)):
        Settings.from_env({name: raw})


@pytest.mark.parametrize(("name", "raw"), [
    ("VIDPOLL_MIN_POLL_S", "0"),
    ("VIDPOLL_MAX_POLL_S", "0.001"),
    ("VIDPOLL_MAX_POLL_AGE_S", "0.5"),
    ("VIDPOLL_NOT_FOUND_MAX_TRIES", "0"),
    ("VIDPOLL_BACKOFF_MAX_S", "0"),
    ("VIDPOLL_HTTP_TIMEOUT", "0.05"),
])
def test_settings_values_below_their_minimum_are_rejected(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(name)):
        Settings.from_env({name: raw})


def test_settings_min_poll_above_max_poll_is_rejected() -> None:
    with pytest.raises(ConfigError, match="VIDPOLL_MIN_POLL_S"):
        Settings.from_env({"VIDPOLL_MIN_POLL_S": "60", "VIDPOLL_MAX_POLL_S": "30"})


@pytest.mark.parametrize("base", ["api.sume.com", "//api.sume.com", "ftp://api.sume.com",
                                  "localhost:8080", "https:/api.sume.com"])
def test_settings_base_url_needs_a_scheme(base: str) -> None:
    with pytest.raises(ConfigError, match="SUME_BASE_URL"):
        Settings.from_env({"SUME_BASE_URL": base})


def test_settings_repr_never_shows_the_api_key() -> None:
    s = Settings.from_env({"SUME_API_KEY": API_KEY, "SUME_BASE_URL": "https://x.example"})
    assert s.sume_api_key == API_KEY
    assert API_KEY not in repr(s)
    assert API_KEY not in str(s)
    assert "https://x.example" in repr(s)


def test_require_api_key_explains_how_to_set_it() -> None:
    with pytest.raises(ConfigError, match="SUME_API_KEY"):
        Settings.from_env({"SUME_API_KEY": "   "}).require_api_key()


# --- SQL loader ------------------------------------------------------------------------------

def store_source() -> str:
    spec = importlib.util.find_spec("vidpoll.store")
    assert spec is not None
    assert spec.origin is not None
    return "\n".join(p.read_text(encoding="utf-8")
                     for p in sorted(Path(spec.origin).parent.glob("*.py")))


def test_every_query_name_used_by_the_store_exists() -> None:
    used = set(re.findall(r"\b_(?:q|one|all)\(\s*[\"'](\w+)[\"']", store_source()))
    # The scan must actually see the store's calls, or this test proves nothing.
    assert {"claim_due", "record_outcomes", "schema_version", "database_exists",
            "get_job"} <= used
    assert used - QUERIES.keys() == set()


def test_queries_are_non_empty_statements() -> None:
    assert QUERIES
    for name, text in QUERIES.items():
        assert re.fullmatch(r"[a-z_]+", name), name
        assert text.strip(), name
        assert not text.rstrip().endswith(";"), name
        assert "-- name:" not in text, name


def test_migrations_are_numbered_one_to_n() -> None:
    found = migrations()
    versions = [v for v, _, _ in found]
    assert versions == list(range(1, len(found) + 1))
    assert len(found) >= 2
    for version, name, text in found:
        assert name.startswith(f"{version:04d}_")
        assert name.endswith(".sql")
        assert text.strip()
    folder = Path(vidpoll.sql.__file__).parent / "migrations"
    assert sorted(p.name for p in folder.glob("*.sql")) == [n for _, n, _ in found], (
        "a .sql file in migrations/ does not match NNNN_name.sql and would be skipped")


def fake_package(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setattr(vidpoll.sql, "resources", SimpleNamespace(files=lambda _pkg: root))


def test_migrations_with_a_gap_are_refused(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_seed.sql").write_text("select 1;")
    (tmp_path / "migrations" / "0003_later.sql").write_text("select 3;")
    fake_package(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        migrations()


def test_migrations_loader_reads_a_good_folder(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0002_b.sql").write_text("select 2;")
    (tmp_path / "migrations" / "0001_a.sql").write_text("select 1;")
    (tmp_path / "migrations" / "README.md").write_text("not a migration")
    fake_package(monkeypatch, tmp_path)
    assert migrations() == [(1, "0001_a.sql", "select 1;"), (2, "0002_b.sql", "select 2;")]


def test_duplicate_query_names_are_refused(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "queries.sql").write_text(
        "-- name: a\nselect 1;\n-- name: b\nselect 2;\n-- name: a\nselect 3;\n")
    fake_package(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match="'a' defined twice"):
        vidpoll.sql._load_queries()


def test_query_loader_splits_on_name_markers(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "queries.sql").write_text(
        "-- header comment\n-- name: first\n-- why\nselect 1;\n\n-- name: second\nselect 2\n")
    fake_package(monkeypatch, tmp_path)
    assert vidpoll.sql._load_queries() == {"first": "-- why\nselect 1", "second": "select 2"}


def test_an_echoed_key_and_signed_urls_are_scrubbed_and_the_json_stays_valid() -> None:
    from vidpoll.providers.sume.client import _scrub_body

    key = b"sk-live-0123456789"
    message = 'image_url "https://b/x.png?X-Amz-Signature=a" unreachable; key sk-live-0123456789'
    body = json.dumps({"error": {"code": "invalid_request", "message": message},
                       "request_id": "req_1"}).encode()
    scrubbed = json.loads(_scrub_body(body, key, 422))
    assert scrubbed["error"]["code"] == "invalid_request"  # still Sume's envelope: final
    assert scrubbed["error"]["message"] == (
        'image_url "https://b/x.png" unreachable; key <redacted>')
    # escaped slashes, as some JSON encoders write them, are URLs too
    escaped = b'{"error": {"message": "see https:\\/\\/cdn\\/v.mp4?sig=abc"}}'
    assert b"sig=" not in _scrub_body(escaped, key, 500)
    # a 2xx result keeps its signed links (the download needs them); an answer with nothing
    # to scrub comes back byte for byte
    result = b'{"videos": [{"url": "https://cdn/v.mp4?sig=abc"}]}'
    assert _scrub_body(result, key, 200, keep_links=True) is result
    assert _scrub_body(b"<html>sk-live-0123456789 https://x/?sig=1</html>", key, 502) == (
        b"<html><redacted> https://x/</html>")
    # what the policy must still refuse stays refusable (a lone surrogate stays escaped)
    odd = b'{"message": "\\ud800 https://x/?sig=1"}'
    assert _scrub_body(odd, key, 400) == b'{"message": "\\ud800 https://x/"}'
