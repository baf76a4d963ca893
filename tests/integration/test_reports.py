"""Bad reports against a running hub on a real nats-server: each is refused, set aside on
`wingsmith.dead.ingest` with the field and the problem, and nothing of it is stored; the
reports after them, and the event stream, flow on. Also: the streams carry their limits, and
a projector that resumes from a sequence the stream no longer holds reads it from the store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.js.errors
import orjson
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain import commands as c
from wingsmith.domain import names
from wingsmith.domain.base import Cause, Writer
from wingsmith.domain.cluster import Cluster
from wingsmith.domain.names import DEAD_STREAM
from wingsmith.services.config import Settings
from wingsmith.services.hub.ingest import parse
from wingsmith.services.hub.relay import to_message
from wingsmith.services.hub.wiring import Hub, running_hub, running_projector
from wingsmith.services.tasks import cancel_and_wait

from .conftest import published, read_store, seed_deployment, stream_ids, wait_for
from .test_projector import kv_view, rebuilt

CAUSE = Cause(
    command_id="obs:east:1",
    correlation_id="obs:east:1",
    at=datetime.now(UTC),
    writer=Writer.CLUSTER,
)
NODE = {"node_id": "gpu-1", "device_class": "H100", "devices": 4, "device_ids": ["G0", "G1"]}
REPLICA = {
    "cluster_id": "east",
    "deployment_id": "llama--east",
    "pod": "llama-worker-0",
    "node_id": "gpu-1",
    "device_ids": ["G0"],
    "serving_digest": "svg_1",
    "engine_version": "0.9.2",
    "state": "started",
    "version": 1,
}

SYNCED = {
    k: REPLICA[k] for k in ("pod", "node_id", "device_ids", "serving_digest", "engine_version")
}
SYNCED["state"] = "ready"
SYNC = {"cluster_id": "east", "deployment_id": "llama--east", "replicas": [SYNCED], "version": 2}


@contextlib.asynccontextmanager
async def hub_only(settings: Settings) -> AsyncIterator[Hub]:
    async with running_hub(settings) as hub:
        yield hub


def settings_for(nats_server: EmbeddedNatsServer, tmp_path: Path, **changes: Any) -> Settings:
    """A hub without the projector process and the admission process: only commands and
    reports write, so the test counts exactly what they stored."""
    values: dict[str, Any] = {"projector": False, "admission": False} | changes
    return Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", **values)


async def report(client: Client, kind: str, body: dict[str, Any] | bytes, msg_id: str) -> None:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    await client.jetstream().publish(
        f"wingsmith.obs.east.{kind}", data, stream="WINGSMITH_OBS", headers={"Nats-Msg-Id": msg_id}
    )


async def dead_letters(client: Client) -> list[dict[str, Any]]:
    js = client.jetstream()
    info = await js.stream_info(DEAD_STREAM)
    kept = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(DEAD_STREAM, seq=seq)
        if msg.subject == names.dead_subject("ingest"):
            kept.append(orjson.loads(msg.data))  # type: ignore[arg-type]
    return kept


BAD: list[tuple[str, dict[str, Any] | bytes, str]] = [  # kind, body, the reason names
    ("replica", REPLICA | {"pod": "llama worker 0"}, "pod: 'llama worker 0' is not a DNS"),
    ("replica", REPLICA | {"pod": "llama\tworker"}, "pod: 'llama\\tworker' is not a DNS"),
    ("replica", REPLICA | {"pod": "llama\x0bworker"}, "pod: 'llama\\x0bworker' is not a DNS"),
    ("replica", REPLICA | {"pod": "llama\x0cworker"}, "pod: 'llama\\x0cworker' is not a DNS"),
    ("replica", REPLICA | {"node_id": "gpu-9"}, "node_id: node 'gpu-9' is not in the inventory"),
    ("replica", REPLICA | {"device_ids": ["G7"]}, "device_ids: device 'G7' is not one of"),
    ("replica", REPLICA | {"device_ids": ["G0", "G0"]}, "device_ids: 'G0' is listed more than"),
    ("inventory", {"cluster_id": "east", "nodes": [NODE | {"devices": "8"}]}, "nodes.0.devices"),
    (
        "inventory",
        {"cluster_id": "east", "nodes": [NODE | {"devices": 10_240_000}]},
        "nodes.0.devices: Input should be less than or equal to 256",
    ),
    ("inventory", {"cluster_id": "east", "nodes": [NODE] * 1000}, "nodes: 'gpu-1' is listed"),
    ("inventory", b'{"cluster_id": "east", "nodes": [], "nodes": []}', "nodes: key 'nodes'"),
    ("sync", SYNC | {"replicas": [SYNCED | {"pod": "llama worker 0"}]}, "replicas.0.pod: 'llama"),
    ("sync", SYNC | {"replicas": [SYNCED, SYNCED]}, "replicas: 'llama-worker-0' is listed"),
]


def holds(settings: Settings, event_type: str) -> Callable[[], Awaitable[bool]]:
    """For `wait_for`: whether the hub's store holds an event of `event_type`."""

    async def stored() -> bool:
        return any(n.topic.endswith(event_type) for n in read_store(settings.data_dir))

    return stored


