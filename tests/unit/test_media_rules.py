"""Pure rules for media: which URLs a result carries, safe names, URLs shown without secrets."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from vidpoll.media import (
    file_names,
    job_dir_name,
    media_urls,
    redact_urls,
    shown_url,
    without_signatures,
)

SIGNED = "https://cdn.example.com/v/abc/clip.mp4?X-Amz-Signature=deadbeef&X-Amz-Expires=3600"


def test_media_urls_finds_url_fields_in_order_without_repeats():
    result = {"job_id": "j", "videos": [{"url": "https://a/1.mp4?sig=1"},
                                        {"url": "https://a/2.mp4"}],
              "hd_video_url": "https://a/hd.mp4", "status_url": "https://api/status",
              "thumbnail_url": "https://a/t.jpg", "note": "https://not-a-field/x",
              "again": {"url": "https://a/1.mp4?sig=1"}, "bad": {"url": "ftp://a/x"},
              "n": {"url": 5}}
    assert media_urls(result) == ["https://a/1.mp4?sig=1", "https://a/2.mp4",
                                  "https://a/hd.mp4"]


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda kids: st.lists(kids) | st.dictionaries(
                        st.sampled_from(["url", "video_url", "status_url", "x"]) | st.text(),
                        kids), max_leaves=30))
def test_media_urls_takes_any_json_and_returns_only_its_own_http_urls(body):
    found = media_urls(body)
    assert len(set(found)) == len(found)
    strings = set(_strings(body))
    for url in found:
        assert url in strings and url.lower().startswith(("http://", "https://"))


def test_shown_url_drops_query_fragment_and_credentials():
    assert shown_url(SIGNED) == "https://cdn.example.com/v/abc/clip.mp4"
    assert shown_url("https://user:pw@host:8443/a?b=c#d") == "https://host:8443/a"
    assert shown_url("http://[::1") == "<unparseable URL>"


def test_redact_urls_in_free_text_and_json_values():
    text = f"GET {SIGNED} failed: 403 (see '{SIGNED}')"
    assert "deadbeef" not in redact_urls(text) and "clip.mp4" in redact_urls(text)
    shown = without_signatures({"videos": [{"url": SIGNED}], "n": 1, "s": "plain"})
    assert shown == {"videos": [{"url": "https://cdn.example.com/v/abc/clip.mp4"}], "n": 1,
                     "s": "plain"}


def test_job_dir_name_keeps_plain_ids_and_digests_the_rest():
    assert job_dir_name("vid_0123abc") == "vid_0123abc"
    for odd in ("../x", "a/b", ".", "..", "", "x" * 101, "ü", "a\x00b", ".hidden"):
        assert job_dir_name(odd).startswith("job-")
    assert job_dir_name("a/b") != job_dir_name("a_b")


@given(st.text())
def test_job_dir_name_is_always_one_plain_path_component(job_id):
    name = job_dir_name(job_id)
    assert "/" not in name and "\x00" not in name and name not in (".", "..")
    assert 0 < len(name) <= 100 and not name.startswith(".")


def test_file_names_come_from_the_url_path_or_a_safe_default():
    urls = ["https://a/v/clip.mp4?sig=1", "https://a/v/clip.mp4?sig=2", "https://a/v/",
            "https://a/v/..%2F..%2Fetc%2Fpasswd", "https://a/v/%C3%BC.webm"]
    assert file_names(urls) == ["1-clip.mp4", "2-clip.mp4", "3-video.mp4", "4-video.mp4",
                                "5-video.webm"]


@given(st.lists(st.text(), max_size=10))
def test_file_names_are_plain_names(paths):
    names = file_names([f"https://h/{p}" for p in paths])
    assert len(names) == len(paths)
    for i, name in enumerate(names, start=1):
        prefix, _, rest = name.partition("-")
        assert prefix == str(i) and rest and rest not in (".", "..")
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", rest), name
