"""Dead letters are kept on their stream with the reason, counted, and stored once each."""

from __future__ import annotations

import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.dead_letters import DeadLetters, stored
from wingsmith.domain.names import DEAD_STREAM


async def test_a_message_set_aside_is_kept_with_its_reason_once(client: Client) -> None:
    await nats_bus.ensure_streams(client)
    dead = DeadLetters(client)
    for _ in range(2):  # a redelivery of the same message
        await dead.set_aside(
            "ingest", "pod: not a name", "wingsmith.obs.east.replica", b"{\x0b}", msg_id="7"
        )
    await dead.set_aside("relay", "bad subject", "wingsmith.evt.replica.a b", b"\xff")

    assert await stored(client) == {"ingest": 1, "relay": 1}
    kept = await client.jetstream().get_last_msg(DEAD_STREAM, "wingsmith.dead.relay")
    body = orjson.loads(kept.data)  # type: ignore[arg-type]
    assert (body["reason"], body["subject"], body["data_base64"]) == (
        "bad subject",
        "wingsmith.evt.replica.a b",
        "/w==",
    )
    snapshot = dead.snapshot()
    assert snapshot["total"] == 3 and snapshot["by_component"] == {"ingest": 2, "relay": 1}
    assert snapshot["last"]["component"] == "relay"


async def test_setting_aside_without_nats_still_counts() -> None:
    dead = DeadLetters(None)
    await dead.set_aside("projector", "fold failed", "wingsmith.evt.x.y.Z", b"{}")
    assert dead.snapshot()["by_component"] == {"projector": 1}