async def test_bad_reports_are_set_aside_and_nothing_of_them_is_stored(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = settings_for(nats_server, tmp_path)
    async with hub_only(settings) as hub:
        await seed_deployment(client)
        await report(client, "inventory", {"cluster_id": "east", "nodes": [NODE]}, "inv-1")

        await wait_for(holds(settings, "InventoryReported"), 20, "the good inventory")
        before = read_store(settings.data_dir)
        for n, (kind, body, _) in enumerate(BAD):
            await report(client, kind, body, f"bad-{n}")
        with pytest.raises(nats.js.errors.APIError, match="message size exceeds maximum"):
            padding = " " * nats_bus.MAX_REPORT
            await report(client, "heartbeat", f'{{"cluster_id": "east"{padding}}}'.encode(), "big")
        await report(client, "replica", REPLICA, "good-replica")

        await wait_for(holds(settings, "ReplicaStarted"), 20, "the good replica after the bad ones")
        assert hub.relay is not None
        await hub.relay.idle()
        after = read_store(settings.data_dir)
        # only the good replica's report was stored: its replica, its deployment's roster and
        # its receipt (the deployment, never admitted here, does not move)
        added = sorted(n.topic.rpartition(".")[2].rpartition(":")[2] for n in after[len(before) :])
        assert added == ["CommandHandled", "ReplicaStarted", "RosterJoined", "RosterOpened"], added
        # the event stream holds everything stored, in order: nothing stopped it
        assert await stream_ids(client) == published(after)
        kept = await dead_letters(client)

    assert len(kept) == len(BAD)  # each once; those the hub refused after parsing come later
    reasons = sorted((letter["subject"], letter["reason"]) for letter in kept)
    for kind, _, named in BAD:
        subject = f"wingsmith.obs.east.{kind}"
        assert any(s == subject and named in reason for s, reason in reasons), (named, reasons)


async def test_every_stream_has_size_message_and_age_limits(client: Client) -> None:
    await nats_bus.ensure_streams(client, max_bytes={"WINGSMITH_EVENTS": 64 * 1024**2})
    js = client.jetstream()
    configs = {s.name: (await js.stream_info(s.name)).config for s in nats_bus.STREAMS}  # type: ignore[arg-type]
    assert configs["WINGSMITH_EVENTS"].max_bytes == 64 * 1024**2  # as configured
    for name, config in configs.items():
        assert config.max_bytes and config.max_bytes > 0, name
        assert config.max_msg_size and config.max_msg_size <= nats_bus.MAX_MESSAGE, name
    assert configs["WINGSMITH_OBS"].max_age == 7 * 24 * 3600
    assert configs["WINGSMITH_OBS"].max_msg_size == nats_bus.MAX_REPORT
    assert configs["WINGSMITH_OBS"].max_msgs_per_subject == nats_bus.OBS_PER_SUBJECT
    assert configs["WINGSMITH_DEAD"].max_age == 30 * 24 * 3600


async def test_a_projector_resuming_where_the_stream_was_cut_reads_the_gap_from_the_store(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = settings_for(nats_server, tmp_path)
    async with hub_only(settings) as hub:
        await seed_deployment(client)
        await report(client, "inventory", {"cluster_id": "east", "nodes": [NODE]}, "inv-1")
        await report(client, "replica", REPLICA, "replica-1")

        await wait_for(holds(settings, "ReplicaStarted"), 20, "the replica")
        assert hub.relay is not None
        await hub.relay.idle()
        # the stream's size limit discarded all but the last event before any projector ran
        await client.jetstream().purge_stream("WINGSMITH_EVENTS", keep=1)
        async with running_projector(settings):
            expected = rebuilt(settings.data_dir)

            async def views_complete() -> bool:
                for projection, views in expected.items():
                    for key, view in views.items():
                        if await kv_view(client, projection, key) != view:
                            return False
                return True

            await wait_for(views_complete, 30, "every view, the discarded events included")
    assert expected["capacity"]["east.H100"]["allocated"] == 1  # from the replica, on the stream
    assert expected["workloads"]["llama"]  # from the first events, read from the store


def heartbeat(cluster: str, instance: int) -> dict[str, Any]:
    operator = {"instance": f"i{instance}", "version": "1.0", "read_only": False}
    return {"cluster_id": cluster, "operator": operator}


async def test_a_runaway_cluster_is_slowed_without_loss_and_others_go_through(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = settings_for(nats_server, tmp_path, observation_rate=1.0, observation_burst=5.0)
    handled: dict[str, int] = {"east": 0, "west": 0}

    async def on_event(msg: Any) -> None:  # each heartbeat from a new instance is one event
        handled[msg.subject.split(".")[3]] += 1

    async with hub_only(settings):
        sub = await client.subscribe("wingsmith.evt.cluster.*.OperatorConnected", cb=on_event)
        for n in range(20):  # four times its burst, at once
            await report(client, "heartbeat", heartbeat("east", n), f"east-{n}")
        for n in range(3):
            west = heartbeat("west", n) | {"cluster_id": "west"}
            await client.jetstream().publish(
                "wingsmith.obs.west.heartbeat",
                orjson.dumps(west),
                stream="WINGSMITH_OBS",
                headers={"Nats-Msg-Id": f"west-{n}"},
            )

        async def west_handled() -> bool:
            return handled["west"] == 3

        await wait_for(west_handled, 20, "the well-behaved cluster's reports")
        assert handled["east"] < 20  # the runaway's reports still wait their turn

        async def east_handled() -> bool:
            return handled["east"] == 20

        await wait_for(east_handled, 90, "every report of the runaway, in the end")
        await sub.unsubscribe()


async def test_an_older_hubs_observation_consumer_gets_the_wider_window(client: Client) -> None:
    await nats_bus.ensure_streams(client)
    js = client.jetstream()
    older = ConsumerConfig(ack_wait=30.0, max_ack_pending=20_000, max_deliver=-1)
    await js.pull_subscribe(
        "wingsmith.obs.>", "wingsmith-hub", stream="WINGSMITH_OBS", config=older
    )
    batches = nats_bus.observation_batches(client)
    reading = asyncio.ensure_future(anext(batches))
    try:

        async def widened() -> bool:
            info = await js.consumer_info("WINGSMITH_OBS", "wingsmith-hub")
            return info.config.max_ack_pending == nats_bus.OBS_PENDING  # type: ignore[no-any-return]

        await wait_for(widened, 10, "the wider window")
    finally:
        await cancel_and_wait(reading)
        await batches.aclose()  # type: ignore[attr-defined]


def test_the_largest_inventory_a_report_may_carry_fits_one_event_message(tmp_path: Path) -> None:
    """Nodes with the shortest names inflate most once stored (every default spelled out): the
    most of them a report may hold still make an event under the stream's message limit."""
    nodes = [{"node_id": f"n{i}", "device_class": "A", "devices": 0} for i in range(10_000)]
    data = orjson.dumps({"cluster_id": "east", "nodes": nodes})
    assert len(data) <= nats_bus.MAX_REPORT
    command = parse("wingsmith.obs.east.inventory", data, "east:inventory:1")
    assert isinstance(command, c.ReportInventory)
    store = EventStore(store_env(None, tmp_path))
    try:
        cluster = Cluster.register(CAUSE, "east", None, {})
        cluster.report_inventory(CAUSE, tuple(command.nodes))
        store.save(cluster.collect_events())
        messages = [m for m in map(to_message, store.read(0, 10)) if m is not None]
    finally:
        store.close()
    assert messages[-1].subject.endswith("InventoryReported")
    assert len(messages[-1].payload) < nats_bus.MAX_MESSAGE
