"""The command API over a real nats-server: answers, refusals that store nothing, idempotency."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain.contracts.replies import Reply
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import Hub, running_hub

from ..schemas import check
from .conftest import LLAMA, seed_deployment, send, send_until_answered, stream_ids, wait_for


def stored(hub: Hub) -> int:
    return hub.store.store.last_position()


async def test_a_command_is_answered_after_its_events_are_stored(hub: Hub, client: Client) -> None:
    reply = await send(
        client,
        "project.set_quota",
        {
            "command_id": "q-1",
            "project": "research",
            "device_class": "H100",
            "devices": 16,
        },
    )
    assert reply["ok"] is True
    assert [e["type"] for e in reply["result"]["events"]] == ["ProjectRegistered", "QuotaSet"]
    assert reply["result"]["quota"] == {"H100": 16}
    assert stored(hub) == 3  # two events and the command's receipt


async def test_events_reach_the_stream_with_causation(plain_hub: Hub, client: Client) -> None:
    deployment = await seed_deployment(client)
    reply = await send(
        client,
        "deployment.set_engine_args",
        {
            "command_id": "args-1",
            "correlation_id": "rollout-7",
            "deployment_id": deployment,
            "engine_args": ["--enforce-eager"],
        },
    )
    assert reply["ok"], reply
    sub = await client.jetstream().subscribe(
        f"wingsmith.evt.deployment.{deployment}.EngineArgsSet", ordered_consumer=True
    )
    msg = await sub.next_msg(timeout=10)
    await sub.unsubscribe()
    import orjson

    event = orjson.loads(msg.data)
    assert event["type"] == "EngineArgsSet" and event["aggregate_id"] == deployment
    assert event["event"]["command_id"] == "args-1"
    assert event["event"]["correlation_id"] == "rollout-7"
    assert event["event"]["engine_args"] == ["--enforce-eager"]
    assert msg.headers["Nats-Msg-Id"] == f"deployment:{deployment}:2"  # type: ignore[index]


WORKLOAD = {
    "command_id": "x",
    "workload_id": "w",
    "project": "p",
    "device_class": "H100",
    "replicas": 1,
    "serving": LLAMA,
}

BAD_INPUTS: list[tuple[str, str, bytes | dict[str, Any], str, str | None]] = [
    (
        "malformed JSON",
        "project.set_quota",
        b'{"command_id": "x", "project": ',
        "invalid_json",
        None,
    ),
    ("not an object", "project.set_quota", b"[1, 2]", "validation_error", "(body)"),
    (
        "unknown field",
        "project.set_quota",
        {"command_id": "x", "project": "p", "device_class": "H100", "devices": 1, "colour": "red"},
        "validation_error",
        "colour",
    ),
    (
        "wrong type",
        "project.set_quota",
        {"command_id": "x", "project": "p", "device_class": "H100", "devices": "8"},
        "validation_error",
        "devices",
    ),
    (
        "missing field",
        "project.set_quota",
        {"command_id": "x", "project": "p", "device_class": "H100"},
        "validation_error",
        "devices",
    ),
    (
        "out of range",
        "project.set_quota",
        {"command_id": "x", "project": "p", "device_class": "H100", "devices": -1},
        "validation_error",
        "devices",
    ),
    (
        "bad name",
        "cluster.register",
        {"command_id": "x", "cluster_id": "East Coast"},
        "validation_error",
        "cluster_id",
    ),
    (
        "nested out of range",
        "workload.create",
        WORKLOAD | {"serving": LLAMA | {"parallelism": {"tensor": 0}}},
        "validation_error",
        "serving.parallelism.tensor",
    ),
    (
        "inconsistent values",
        "workload.create",
        WORKLOAD | {"serving": LLAMA | {"parallelism": {"tensor": 2}}},
        "validation_error",
        "serving",
    ),
    (
        "unknown enum",
        "workload.create",
        WORKLOAD | {"serving": LLAMA | {"backend": "llamacpp"}},
        "validation_error",
        "serving.backend",
    ),
    (
        "missing command_id",
        "cluster.register",
        {"cluster_id": "east"},
        "validation_error",
        "command_id",
    ),
    (
        "unknown project",
        "workload.create",
        {
            "command_id": "x",
            "workload_id": "w",
            "project": "nobody",
            "device_class": "H100",
            "replicas": 1,
            "serving": LLAMA,
        },
        "not_found",
        "project",
    ),
    (
        "unknown workload",
        "workload.scale",
        {"command_id": "x", "workload_id": "w", "replicas": 3},
        "not_found",
        "workload_id",
    ),
    (
        "unknown deployment",
        "deployment.disable",
        {"command_id": "x", "deployment_id": "w--e"},
        "not_found",
        "deployment_id",
    ),
    (
        "oversized payload",
        "deployment.set_engine_args",
        {"command_id": "x", "deployment_id": "w--e", "engine_args": ["--x" * 1000] * 30},
        "payload_too_large",
        None,
    ),
    ("unknown command", "deployment.explode", {"command_id": "x"}, "unknown_command", None),
]


@pytest.mark.parametrize(
    ("verb", "body", "code", "field"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
async def test_bad_input_is_refused_naming_the_field_and_nothing_is_stored(
    hub: Hub, client: Client, verb: str, body: bytes | dict[str, Any], code: str, field: str | None
) -> None:
    before = stored(hub)
    reply = await send(client, verb, body)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code, reply
    assert reply["error"]["message"]
    if field is not None:
        details = reply["error"]["details"]
        fields = [e["field"] for e in details.get("errors", [])] + [details.get("field")]
        assert field in fields, reply
        assert field in reply["error"]["message"] or details.get("field") == field
    assert stored(hub) == before


async def test_every_reply_is_what_the_replies_contract_says(hub: Hub, client: Client) -> None:
    """Answers, resends and refusals: each exactly a `Reply` (domain/contracts/replies.py)."""
    deployment = await seed_deployment(client)
    args = {"command_id": "c-1", "deployment_id": deployment, "engine_args": ["--enforce-eager"]}
    sent: list[tuple[str, dict[str, Any]]] = [
        ("deployment.set_engine_args", args),
        ("deployment.set_engine_args", args),  # a resend
        ("deployment.set_engine_args", args | {"engine_args": []}),  # its command_id reused
        ("deployment.set_engine_args", {"command_id": "c-2"}),  # invalid
        ("deployment.enable", {"command_id": "c-3", "deployment_id": "nowhere--east"}),
        ("workload.delete", {"command_id": "c-4", "workload_id": "llama"}),
    ]
    replies = [await send(client, verb, body) for verb, body in sent]
    assert [r["ok"] for r in replies] == [True, True, False, False, False, True], replies
    assert replies[1]["duplicate"] is True
    for reply in replies:
        check(Reply, reply)


async def test_unknown_cluster_pin_is_refused(hub: Hub, client: Client) -> None:
    await send(
        client,
        "project.set_quota",
        {"command_id": "q", "project": "p", "device_class": "H100", "devices": 1},
    )
    before = stored(hub)
    reply = await send(
        client,
        "workload.create",
        {
            "command_id": "w",
            "workload_id": "w",
            "project": "p",
            "device_class": "H100",
            "replicas": 1,
            "serving": LLAMA,
            "cluster": "nowhere",
        },
    )
    assert (reply["error"]["code"], reply["error"]["details"]["field"]) == ("not_found", "cluster")
    assert stored(hub) == before


async def test_the_same_command_twice_has_the_effect_of_once(hub: Hub, client: Client) -> None:
    body = {"command_id": "quota-42", "project": "research", "device_class": "H100", "devices": 8}
    first = await send(client, "project.set_quota", body)
    after_first = stored(hub)
    again = await asyncio.gather(*(send(client, "project.set_quota", body) for _ in range(5)))
    assert all(r["result"] == first["result"] and r["duplicate"] for r in again)
    assert stored(hub) == after_first


async def test_a_command_id_cannot_be_reused_for_another_command(hub: Hub, client: Client) -> None:
    body = {"command_id": "quota-43", "project": "research", "device_class": "H100", "devices": 8}
    assert (await send(client, "project.set_quota", body))["ok"]
    reply = await send(client, "project.set_quota", body | {"devices": 9})
    assert reply["error"]["code"] == "command_id_reused"
    assert reply["error"]["details"]["field"] == "command_id"


async def test_idempotency_survives_a_hub_restart(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(  # only commands write: the scheduler would add placement's events
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", admission=False
    )
    create = {
        "command_id": "create-llama",
        "workload_id": "llama",
        "project": "research",
        "device_class": "H100",
        "serving": LLAMA,
        "replicas": 2,
    }
    async with running_hub(settings) as first_hub:
        await send_until_answered(
            client,
            "project.set_quota",
            {"command_id": "q", "project": "research", "device_class": "H100", "devices": 8},
        )
        original = await send_until_answered(client, "workload.create", create)
        before = stored(first_hub)
    async with running_hub(settings) as second_hub:  # a fresh hub: nothing remembered in memory
        again = await send_until_answered(client, "workload.create", create)
        assert stored(second_hub) == before
    assert again["ok"] and again["duplicate"]
    assert again["result"] == original["result"]


async def test_concurrent_commands_on_one_deployment_lose_no_update(
    plain_hub: Hub, client: Client
) -> None:
    deployment = await seed_deployment(client)
    replies = await asyncio.gather(
        *(
            send(
                client,
                "deployment.set_engine_args",
                {
                    "command_id": f"args-{i}",
                    "deployment_id": deployment,
                    "engine_args": [f"--seed={i}"],
                },
            )
            for i in range(200)
        )
    )
    assert all(r["ok"] for r in replies)
    versions = sorted(e["version"] for r in replies for e in r["result"]["events"])
    assert versions == list(range(2, 202))  # every update is its own version, none lost
    last = max(replies, key=lambda r: r["result"]["events"][0]["version"])
    assert plain_hub.store.store.load(f"deployment:{deployment}").engine_args == tuple(  # type: ignore[union-attr]
        last["result"]["engine_args"]
    )

    async def relayed() -> bool:
        return len(await stream_ids(client)) == 6 + 200  # the seed's six events, then ours

    await wait_for(relayed, what="every event on the stream")


async def test_a_command_id_is_one_command_whatever_its_correlation_but_not_another_verb(
    hub: Hub, client: Client
) -> None:
    deployment_id = await seed_deployment(client, "verb")
    body = {"command_id": "one-key", "deployment_id": deployment_id}
    first = await send(client, "deployment.disable", body | {"correlation_id": "try-1"})
    again = await send(client, "deployment.disable", body | {"correlation_id": "try-2"})
    assert first["ok"] and again["duplicate"]  # a retry under a new correlation id
    other = await send(client, "deployment.enable", body)
    assert other["error"]["code"] == "command_id_reused"  # same fields, another command
