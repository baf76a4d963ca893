"""The relay under failure: every stored event lands on WINGSMITH_EVENTS exactly once, in store
order, when the hub is killed with SIGKILL or nats-server restarts in the middle of a stream."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub

from .conftest import (
    HubProcess,
    published,
    read_store,
    seed_deployment,
    send_until_answered,
    stream_ids,
    stream_of_commands,
    wait_for,
)

COMMANDS = 1000


async def _assert_stream_matches_store(nc: Client, data_dir: Path) -> None:
    """The stream ends up holding every stored event, once, in store order. (The scheduler may
    still be storing decisions: the two are compared until they agree, up to a minute.)"""
    compared: list[tuple[list[str], list[str]]] = []

    async def caught_up() -> bool:
        on_stream, expected = await stream_ids(nc), published(read_store(data_dir))
        compared.append((on_stream, expected))
        return len(on_stream) >= len(expected)

    await wait_for(caught_up, 60, "the relay to catch up")
    on_stream, expected = compared[-1]
    assert len(on_stream) == len(set(on_stream)), "an event was published twice"
    assert on_stream[: len(expected)] == expected  # every stored event, once, in store order
    assert on_stream == published(read_store(data_dir))[: len(on_stream)]  # and nothing else


async def test_hub_killed_with_sigkill_mid_stream(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    data_dir = tmp_path / "hub"
    hub = HubProcess(nats_server.url, data_dir)
    await hub.start()
    await hub.wait_ready(client)
    await seed_deployment(client)
    replies: list[Any] = []
    stream = asyncio.create_task(stream_of_commands(client, "kill", replies, COMMANDS))
    for _ in range(2):
        await _progress(replies)
        assert len(replies) < COMMANDS, "the stream ended before the hub was killed"
        hub.kill()
        await hub.start()
    await stream
    await hub.wait_ready(client)
    assert len(replies) == COMMANDS and all(r["ok"] for r in replies), replies[:3]
    await _assert_stream_matches_store(client, data_dir)
    assert hub.terminate() == 0


async def test_nats_server_restarted_mid_stream(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "hub"
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=data_dir)
    async with running_hub(settings):
        nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        try:
            await seed_deployment(nc)
            replies: list[Any] = []
            stream = asyncio.create_task(stream_of_commands(nc, "restart", replies, COMMANDS))
            for kill in (False, True):
                await _progress(replies)
                assert len(replies) < COMMANDS, "the stream ended before the restart"
                await nats_server.stop(kill=kill)
                await asyncio.sleep(0.5)
                await nats_server.start()
            await stream
            assert len(replies) == COMMANDS and all(r["ok"] for r in replies)
            await _assert_stream_matches_store(nc, data_dir)
        finally:
            await nc.close()


async def _progress(replies: list[Any], step: int = 150) -> None:
    """Wait until `step` more commands have been answered."""
    target = len(replies) + step

    async def reached() -> bool:
        return len(replies) >= target

    await wait_for(reached, 60, f"{target} answered commands")


async def test_a_lost_stream_is_rebuilt_from_the_store(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", admission=False
    )
    async with running_hub(settings):
        await seed_deployment(client)
        await _assert_stream_matches_store(client, settings.data_dir)
    await client.jetstream().delete_stream("WINGSMITH_EVENTS")
    async with running_hub(settings):
        await _assert_stream_matches_store(client, settings.data_dir)
    assert len(await stream_ids(client)) == 6


async def test_a_stream_of_another_store_is_left_alone(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    first = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "a")
    async with running_hub(first):
        await seed_deployment(client)
        await _assert_stream_matches_store(client, first.data_dir)
    before = await stream_ids(client)
    other = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "b")
    async with running_hub(other) as hub:
        body = {"command_id": "elsewhere", "project": "p", "device_class": "H100", "devices": 1}
        assert (await send_until_answered(client, "project.set_quota", body))["ok"]
        assert hub.relay is not None

        async def refused() -> bool:
            return hub.relay is not None and hub.relay.mismatch is not None

        await wait_for(refused, 10, "the relay to notice the stream is not its store's")
        assert "is not this store's event" in (hub.relay.mismatch or "")
    assert await stream_ids(client) == before


async def test_more_than_the_relay_keeps_in_memory_is_read_from_the_store(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    data_dir = tmp_path / "hub"
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=data_dir)
    async with running_hub(settings) as hub:
        assert hub.relay is not None
        hub.relay.fed_limit = 1  # every committed batch but the smallest is left in the store
        await seed_deployment(client)
        replies: list[Any] = []
        await stream_of_commands(client, "overflow", replies, 200)
        assert all(r["ok"] for r in replies)
        await _assert_stream_matches_store(client, data_dir)
