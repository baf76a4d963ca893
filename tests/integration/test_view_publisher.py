"""The view publisher against a real nats-server: a change the projection stream already holds
is never sent again, however long ago it was sent, and a change that does not follow the one
before it on the stream is refused rather than stored out of order."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.domain import names

from .conftest import stream_ids

WINDOW = 0.5  # the stream's own duplicate window: far shorter than the gaps below


async def publisher(client: Client) -> nats_bus.ViewPublisher:
    views = nats_bus.ViewPublisher(client)
    await views.resume()
    return views


async def send(views: nats_bus.ViewPublisher, changes: list[tuple[str, int]]) -> None:
    for key, position in changes:
        await views.change("capacity", key, b"{}", position)
    await views.flush(timeout=2)


async def test_a_restart_publishes_only_what_the_stream_lacks(client: Client) -> None:
    await nats_bus.ensure_streams(client, views_duplicate_window=WINDOW)
    first = await publisher(client)
    await send(first, [("a", 1), ("b", 2), ("c", 2), ("a", 3)])  # ... then the process dies
    # a new process folds the same events again, from an older checkpoint, long after the
    # stream's duplicate window has passed
    again = [("a", 1), ("b", 2), ("c", 2), ("a", 3), ("b", 3), ("c", 4)]
    await asyncio.sleep(2 * WINDOW)
    await send(await publisher(client), again)
    ids = await stream_ids(client, names.VIEWS_STREAM)
    assert ids == [f"capacity:{key}:{position}" for key, position in again]


async def test_a_change_repeated_within_one_event_is_sent_once(client: Client) -> None:
    await nats_bus.ensure_streams(client)
    await send(await publisher(client), [("a", 1), ("a", 1), ("b", 1)])
    assert await stream_ids(client, names.VIEWS_STREAM) == ["capacity:a:1", "capacity:b:1"]


async def test_a_change_after_a_gap_is_refused(client: Client) -> None:
    await nats_bus.ensure_streams(client)
    views = await publisher(client)
    await send(views, [("a", 1)])
    await client.jetstream().publish("wingsmith.proj.capacity.z", b"{}")  # not in the chain
    with pytest.raises(nats_bus.PublishFailed):
        await send(views, [("b", 2)])
    await send(await publisher(client), [("a", 1), ("b", 2)])  # resumed where the stream ends
    last = await client.jetstream().get_msg(names.VIEWS_STREAM, seq=3)
    assert (last.headers or {})["Nats-Msg-Id"] == "capacity:b:2"
    assert (await client.jetstream().stream_info(names.VIEWS_STREAM)).state.messages == 3
