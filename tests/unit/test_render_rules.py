"""Each provider's optional `Rules.duration_key` and `Rules.render_seconds` (issue 31).

`duration_key`: what of a create request changes how long its render takes, as a short key
(`5s`, `8s 1080p`): equal requests give equal keys, odd values (bools, huge numbers, objects,
prose) give no part, and no key ever holds a prompt or passes 32 characters.
`render_seconds`: the render's span by the provider's own clock, from a final status answer
shaped as the provider documents it; None for anything absent, garbled, negative or absurd.
Times are built relative to now (no calendar dates).
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from vidpoll.providers import registry
from vidpoll.providers import render_time as rt

PROMPT = "a lighthouse at dawn, waves breaking on the rocks, slow dolly in, 35mm film grain"
PROVIDERS = ("sume", "replicate", "fal", "veo", "vertex", "runway", "luma", "kling")
WITH_RENDER_TIME = frozenset({"replicate", "kling"})
"""The providers whose documented final answer carries both a start and an end time."""

ODD_VALUES: tuple[Any, ...] = (
    True, False, None, 0, -5, 10**400, 1e308, float("nan"), float("inf"), -0.0, "", "  ",
    "five seconds", "5 or 10", "5" * 50, PROMPT, [5], {"seconds": 5}, {"value": "5s"},
    "1080p please", "x" * 13,
)
"""Values no key part may come from."""


def rules(provider: str) -> Any:
    return registry.load(provider).rules


def key(provider: str, payload: dict[str, Any], model: str | None = "m") -> str | None:
    found = rules(provider).duration_key(payload, model)
    assert found is None or isinstance(found, str)
    return found


def iso(moment: datetime) -> str:
    """As Replicate writes its times: ISO 8601, microseconds, Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ms(moment: datetime) -> int:
    """As Kling writes its times: Unix milliseconds."""
    return round(moment.timestamp() * 1000)


# ---- which providers have which ----


def test_every_provider_has_a_duration_key_and_only_the_documented_ones_a_render_time() -> None:
    assert set(PROVIDERS) <= set(registry.names())
    for provider in registry.names():
        assert callable(getattr(rules(provider), "duration_key", None)), provider
        has = callable(getattr(rules(provider), "render_seconds", None))
        assert has == (provider in WITH_RENDER_TIME), provider


# ---- duration_key: each provider's fields ----


