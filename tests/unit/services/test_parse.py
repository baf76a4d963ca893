"""Edge validation: what `parse` refuses, and how it names the problem."""

from __future__ import annotations

import orjson

from services.hub import parse

SUBJECT = "wingsmith.cmd.cluster.register"


def refusal(data: bytes, subject: str = SUBJECT, limit: int = 65536) -> dict[str, object]:
    reply = parse(subject, data, limit)
    assert isinstance(reply, bytes), "expected a refusal"
    body = orjson.loads(reply)
    assert body["ok"] is False
    return body["error"]  # type: ignore[no-any-return]


def test_a_valid_command_parses() -> None:
    command = parse(SUBJECT, b'{"command_id": "c1", "cluster_id": "east"}', 65536)
    assert not isinstance(command, bytes)
    assert command.command_id == "c1"


def test_size_is_checked_before_anything_is_parsed() -> None:
    error = refusal(b"x" * 2000, limit=1024)
    assert error["code"] == "payload_too_large"
    assert error["details"] == {"limit": 1024, "size": 2000}


def test_no_coercion_of_types() -> None:
    error = refusal(b'{"command_id": 7, "cluster_id": "east"}')
    assert error["details"]["errors"][0]["field"] == "command_id"  # type: ignore[index]


def test_every_problem_is_listed() -> None:
    error = refusal(b'{"cluster_id": "East!", "extra": 1}')
    fields = {e["field"] for e in error["details"]["errors"]}  # type: ignore[index]
    assert fields == {"command_id", "cluster_id", "extra"}


def test_unknown_subject() -> None:
    error = refusal(b"{}", subject="wingsmith.cmd.cluster.explode")
    assert error["code"] == "unknown_command"
    assert "cluster.register" in error["details"]["known"]  # type: ignore[operator]
