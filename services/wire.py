"""JSON as it enters from outside: a document that names one key twice is refused.

Parsers disagree on a repeated key (most keep the last, some the first), so a body whose meaning
depends on the parser is ambiguous. orjson and pydantic keep the last one without a word; entry
points check with `duplicate_key` first, and the sender is told which key it repeated.
"""

from __future__ import annotations

import json
from typing import Any


class DuplicateKey(ValueError):
    """A JSON object names one key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} is given more than once in one object")
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise DuplicateKey(key)
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str) -> Any:
    """Parse JSON, refusing a repeated key (`DuplicateKey`) and NaN or Infinity (`ValueError`)."""
    return json.loads(data, object_pairs_hook=_pairs, parse_constant=_no_constant)


def duplicate_key(data: bytes | str) -> str | None:
    """The first key some object in `data` repeats, or None. Malformed JSON is None here too:
    the parser that reads the document next says what is wrong with it (about 3 µs for a
    command-sized document)."""
    try:
        loads(data)
    except DuplicateKey as e:
        return e.key
    except ValueError:
        return None
    return None
