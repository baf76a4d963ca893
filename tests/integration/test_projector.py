"""The projector in the hub: views in KV and on WINGSMITH_PROJ, and a restart that resumes
from the checkpoint without applying anything twice."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_bus import StreamMessage
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain.names import VIEWS_STREAM
from wingsmith.projections.base import VERSION
from wingsmith.projections.fleet import Capacity
from wingsmith.services.config import Settings
from wingsmith.services.hub.projector import rebuild
from wingsmith.services.hub.wiring import running_hub, running_projector

from .conftest import seed_deployment, send_until_answered, wait_for


async def kv_view(client: Client, projection: str, key: str) -> Any:
    try:  # the projector process may not have made its buckets yet
        kv = await client.jetstream().key_value(f"wingsmith_{projection}")
        entry = await kv.get(key)
    except Exception:
        return None
    return orjson.loads(entry.value) if entry.value else None


def rebuilt(data_dir: Path) -> dict[str, dict[str, Any]]:
    store = EventStore(store_env(None, data_dir))
    try:
        return {p.name: p.views for p in rebuild(store.read).projections}
    finally:
        store.close()


async def test_views_are_published_and_survive_a_restart(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    inventory = {
        "command_id": "inv",
        "cluster_id": "east",
        "nodes": [{"node_id": "n1", "device_class": "H100", "devices": 8}],
    }
    async with running_hub(settings):
        await seed_deployment(client)
        await send_until_answered(client, "cluster.report_inventory", inventory)

        async def capacity_known() -> bool:
            return (await kv_view(client, "capacity", "east.H100") or {}).get("total") == 8

        await wait_for(capacity_known, 20, "the capacity view in KV")
        sub = await client.jetstream().subscribe(  # stream created by the projector: it is up
            "wingsmith.proj.workload_phase.llama", ordered_consumer=True
        )
        update = orjson.loads((await sub.next_msg(timeout=10)).data)
        if not update["deployments"]:  # created in another batch than its deployment
            update = orjson.loads((await sub.next_msg(timeout=10)).data)
        await sub.unsubscribe()
        assert update["deployments"] == {"llama--east": "pending"}
    async with running_hub(settings):  # resumes from its checkpoint
        scale = {"command_id": "scale", "workload_id": "llama", "replicas": 5}
        assert (await send_until_answered(client, "workload.scale", scale))["ok"]

        async def health_updated() -> bool:
            view = await kv_view(client, "deployment_health", "llama--east")
            return (view or {}).get("desired_replicas") == 5

        await wait_for(health_updated, 20, "the deployment health view after the restart")
    expected = rebuilt(settings.data_dir)
    for projection, views in expected.items():
        for key, view in views.items():
            assert await kv_view(client, projection, key) == view, (projection, key)


async def test_an_idle_projector_checkpoints_what_it_has_folded(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """Without more events to come, the last batches are checkpointed all the same (within
    `checkpoint_seconds`), so a crash later folds nothing again."""
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=tmp_path / "hub",
        projector=False,
        checkpoint_seconds=0.2,
    )
    async with running_hub(settings), running_projector(settings) as projector:
        await seed_deployment(client)

        async def checkpointed() -> bool:
            progress = await nats_bus.projector_progress(client)
            saved = await projector._store.run(projector.checkpoints.latest, "capacity")
            return bool(progress and saved) and saved.position == progress["position"] > 0  # type: ignore[union-attr, index]

        await wait_for(checkpointed, 20, "a checkpoint at the projector's position")


def as_an_earlier_version_saved_it(data_dir: Path, projection: str) -> None:
    """Rewrite a projection's checkpoints as its previous version left them: that version's
    number, and its views without the fields added since."""
    db = sqlite3.connect(store_env(None, data_dir)["SQLITE_DBNAME"])
    with db:
        rows = db.execute(
            "SELECT position, state FROM wingsmith_checkpoints WHERE projection = ?",
            [projection],
        ).fetchall()
        for position, saved in rows:
            state = orjson.loads(saved)
            state[VERSION] -= 1
            for view in state["views"].values():
                del view["unschedulable"], view["held_outside"]
            db.execute(
                "UPDATE wingsmith_checkpoints SET state = ? WHERE projection = ? AND position = ?",
                [orjson.dumps(state), projection, position],
            )
    db.close()


async def republished(client: Client, projection: str) -> list[StreamMessage]:
    """The changes of a projection on WINGSMITH_PROJ that republished a view whole."""
    changes = nats_bus.read_stream(
        client, VIEWS_STREAM, f"wingsmith.proj.{projection}.>", follow=False
    )
    return [m async for m in changes if ":v" in m.headers.get("Nats-Msg-Id", "")]


async def test_a_projection_of_a_new_version_is_folded_again_and_its_views_republished(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """Given views published and checkpointed by an earlier version of `capacity`, when the
    projector starts, then it folds every projection again from the first event (the stream
    holds those changes: none is sent again) and, past them, publishes each capacity view
    whole in its new shape, once; then checkpoints the new version."""
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=tmp_path / "hub",
        projector=False,
        checkpoint_seconds=0.2,
    )
    inventory = {
        "command_id": "inv",
        "cluster_id": "east",
        "nodes": [{"node_id": "n1", "device_class": "H100", "devices": 8}],
    }
    async with running_hub(settings), running_projector(settings) as projector:
        await seed_deployment(client)
        await send_until_answered(client, "cluster.report_inventory", inventory)

        async def checkpointed() -> bool:
            progress = await nats_bus.projector_progress(client)
            saved = await projector._store.run(projector.checkpoints.latest, "capacity")
            view = await kv_view(client, "capacity", "east.H100")
            return (
                bool(progress and saved and view)
                and saved.position == progress["position"]  # type: ignore[union-attr, index]
                and view["total"] == 8
            )

        await wait_for(checkpointed, 20, "the capacity view, checkpointed")
    as_an_earlier_version_saved_it(settings.data_dir, "capacity")

    async with running_hub(settings), running_projector(settings) as projector:

        async def checkpointed_again() -> bool:
            saved = await projector._store.run(projector.checkpoints.latest, "capacity")
            return saved is not None and saved.state[VERSION] == Capacity.version

        await wait_for(checkpointed_again, 20, "a checkpoint of the new version")
        [again] = await republished(client, "capacity")
    assert again.subject == "wingsmith.proj.capacity.east.H100"
    assert orjson.loads(again.data) == rebuilt(settings.data_dir)["capacity"]["east.H100"]
    assert await kv_view(client, "capacity", "east.H100") == orjson.loads(again.data)
    assert await republished(client, "workload_phase") == []  # its checkpoint was of its version