@pytest.mark.parametrize(("provider", "payload", "expected"), [
    # Sume: the body's own `duration`, `resolution`
    ("sume", {"prompt": PROMPT, "duration": 8}, "8s"),
    ("sume", {"prompt": PROMPT, "duration": "8", "resolution": "1080P"}, "8s 1080p"),
    ("sume", {"prompt": PROMPT}, None),
    # Replicate: the input's `duration` or `num_frames`, numbers only
    ("replicate", {"prompt": PROMPT, "duration": 5, "resolution": "1080p"}, "5s"),
    ("replicate", {"prompt": PROMPT, "duration": 5.0}, "5s"),
    ("replicate", {"prompt": PROMPT, "duration": "5"}, None),
    ("replicate", {"prompt": PROMPT, "num_frames": 121}, "121f"),
    ("replicate", {"prompt": PROMPT, "num_frames": "121"}, None),
    ("replicate", {"prompt": PROMPT, "duration": 6, "num_frames": 121}, "6s"),
    ("replicate", {"prompt": PROMPT, "input": {"duration": 5}}, None),
    # fal: `duration` as fal's endpoints write it, `num_frames`, `resolution`
    ("fal", {"prompt": PROMPT, "duration": "5"}, "5s"),
    ("fal", {"prompt": PROMPT, "duration": "8s", "resolution": "720p"}, "8s 720p"),
    ("fal", {"prompt": PROMPT, "duration": 10, "resolution": "1080p"}, "10s 1080p"),
    ("fal", {"prompt": PROMPT, "num_frames": 81, "resolution": "480p"}, "81f 480p"),
    ("fal", {"prompt": PROMPT, "aspect_ratio": "16:9"}, None),
    # Veo (and Vertex AI, which shares its rules): parameters.durationSeconds, .resolution
    ("veo", {"instances": [{"prompt": PROMPT}],
             "parameters": {"aspectRatio": "16:9", "durationSeconds": 8}}, "8s"),
    ("veo", {"instances": [{"prompt": PROMPT}],
             "parameters": {"durationSeconds": 6, "resolution": "1080p"}}, "6s 1080p"),
    ("vertex", {"instances": [{"prompt": PROMPT}],
                "parameters": {"durationSeconds": "8", "sampleCount": 2}}, "8s"),
    ("veo", {"instances": [{"prompt": PROMPT}], "durationSeconds": 8}, None),
    ("veo", {"instances": [{"prompt": PROMPT}], "parameters": "8s"}, None),
    # Runway: `duration`, `resolution` or a size `ratio`; under `input` for generate/video
    ("runway", {"model": "gen4_turbo", "promptText": PROMPT, "ratio": "1280:720",
                "duration": 5}, "5s 1280:720"),
    ("runway", {"model": "gen4_turbo", "promptText": PROMPT, "ratio": "16:9",
                "duration": 10}, "10s"),
    ("runway", {"model": "hailuo", "promptText": PROMPT, "resolution": "768P",
                "duration": 6, "ratio": "16:9"}, "6s 768p"),
    ("runway", {"configId": "cfg", "input": {"prompt": PROMPT, "duration": 8,
                                              "resolution": "1080p"}}, "8s 1080p"),
    ("runway", {"model": "upscale_v1", "videoUri": "https://example.com/a.mp4"}, None),
    # Luma: `duration` ("5s", "9s") and `resolution`
    ("luma", {"prompt": PROMPT, "duration": "5s", "resolution": "720p"}, "5s 720p"),
    ("luma", {"prompt": PROMPT, "duration": "9s"}, "9s"),
    ("luma", {"prompt": PROMPT, "aspect_ratio": "16:9", "loop": True}, None),
    # Kling: `duration` (text) and `mode`
    ("kling", {"model_name": "kling-v2-1", "prompt": PROMPT, "mode": "pro",
               "duration": "10"}, "10s pro"),
    ("kling", {"model_name": "kling-v1", "prompt": PROMPT, "duration": "5"}, "5s"),
    ("kling", {"model_name": "kling-v1", "prompt": PROMPT, "mode": "STD"}, "std"),
    ("kling", {"model_name": "kling-v1", "prompt": PROMPT}, None),
])
def test_the_key_names_the_clip_length_and_its_size(provider: str, payload: dict[str, Any],
                                                    expected: str | None) -> None:
    assert key(provider, payload) == expected


FIELDS = {
    "sume": ("duration", "resolution"), "replicate": ("duration", "num_frames"),
    "fal": ("duration", "num_frames", "resolution"), "luma": ("duration", "resolution"),
    "runway": ("duration", "resolution", "ratio"), "kling": ("duration", "mode"),
}
"""The top-level fields each provider's key reads (Veo's are under `parameters`)."""


def _holder(provider: str, fields: dict[str, Any]) -> dict[str, Any]:
    if provider in ("veo", "vertex"):
        return {"instances": [{"prompt": PROMPT}],
                "parameters": {("durationSeconds" if k == "duration" else k): v
                               for k, v in fields.items()}}
    return {"prompt": PROMPT, **fields}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_equal_requests_give_equal_keys(provider: str) -> None:
    """A clip length written as a number, a whole float or text (where the provider takes
    text) is the same key; two lengths are two keys; the model does not change it."""
    number = key(provider, _holder(provider, {"duration": 5}))
    assert number == "5s"
    assert key(provider, _holder(provider, {"duration": 5.0})) == number
    assert key(provider, _holder(provider, {"duration": 5}), model=None) == number
    assert key(provider, _holder(provider, {"duration": 10})) == "10s"
    if provider != "replicate":  # Replicate takes numbers only
        for text in ("5", "5s", " 5 ", "5.0", "5 s", "5S"):
            assert key(provider, _holder(provider, {"duration": text})) == number, text
    assert key(provider, _holder(provider, {"duration": 7.5})) == "7.5s"
    assert key(provider, _holder(provider, {"duration": 7.25})) == "7.25s"


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("odd", ODD_VALUES, ids=range(len(ODD_VALUES)))
def test_odd_values_give_no_part_and_never_raise(provider: str, odd: Any) -> None:
    """A bool, a huge or non-finite number, an object, a list, prose or a too-long word in
    any field the key reads gives no part; the rest of the key stands."""
    fields = FIELDS.get(provider, ("duration", "resolution"))
    for field in fields:
        assert key(provider, _holder(provider, {field: odd})) is None, field
    if "resolution" in fields or provider in ("veo", "vertex"):
        kept = key(provider, _holder(provider, {"duration": 5, "resolution": odd}))
        assert kept == "5s"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_key_is_short_and_holds_no_prompt(provider: str) -> None:
    crowded = {"prompt": PROMPT, "duration": 12.125, "num_frames": 999_999, "mode": "pro",
               "resolution": "1920x1080", "ratio": "10000:10000", "negative_prompt": PROMPT,
               "parameters": {"durationSeconds": 12.125, "resolution": "10000x10000"}}
    found = key(provider, crowded)
    assert found is not None
    assert len(found) <= rt.MAX_KEY
    assert "lighthouse" not in found
    assert found.startswith("12.125s")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_bodies_that_are_not_objects_where_expected_give_none(provider: str) -> None:
    for payload in ({}, {"parameters": None}, {"input": [1, 2]}, {"duration": {"s": 5}}):
        assert key(provider, payload) is None


