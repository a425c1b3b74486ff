"""What the providers' optional `Rules.duration_key` and `Rules.render_seconds` share (issue
31): the parts of a create request that change how long its render takes, written as a short
key (`5s 1080p`), and the seconds between two timestamps of a final status answer. Pure and
cheap; nothing here raises, whatever it is given.

A key is made of parts, each a short scalar normalised so that equal requests give equal keys
(`5`, `5.0`, `"5"`, `"5s"` all give `5s`): a clip length (`seconds`), a frame count (`frames`)
or a word such as a resolution or a mode (`word`). A value that is not a short scalar (an
object, a list, a bool, prose with spaces, a huge number) gives no part: a key never holds a
prompt or anything unbounded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

MAX_KEY = 32
"""The longest key: a part that would make it longer is left out."""
MAX_CLIP_S = 86_400
"""A clip length above a day is no request's (a typo, a number in another unit)."""
MAX_FRAMES = 1_000_000
MAX_RENDER_S = 7 * 86_400.0
"""A render time above 7 days is no render's: a clock or a field gone wrong."""
MAX_INSTANT_MS = 10**14
"""Epoch milliseconds beyond this (the year 5138) are no timestamp."""
_SECONDS_TEXT = re.compile(r"(\d{1,6}(?:\.\d{1,6})?)\s*(?:s|sec|secs|seconds)?", re.IGNORECASE)
"""A clip length as text: `5`, `5s`, `8.0 s`, `10 seconds`."""
_WORD = re.compile(r"[a-z0-9][a-z0-9._:x*-]{0,11}")
"""A word part, lower-cased: `1080p`, `4k`, `1280:720`, `1920x1080`, `pro`; no spaces."""
_SIZE = re.compile(r"\d{3,5}[:x*]\d{3,5}")
_MAX_TEXT = 40
"""Longer text is never parsed (a clip length, a word or a timestamp is shorter)."""


def dig(holder: Any, *path: str) -> Any:
    """The value at `path` in nested objects; None where a step is missing or not an
    object."""
    for name in path:
        if not isinstance(holder, Mapping):
            return None
        holder = holder.get(name)
    return holder


def _figure(value: float) -> str | None:
    """A positive number as a key writes it: whole numbers as integers, others to at most
    3 decimals (`7.5`); None when it rounds to 0."""
    rounded = round(value, 3)
    if rounded <= 0:
        return None
    return str(int(rounded)) if rounded.is_integer() else f"{rounded:.3f}".rstrip("0")


def seconds(value: Any, *, text: bool = True) -> str | None:
    """`5s` for a clip length of 5 seconds: a JSON number, or (`text`) its text with an
    optional unit (`"5"`, `"5s"`, `"8.0 s"`); None for a bool, 0 or less, more than a day,
    NaN, an infinity, other text or any other value."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):  # before float(): a huge int would overflow it
        return f"{value}s" if 0 < value <= MAX_CLIP_S else None
    if isinstance(value, float):
        number = value
    elif text and isinstance(value, str) and len(value) <= _MAX_TEXT:
        found = _SECONDS_TEXT.fullmatch(value.strip())
        if found is None:
            return None
        number = float(found[1])
    else:
        return None
    if not math.isfinite(number) or not 0 < number <= MAX_CLIP_S:
        return None
    figure = _figure(number)
    return None if figure is None else figure + "s"


def frames(value: Any) -> str | None:
    """`121f` for a clip of 121 frames: a whole JSON number from 1 to MAX_FRAMES; None for
    anything else (text included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 < value <= MAX_FRAMES:
        return f"{value}f"
    return None


def word(value: Any) -> str | None:
    """A short word, lower-cased (`"1080P"` → `1080p`, `"1280:720"`, `"pro"`), or a whole
    number from 1 to 99999 as its digits (a resolution given as `720`); None for anything
    else: text with spaces or over 12 characters, a bool, an object."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value) if 0 < value <= 99_999 else None
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        return None
    folded = value.strip().lower()
    return folded if _WORD.fullmatch(folded) else None


def size(value: Any) -> str | None:
    """A frame size written as width and height (`1280:720`, `1920x1080`), as `word` gives
    it; None for anything else, an aspect ratio (`16:9`) included."""
    folded = word(value)
    return folded if folded is not None and _SIZE.fullmatch(folded) else None


def key(*parts: str | None) -> str | None:
    """The parts that are there, in order, joined by spaces, at most MAX_KEY characters (a
    part that would go past it is left out); None when no part is there."""
    joined = ""
    for part in parts:
        if part and len(joined) + len(part) + (1 if joined else 0) <= MAX_KEY:
            joined = f"{joined} {part}" if joined else part
    return joined or None


def elapsed(start: float | None, end: float | None) -> float | None:
    """`end - start` in seconds (both epoch seconds); None when either is missing, or the
    difference is negative, above MAX_RENDER_S or not finite."""
    if start is None or end is None:
        return None
    spent = end - start
    return spent if math.isfinite(spent) and 0 <= spent <= MAX_RENDER_S else None


def iso_instant(value: Any) -> float | None:
    """An ISO 8601 time (`2026-01-02T03:04:05.678901Z`, fractions of any length, an offset or
    none: UTC) as epoch seconds; None for anything else."""
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_TEXT:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except (ValueError, OverflowError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return moment.timestamp()
    except (ValueError, OverflowError):  # year 1 or 9999 shifted out of range by an offset
        return None


def ms_instant(value: Any) -> float | None:
    """Epoch milliseconds (a JSON number, or digits as text) as epoch seconds; None for
    anything else, 0 or less, or beyond MAX_INSTANT_MS."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(
            value) <= _MAX_TEXT:
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value / 1000 if 0 < value <= MAX_INSTANT_MS else None  # NaN fails both
