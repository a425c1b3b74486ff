"""Reading prompt files for `vidpoll submit --file`: one JSON object per line, stable keys.

A line's idempotency key must be the same on every run of the same file, so that a re-run
after an interruption records nothing twice:

- `"key": "..."` on the line: used as it is.
- `"id": ...` on the line: `{prefix}{id}`.
- neither: `{prefix}sha256-{first 32 hex of the payload's canonical JSON}`, and `.2`, `.3`, ...
  for the second and later identical lines. Inserting or removing other lines changes no key,
  and two identical prompts stay two renders.

`priority` (an integer) is taken off the line; `payload` (an object), if present, is what is
sent; otherwise the line without `key`, `id` and `priority` is.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from vidpoll.errors import InvalidIntent
from vidpoll.policy import validate_key, validate_payload

RESERVED_FIELDS = ("key", "id", "priority", "payload")


@dataclass(frozen=True, slots=True)
class BulkLine:
    """One usable line: where it was, its key, what to send, and its priority."""

    line_no: int
    key: str
    payload: dict[str, Any]
    priority: int


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that cannot be recorded, and why (nothing from it is recorded)."""

    line_no: int
    reason: str


class KeyDeriver:
    """Turns lines into keys; keeps the count of identical lines seen so far in the file."""

    def __init__(self, prefix: str = "", default_priority: int = 0) -> None:
        self.prefix = prefix
        self.default_priority = default_priority
        self._seen: Counter[str] = Counter()

    def parse(self, line_no: int, text: str) -> BulkLine | BadLine | None:
        """One line of the file; None for a blank line."""
        if not text.strip():
            return None
        try:
            obj = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            return BadLine(line_no, f"not JSON: {exc}")
        if not isinstance(obj, dict):
            return BadLine(line_no, f"a line must be a JSON object, not {type(obj).__name__}")
        try:
            return self._line(line_no, obj)
        except InvalidIntent as exc:
            return BadLine(line_no, str(exc))

    def _line(self, line_no: int, obj: dict[str, Any]) -> BulkLine:
        priority = obj.get("priority", self.default_priority)
        if isinstance(priority, bool) or not isinstance(priority, int) or not (
                -2**31 <= priority < 2**31):
            raise InvalidIntent("'priority' must be a 32-bit integer")
        if "payload" in obj:
            payload = obj["payload"]
        else:
            payload = {k: v for k, v in obj.items() if k not in RESERVED_FIELDS}
        payload = validate_payload(payload)
        if "key" in obj:
            key = obj["key"]
            if not isinstance(key, str):
                raise InvalidIntent("'key' must be a string")
        elif "id" in obj:
            ident = obj["id"]
            if isinstance(ident, bool) or not isinstance(ident, str | int):
                raise InvalidIntent("'id' must be a string or an integer")
            key = f"{self.prefix}{ident}"
        else:
            canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"),
                                   ensure_ascii=False)
            digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
            self._seen[digest] += 1
            n = self._seen[digest]
            key = f"{self.prefix}sha256-{digest}" + (f".{n}" if n > 1 else "")
        return BulkLine(line_no, validate_key(key), payload, priority)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_param(text: str) -> tuple[str, Any]:
    """`--param k=v`: the value as JSON when it parses (numbers, booleans, objects), else text."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise InvalidIntent(f"--param {text!r} must look like name=value")
    try:
        value: Any = json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        value = raw
    return name.strip(), value