# ---- render_seconds ----


def replicate_prediction(created: datetime, started: datetime | None,
                         completed: datetime | None, status: str = "succeeded") -> dict[str, Any]:
    """A prediction as replicate.com/docs/topics/predictions shows one."""
    return {
        "id": "gm3qorzdhgbfurvjtvhg6dckhu", "model": "owner/video-model",
        "version": "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa",
        "input": {"prompt": PROMPT, "duration": 5}, "logs": "", "error": None,
        "output": "https://replicate.delivery/xezq/abc/out.mp4", "status": status,
        "created_at": iso(created), "data_removed": False, "source": "api",
        "started_at": iso(started) if started else None,
        "completed_at": iso(completed) if completed else None,
        "metrics": {"predict_time": 80.25, "total_time": 95.5},
        "urls": {"get": "https://api.replicate.com/v1/predictions/gm3qorzdhgbfurvjtvhg6dckhu",
                 "cancel": "https://api.replicate.com/v1/predictions/gm3qorzdhgbfurvjtvhg6dckhu"
                           "/cancel"},
    }


def test_replicate_counts_from_the_create_to_the_completion() -> None:
    end = datetime.now(UTC)
    created = end - timedelta(seconds=95.5)
    started = created + timedelta(seconds=15.25)
    seconds = rules("replicate").render_seconds(replicate_prediction(created, started, end))
    assert seconds == pytest.approx(95.5, abs=1e-5)
    failed = replicate_prediction(created, started, end, status="failed")
    assert rules("replicate").render_seconds(failed) == pytest.approx(95.5, abs=1e-5)


@pytest.mark.parametrize("change", [
    {"completed_at": None}, {"created_at": None}, {"completed_at": "yesterday"},
    {"created_at": 1722769557}, {"completed_at": ""}, {"completed_at": ["2026"]},
    {"completed_at": "9" * 100}, {"created_at": "not-a-date-but-forty-characters-long-xx"},
])
def test_replicate_without_two_readable_times_says_nothing(change: dict[str, Any]) -> None:
    end = datetime.now(UTC)
    body = replicate_prediction(end - timedelta(seconds=60), None, end)
    body.update(change)
    assert rules("replicate").render_seconds(body) is None
    del body["created_at"]
    assert rules("replicate").render_seconds(body) is None


def test_replicate_times_in_other_forms_and_absurd_spans() -> None:
    replicate = rules("replicate")
    now = datetime.now(UTC)
    offset = replicate_prediction(now, None, now)
    offset["created_at"] = (now - timedelta(seconds=30)).isoformat()  # +00:00
    offset["completed_at"] = now.astimezone(timezone(timedelta(hours=5, minutes=30))).isoformat()
    assert replicate.render_seconds(offset) == pytest.approx(30, abs=1e-5)
    naive = replicate_prediction(now, None, now)  # no offset: UTC
    naive["completed_at"] = iso(now)[:-1]
    naive["created_at"] = iso(now - timedelta(seconds=12))
    assert replicate.render_seconds(naive) == pytest.approx(12, abs=1e-5)
    nanos = replicate_prediction(now, None, now)
    nanos["created_at"] = iso(now - timedelta(seconds=2))[:-1] + "123Z"  # 9 digits
    assert replicate.render_seconds(nanos) == pytest.approx(2, abs=1e-3)
    backwards = replicate_prediction(now, None, now - timedelta(seconds=1))
    assert replicate.render_seconds(backwards) is None
    weeks = replicate_prediction(now - timedelta(days=8), None, now)
    assert replicate.render_seconds(weeks) is None
    days = replicate_prediction(now - timedelta(days=6), None, now)
    assert replicate.render_seconds(days) == pytest.approx(6 * 86400, abs=1e-3)
    instant = replicate_prediction(now, None, now)
    assert replicate.render_seconds(instant) == 0


