"""No poison messages: an event already in the store that no stage expects (an id that is not a
subject token, a field of the wrong type, as old history or a bug could leave) never stops the
relay, the projector or the scheduler. The relay publishes it with its ids encoded, the stages
that cannot fold it set it aside on WINGSMITH_DEAD, and what comes after flows on."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.dead_letters import DeadLetters, stored
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.domain.commands import Command, ObserveHeartbeat
from wingsmith.domain.names import DEAD_STREAM
from wingsmith.domain.replica import Replica, ReplicaStarted
from wingsmith.services.config import Settings
from wingsmith.services.hub.ingest import MAX_ATTEMPTS, ingest
from wingsmith.services.hub.wiring import Hub, running_hub
from wingsmith.services.tasks import cancel_and_wait

from .conftest import (
    published,
    read_store,
    seed_deployment,
    send_until_answered,
    stream_ids,
    wait_for,
)

POD = "pod a\tb\x0b\x0c.*>é"  # a space, a tab, a vertical tab, a form feed, wildcards, unicode


async def store_as_history(hub: Hub, pod: str, **fields: Any) -> int:
    """A ReplicaStarted written straight to the store, unvalidated, as old history would hold
    it; its store position."""
    values: dict[str, Any] = {
        "deployment_id": "llama--east",
        "name": pod,
        "node_id": "node 1",
        "device_ids": ("gpu 0",),
        "serving_digest": "svg_0",
        "engine_version": "0.9.2",
        "version": 0,
    } | fields
    event = ReplicaStarted.model_construct(
        originator_id=Replica.store_id(Replica.key_for(values["deployment_id"], pod)),
        originator_version=1,
        timestamp=datetime.now(UTC),
        command_id=f"history-{pod}",
        correlation_id="history",
        **values,
    )
    [note] = await hub.store.run(hub.store.store.save, [event])
    return note.id


async def assert_stream_equals_store(nc: Client, data_dir: Path) -> None:
    """Every stored event on WINGSMITH_EVENTS once, in store order, and nothing else."""

    async def caught_up() -> bool:
        return await stream_ids(nc) == published(read_store(data_dir))

    await wait_for(caught_up, 30, "the stream to equal the store")


async def view(nc: Client, projection: str, key: str) -> dict[str, Any] | None:
    _, payload = (await nats_bus.latest_views(nc, projection)).get(key, (0, None))
    return None if payload is None else orjson.loads(payload)


async def test_a_stored_poisonous_event_is_passed_by_every_stage(
    hub: Hub, client: Client, tmp_path: Path, env: dict[str, str]
) -> None:
    deployment = await seed_deployment(client)  # pending: east has reported no devices yet
    await store_as_history(hub, POD)  # tokens NATS would refuse or misread
    await store_as_history(hub, "p2", device_ids=5)  # no stage can count these devices
    huge = tuple(f"gpu-{i:07d}" for i in range(100_000))  # 1.3 MB: more than NATS takes
    await store_as_history(hub, "p3", device_ids=huge, deployment_id="ghost--west")

    # the relay published both, ids encoded, and kept going
    await assert_stream_equals_store(client, tmp_path / "hub")
    on_stream = await stream_ids(client)
    assert "replica:llama--east--pod=20a=09b=0B=0C-=2A=3E=C3=A9:1" in on_stream

    # the projector folded the first under its own key, set the second aside, and goes on
    async def allocated() -> bool:
        return await view(client, "allocations", Replica.key_for(deployment, POD)) is not None

    await wait_for(allocated, 20, "the odd replica's allocation view")
    quota = {"command_id": "sentinel", "project": "later", "device_class": "H100", "devices": 1}
    assert (await send_until_answered(client, "project.set_quota", quota))["ok"]

    async def sentinel_seen() -> bool:
        return await view(client, "quota_use", "later.H100") is not None

    await wait_for(sentinel_seen, 20, "a later command in the views")

    # the scheduler set the second aside and still admits what comes after
    inventory = {
        "command_id": "inv",
        "cluster_id": "east",
        "nodes": [{"node_id": "n1", "device_class": "H100", "devices": 8}],
    }
    assert (await send_until_answered(client, "cluster.report_inventory", inventory))["ok"]

    async def admitted() -> bool:
        health = await view(client, "deployment_health", deployment)
        return health is not None and health["admission"]["phase"] != "pending"

    await wait_for(admitted, 20, "the deployment admitted after the poison")

    async def both_set_aside() -> bool:
        counts = await stored(client)
        return counts.get("projector", 0) >= 1 and counts.get("scheduler", 0) >= 1

    await wait_for(both_set_aside, 20, "the projector and the scheduler to set it aside")
    records = [
        orjson.loads(m.data)
        async for m in nats_bus.read_stream(
            client, DEAD_STREAM, "wingsmith.dead.projector", follow=False
        )
    ]
    by_subject = {r["subject"].split(".")[3]: r for r in records}
    wrong_type, oversized = by_subject["llama--east--p2"], by_subject["ghost--west--p3"]
    assert "TypeError" in wrong_type["reason"] and '"device_ids":5' in wrong_type["data"]
    assert oversized["reason"] == "not an event: event: missing or not dict"
    assert '"oversized":' in oversized["data"]
    assert hub.dead_letters.counts["scheduler"] >= 1
    await assert_stream_equals_store(client, tmp_path / "hub")

    # and a person can read them, by component, with their reasons
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "wingsmith", "dead-letters", "--component", "scheduler"],
        env=env | {"WINGSMITH_NATS_URL": hub.nats_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    [line] = shown.stdout.splitlines()
    assert "scheduler" in line and "llama--east--p2" in line and "TypeError" in line


async def test_an_observation_whose_handling_keeps_failing_is_set_aside(client: Client) -> None:
    """The hub's handler raising on one observation (a bug) costs that observation, after a few
    tries, not every one published after it."""
    await nats_bus.ensure_streams(client)
    dead = DeadLetters(client)
    handled: list[str] = []

    async def execute(command: Command) -> dict[str, Any]:
        assert isinstance(command, ObserveHeartbeat)
        if command.operator.instance == "bug":
            raise RuntimeError("a handler's bug")
        handled.append(command.operator.instance)
        return {"ok": True, "result": {}}

    for n, instance in enumerate(["bug", "after"]):
        body = {
            "cluster_id": "east",
            "operator": {"instance": instance, "version": "1", "read_only": False},
        }
        await nats_bus.publish_observation(client, "east", "heartbeat", body, f"hb-{n}")
    task = asyncio.create_task(
        ingest(lambda: nats_bus.observation_batches(client), execute, dead=dead)
    )
    try:

        async def passed() -> bool:  # (executed again while the one before was retried)
            return await stored(client) == {"ingest": 1} and handled[-1:] == ["after"]

        await wait_for(passed, 30, "the failing observation set aside, the next one handled")
        settled = len(handled)
        await asyncio.sleep(1.5)  # longer than a retry's delay: nothing comes back
        assert len(handled) == settled
    finally:
        await cancel_and_wait(task)
    kept = await client.jetstream().get_last_msg(DEAD_STREAM, "wingsmith.dead.ingest")
    record = orjson.loads(kept.data or b"")
    assert record["subject"] == "wingsmith.obs.east.heartbeat" and '"bug"' in record["data"]
    assert f"failed {MAX_ATTEMPTS} times" in record["reason"]


async def test_a_stream_published_before_ids_were_encoded_is_resumed(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """An earlier relay published an id with a vertical tab as it was; a relay that encodes ids
    resumes after it instead of taking the stream for another store's."""
    data_dir = tmp_path / "hub"
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=data_dir)
    async with running_hub(settings) as hub:
        await store_as_history(hub, "pod\x0bb")

        async def published_once() -> bool:
            return len(await stream_ids(client)) == 1

        await wait_for(published_once, 20, "the event on the stream")
    # the stream as the earlier relay left it: the same event under its raw id and subject
    await client.jetstream().purge_stream(names.EVENTS_STREAM)
    [note] = read_store(data_dir)
    await client.jetstream().publish(
        "wingsmith.evt.replica.llama--east--pod\x0bb.ReplicaStarted",
        b"{}",
        stream=names.EVENTS_STREAM,
        headers={
            "Nats-Msg-Id": f"{note.originator_id}:1",
            nats_bus.POSITION_HEADER: str(note.id),
        },
    )
    async with running_hub(settings) as hub:
        quota = {"command_id": "after", "project": "later", "device_class": "H100", "devices": 1}
        assert (await send_until_answered(client, "project.set_quota", quota))["ok"]

        async def resumed() -> bool:  # the old event as it was, then the store after it
            ids = await stream_ids(client)
            return ids[1:] == published(read_store(data_dir))[1:] and len(ids) > 1

        await wait_for(resumed, 20, "the relay to publish after the old event")
        assert hub.relay is not None and hub.relay.mismatch is None
