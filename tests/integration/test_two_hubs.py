"""Two hubs on one event store, sharing the command queue group: they race on the same
deployment, conflicts are retried against fresh state, and no update is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.client import Client

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub

from .conftest import (
    published,
    read_store,
    seed_deployment,
    send_until_answered,
    stream_ids,
    wait_for,
)


async def test_two_hubs_on_one_store_lose_no_update(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path, store_url: str
) -> None:
    # without admission: the test counts on the commands' events alone
    one = Settings(
        nats_url=nats_server.url, store_url=store_url, data_dir=tmp_path / "a", admission=False
    )
    two = Settings(
        nats_url=nats_server.url, store_url=store_url, data_dir=tmp_path / "b", relay=False
    )
    async with running_hub(one) as hub_a, running_hub(two) as hub_b:
        deployment = await seed_deployment(client)
        replies = await asyncio.gather(
            *(
                send_until_answered(
                    client,
                    "deployment.set_engine_args",
                    {
                        "command_id": f"race-{i}",
                        "deployment_id": deployment,
                        "engine_args": [f"--seed={i}"],
                    },
                )
                for i in range(300)
            )
        )
        conflicts = hub_a.commands.executor.conflicts + hub_b.commands.executor.conflicts
        written_by_b = len(hub_b.commands.executor.receipts)

        async def relayed() -> bool:  # hub a relays hub b's events too, in store order
            return len(await stream_ids(client)) == 6 + 300

        await wait_for(relayed, 30, "both hubs' events on the stream")
    assert written_by_b > 0, "hub b handled no command: the test proved nothing"
    assert await stream_ids(client) == published(read_store(tmp_path, store_url))
    assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:3]
    versions = sorted(e["version"] for r in replies for e in r["result"]["events"])
    assert versions == list(range(2, 302)), "each update is its own stored version"
    assert conflicts > 0, "the hubs never raced: the test proved nothing"

    store = EventStore(store_env(store_url, tmp_path))
    try:
        history = store.history(f"deployment:{deployment}")
        final = store.load(f"deployment:{deployment}")
    finally:
        store.close()
    by_command = {e.command_id: e for e in history[1:]}
    assert set(by_command) == {f"race-{i}" for i in range(300)}
    assert final.engine_args == history[-1].engine_args  # type: ignore[union-attr,attr-defined]
