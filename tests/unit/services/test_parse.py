"""Edge validation: what `parse` refuses, and how it names the problem."""

from __future__ import annotations

import orjson
import pytest

from wingsmith.domain.commands import INTERNAL_PREFIXES
from wingsmith.services.hub.service import parse

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
    assert "cluster.register" in error["details"]["known"]  # type: ignore[index]


def test_a_repeated_key_is_refused_naming_it() -> None:
    error = refusal(b'{"command_id": "c1", "cluster_id": "east", "cluster_id": "west"}')
    assert error["code"] == "validation_error"
    assert error["details"]["errors"] == [  # type: ignore[index]
        {
            "field": "cluster_id",
            "problem": "key 'cluster_id' is given more than once",
            "type": "duplicate_key",
        }
    ]


@pytest.mark.parametrize("prefix", INTERNAL_PREFIXES)
def test_the_hubs_own_command_id_prefixes_are_refused_from_clients(prefix: str) -> None:
    error = refusal(orjson.dumps({"command_id": f"{prefix}east:1", "cluster_id": "east"}))
    assert error["code"] == "validation_error"
    assert error["message"] == (
        f"command_id: the prefix {prefix!r} is reserved for the hub's own commands; choose another"
    )


def test_an_id_that_only_looks_like_an_internal_one_is_accepted() -> None:
    command = parse(SUBJECT, b'{"command_id": "observe-1", "cluster_id": "east"}', 65536)
    assert not isinstance(command, bytes)


@pytest.mark.parametrize(
    ("verb", "body", "field"),
    [
        ("deployment.enable", {"deployment_id": "chat--east.x"}, "deployment_id"),
        ("deployment.disable", {"deployment_id": "chat east"}, "deployment_id"),
        ("deployment.set_engine_args", {"deployment_id": "a>", "engine_args": []}, "deployment_id"),
        (
            "deployment.promote_authority",
            {"deployment_id": "a*", "authority": "managed"},
            "deployment_id",
        ),
        ("discovery.track", {"discovery_id": "east--ns--x y"}, "discovery_id"),
        ("discovery.ignore", {"discovery_id": "e" * 384}, "discovery_id"),
        ("discovery.promote", {"discovery_id": "a.b", "project": "p"}, "discovery_id"),
        ("cluster.register", {"cluster_id": "east", "region": "us east"}, "region"),
        ("cluster.register", {"cluster_id": "east", "labels": {"a b": "x"}}, "labels.a b.[key]"),
        ("cluster.register", {"cluster_id": "east", "labels": {"tier": "x\ty"}}, "labels.tier"),
        (
            "cluster.report_inventory",
            {
                "cluster_id": "east",
                "nodes": [{"node_id": "n 1", "device_class": "H", "devices": 1}],
            },
            "nodes.0.node_id",
        ),
    ],
)
def test_ids_and_names_that_become_subjects_or_keys_are_checked(
    verb: str, body: dict[str, object], field: str
) -> None:
    error = refusal(orjson.dumps({"command_id": "c1"} | body), subject=f"wingsmith.cmd.{verb}")
    assert [e["field"] for e in error["details"]["errors"]] == [field]  # type: ignore[index]
