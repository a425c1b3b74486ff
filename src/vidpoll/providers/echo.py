"""Comparing an input a provider echoes in its records with the one vidpoll sent: what every
provider's `Rules.match_created` shares (Replicate's `input`, fal's `json_input`, Luma's
`request`). Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any, Literal

Match = Literal["same", "other", "unsure"]
"""What `Rules.match_created` says of one record: a create of the intent, of something else,
or one that cannot be told apart."""

_END = object()


def json_strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, in document order (iterative: any depth)."""
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        node = next(stack[-1], _END)
        if node is _END:
            stack.pop()
        elif isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            stack.append(iter(node.values()))
        elif isinstance(node, list | tuple):
            stack.append(iter(node))


def json_equal(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON: 1 == 1.0, but true is not 1 (Python's
    bool is an int), objects by their members, arrays in order. Iterative: any depth."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, bool) or isinstance(y, bool):
            if not (isinstance(x, bool) and isinstance(y, bool) and x == y):
                return False
        elif ((isinstance(x, int | float) and isinstance(y, int | float))
              or (isinstance(x, str) and isinstance(y, str))):
            if x != y:
                return False
        elif x is None and y is None:
            continue
        elif isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list | tuple) and isinstance(y, list | tuple):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        else:
            return False
    return True


def holds_data_uri(value: Any) -> bool:
    """Whether a JSON value holds a `data:` URI anywhere: a provider may keep such an upload
    as a file URL of its own, so the field cannot be compared with what was sent."""
    return any(s[:5].lower() == "data:" for s in json_strings(value))


def fields_verdict(payload: dict[str, Any], echoed: dict[str, Any], shown: bool,
                   skip: Collection[str] = ()) -> Match:
    """Every field of `payload` (but `skip`) against the record's echo of the input: `other`
    as soon as one is echoed with another value (as JSON), unless it holds a `data:` URI (a
    provider may keep such an upload as a URL of its own: `unsure`); `unsure` when one is
    missing, or when the record does not show what it was made for (`shown` False: the
    model or endpoint); else `same` (fields the provider added do not count)."""
    verdict: Match = "same" if shown else "unsure"
    for field, value in payload.items():
        if field in skip:
            continue
        if field not in echoed:
            verdict = "unsure"
        elif not json_equal(value, echoed[field]):
            if holds_data_uri(value):
                verdict = "unsure"
            else:
                return "other"
    return verdict
