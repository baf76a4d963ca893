"""The hub's consumer sweep on a real nats-server running the configuration
`adapters.nats_auth.server_config` generates, with a real hub and real operators on simulated
clusters: a durable consumer a reader makes under a name of its own is deleted and logged; the
hub's and the operators' consumers (including one whose operator starts later) stay as they
were; readers' ordered consumers keep delivering."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from wingsmith.adapters import nats_auth, nats_bus
from wingsmith.adapters.nats_auth import Credentials
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.domain.names import HUB_CONSUMER
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import Hub, running_hub
from wingsmith.services.operator.backends.simulated import SimNode, SimulatedCluster
from wingsmith.services.operator.runtime import OperatorOptions, run_operator
from wingsmith.services.tasks import cancel_and_wait

from .conftest import PASSWORDS, roles_config

EVENTS, RENDER, OBS = names.EVENTS_STREAM, names.RENDER_STREAM, names.OBS_STREAM
SWEEP = 0.2  # seconds between sweeps: short, so that a test sees several
VANISHED = "vanished: recreating it"  # what an operator logs when its consumer was deleted


@dataclass
class World:
    server: EmbeddedNatsServer
    hub: Hub
    caplog: pytest.LogCaptureFixture
    stack: contextlib.AsyncExitStack

    async def login(self, user: str) -> Client:
        nc = await nats_bus.connect(
            self.server.url, f"sweep-{user}", user=user, password=PASSWORDS[user]
        )
        self.stack.push_async_callback(nc.close)
        return nc

    async def start_operator(self, cluster_id: str) -> None:
        """The operator of `cluster_id`, logged in as its own user, on a simulated cluster."""
        user = nats_auth.operator_user(cluster_id)
        nc = await nats_bus.connect_operator(
            self.server.url, cluster_id, user=user, password=PASSWORDS[user]
        )
        self.stack.push_async_callback(nc.close)
        cluster = SimulatedCluster(cluster_id, [SimNode(f"{cluster_id}-n1", "H100", 4)])
        options = OperatorOptions(cluster_id=cluster_id, simulated=True, heartbeat_every=0.5)
        task = asyncio.create_task(run_operator(nc, cluster, options), name=cluster_id)
        self.stack.push_async_callback(cancel_and_wait, task)

    async def created(self, stream: str, name: str) -> datetime | None:
        """When the consumer was created, None if there is none."""
        try:
            info = await self.hub.nc.jetstream().consumer_info(stream, name)
        except NotFoundError:
            return None
        created: datetime = info.created
        return created

    async def until_created(self, stream: str, name: str) -> datetime:
        async with asyncio.timeout(30):
            while (created := await self.created(stream, name)) is None:
                await asyncio.sleep(0.02)
        return created

    async def until_gone(self, stream: str, name: str) -> None:
        """A bound that only stops a broken sweep from hanging the test; a sweep every 0.2 s
        deletes a stranger on its second sighting."""
        async with asyncio.timeout(30):
            while await self.created(stream, name) is not None:
                await asyncio.sleep(0.05)

    def deletions(self) -> list[str]:
        return [
            r.getMessage()
            for r in self.caplog.records
            if r.name == "wingsmith.services.hub.janitor" and r.getMessage().startswith("deleted ")
        ]


@pytest.fixture
async def world(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[World]:
    config = roles_config()
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(
            EmbeddedNatsServer(tmp_path / "nats", config=config)
        )
        settings = Settings(
            nats_url=server.url,
            store_url=None,
            data_dir=tmp_path / "hub",
            projector=False,  # no view is needed here: spare the process
            nats_credentials=Credentials("hub", PASSWORDS["hub"]),
            consumer_sweep=SWEEP,
        )
        hub = await stack.enter_async_context(running_hub(settings))
        w = World(server, hub, caplog, stack)
        await w.start_operator("east")
        await w.until_created(RENDER, "operator-east")
        yield w


async def own_durable(nc: Client, stream: str, name: str, subjects: str) -> None:
    """What a reader may do despite its permissions: name a consumer of its own, durable."""
    config = ConsumerConfig(name=name, durable_name=name, filter_subject=subjects)
    await nc.jetstream().add_consumer(stream, config)


@pytest.mark.parametrize("reader", ["cli", "api", "viewer"])
async def test_a_readers_own_durable_is_deleted_and_nothing_else(world: World, reader: str) -> None:
    hubs = await world.until_created(OBS, HUB_CONSUMER)
    easts = await world.until_created(RENDER, "operator-east")
    nc = await world.login(reader)
    follower = nats_bus.read_stream(
        await world.login("viewer"), OBS, "wingsmith.obs.east.heartbeat", follow=True
    )
    try:
        before = (await anext(follower)).seq  # an ordered consumer, reading as the sweeps run
        name = f"{reader}-keeps-this"
        await own_durable(nc, EVENTS, name, "wingsmith.evt.>")
        assert await world.created(EVENTS, name) is not None  # the server let it through
        await world.until_gone(EVENTS, name)
        after = (await anext(follower)).seq
    finally:
        await follower.aclose()
    assert after > before
    (deleted,) = world.deletions()
    assert f"durable consumer '{name}' on stream {EVENTS} (filter wingsmith.evt.>)" in deleted
    assert "1 deleted since start" in deleted
    assert await world.created(OBS, HUB_CONSUMER) == hubs
    assert await world.created(RENDER, "operator-east") == easts
    assert VANISHED not in world.caplog.text
    assert "permissions violation" not in world.caplog.text


async def test_an_operator_started_later_keeps_its_consumer(world: World) -> None:
    """West's operator starts after the hub has swept for a while: it creates its consumer and
    sends its first heartbeat at the same time; the sweep must not take the consumer for a
    stranger."""
    cli = await world.login("cli")
    await own_durable(cli, EVENTS, "first", "wingsmith.evt.>")
    await world.until_gone(EVENTS, "first")  # the hub has been sweeping for a while
    await world.start_operator("west")
    wests = await world.until_created(RENDER, "operator-west")
    for name in ("second", "third"):  # each gone means two more sweeps have seen west's
        await own_durable(cli, EVENTS, name, "wingsmith.evt.>")
        await world.until_gone(EVENTS, name)
    assert await world.created(RENDER, "operator-west") == wests
    assert len(world.deletions()) == 3
    assert VANISHED not in world.caplog.text


async def test_a_ghost_operators_consumer_and_a_lingering_ephemeral_are_deleted(
    world: World,
) -> None:
    """Nothing denies a reader the name of an operator the configuration does not have, nor an
    ephemeral consumer that stays an hour without interest: both are deleted too."""
    viewer = await world.login("viewer")
    await own_durable(viewer, RENDER, "operator-ghost", "wingsmith.render.ghost.>")
    lingering = ConsumerConfig(
        name="lingering", filter_subject="wingsmith.evt.>", inactive_threshold=3600.0
    )
    await viewer.jetstream().add_consumer(EVENTS, lingering)
    ordered = nats_bus.read_stream(viewer, OBS, "wingsmith.obs.east.heartbeat", follow=True)
    try:
        await anext(ordered)
        await world.until_gone(RENDER, "operator-ghost")
        await world.until_gone(EVENTS, "lingering")
        await anext(ordered)  # it delivers still
    finally:
        await ordered.aclose()
    deleted = world.deletions()
    assert len(deleted) == 2
    assert any("'operator-ghost' on stream WINGSMITH_RENDER" in d for d in deleted)
    assert any("long-lived ephemeral consumer 'lingering'" in d for d in deleted)


async def test_an_operators_consumer_made_a_push_consumer_is_deleted(world: World) -> None:
    """West's operator user may recreate its own consumer as a push consumer delivering
    elsewhere; the control plane's consumers are pulled from, so the sweep takes it away."""
    west = await nats_bus.connect_operator(
        world.server.url, "west", user="operator-west", password=PASSWORDS["operator-west"]
    )
    world.stack.push_async_callback(west.close)
    await nats_bus.publish_observation(west, "west", "heartbeat", {"cluster_id": "west"}, "w-1")
    pushed = nats_bus.render_consumer_config("west")
    pushed.deliver_subject = "_INBOX_west.elsewhere"
    await west.jetstream().add_consumer(RENDER, pushed)
    await world.until_gone(RENDER, "operator-west")
    (deleted,) = world.deletions()
    assert "durable consumer 'operator-west' on stream WINGSMITH_RENDER" in deleted