def kling_task(created: datetime, updated: datetime, status: str = "succeed",
               code: Any = 0) -> dict[str, Any]:
    """A query's answer as Kling's "Text to Video" page shows it (times in Unix ms)."""
    data: dict[str, Any] = {
        "task_id": "866168216002236456", "task_status": status,
        "task_status_msg": "" if status != "failed" else "Image pixel is invalid",
        "task_info": {"external_task_id": "vp-" + "a" * 40},
        "created_at": ms(created), "updated_at": ms(updated),
        "task_result": ({"videos": [{"id": str(uuid.uuid4()), "duration": "5",
                                     "url": "https://cdn.klingai.com/bs2/out.mp4"}]}
                        if status == "succeed" else {}),
        "final_unit_deduction": "1" if status == "succeed" else "0",
    }
    return {"code": code, "message": "SUCCEED", "request_id": str(uuid.uuid4()), "data": data}


def test_kling_counts_from_creation_to_the_final_update() -> None:
    kling = rules("kling")
    end = datetime.now(UTC)
    created = end - timedelta(seconds=183.456)
    assert kling.render_seconds(kling_task(created, end)) == pytest.approx(183.456, abs=2e-3)
    failed = kling_task(created, end, status="failed")
    assert kling.render_seconds(failed) == pytest.approx(183.456, abs=2e-3)
    as_text = kling_task(created, end)
    as_text["data"]["created_at"] = str(as_text["data"]["created_at"])
    assert kling.render_seconds(as_text) == pytest.approx(183.456, abs=2e-3)


@pytest.mark.parametrize("status", ["submitted", "processing", "", None, 7])
def test_kling_before_the_end_says_nothing(status: Any) -> None:
    """`updated_at` of a task still running is its last change, not its end."""
    end = datetime.now(UTC)
    body = kling_task(end - timedelta(seconds=60), end)
    body["data"]["task_status"] = status
    assert rules("kling").render_seconds(body) is None


@pytest.mark.parametrize("change", [
    {"created_at": None}, {"updated_at": None}, {"created_at": True}, {"updated_at": "soon"},
    {"created_at": -1}, {"updated_at": 10**20}, {"created_at": float("nan")},
    {"updated_at": [1]}, {"created_at": 0},
])
def test_kling_without_two_readable_times_says_nothing(change: dict[str, Any]) -> None:
    end = datetime.now(UTC)
    body = kling_task(end - timedelta(seconds=60), end)
    body["data"].update(change)
    assert rules("kling").render_seconds(body) is None


def test_kling_garbled_answers_and_absurd_spans_say_nothing() -> None:
    kling = rules("kling")
    now = datetime.now(UTC)
    assert kling.render_seconds(kling_task(now - timedelta(seconds=5), now, code=1203)) is None
    assert kling.render_seconds(kling_task(now, now - timedelta(seconds=5))) is None
    assert kling.render_seconds(kling_task(now - timedelta(days=7, seconds=1), now)) is None
    for body in ({}, {"data": None}, {"data": [1]}, {"code": 0, "message": "x", "data": "y"}):
        assert kling.render_seconds(body) is None


# ---- the shared helpers' edges ----


def test_the_parts_are_bounded_and_normalised() -> None:
    assert rt.seconds(86_400) == "86400s"
    assert rt.seconds(86_401) is None
    assert rt.seconds(0.0001) is None
    assert rt.seconds("5.000") == "5s"
    assert rt.seconds("10 seconds") == "10s"
    assert rt.seconds("5", text=False) is None
    assert rt.frames(121.0) == "121f"
    assert rt.frames(121.5) is None
    assert rt.word("1920X1080") == "1920x1080"
    assert rt.word(720) == "720"
    assert rt.size("16:9") is None
    assert rt.size("720:1280") == "720:1280"
    assert rt.key(None, "", None) is None
    assert rt.key("x" * 30, "1080p", "pro") == "x" * 30
    assert rt.elapsed(10.0, 10.0 + rt.MAX_RENDER_S) == rt.MAX_RENDER_S
    assert rt.elapsed(0.0, math.inf) is None
    assert rt.iso_instant(f"{datetime.now(UTC).year}-02-30T00:00:00Z") is None  # no such day
    assert rt.ms_instant("\uff11\uff12\uff13") is None  # digits, but not ASCII ones
