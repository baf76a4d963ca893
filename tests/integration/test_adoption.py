"""Discover, adopt and take over a running model, end to end: a hub, a real nats-server, and an
operator on kmock. Adopting writes nothing to the cluster; promoting to managed, with
engine_args equal to what the engine runs with, rewrites nothing either: no restart."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
from nats.aio.client import Client

from wingsmith.adapters.kube import Kube
from wingsmith.services.hub.wiring import Hub
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.inspect import load_manifest

from .conftest import send_until_answered, wait_for
from .kube_fixtures import (
    NAMESPACE,
    cluster_create,
    kube_emulator,
    node,
    running_operator,
    write_requests,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "dgd" / "vllm-agg-v1beta1.yaml"
DISCOVERY = "east--wingsmith--qwen3-chat"


@contextlib.asynccontextmanager
async def operator_on_kmock(
    client: Client,
) -> AsyncIterator[tuple[kmock.KubernetesEmulator, Kube, KubeBackend]]:
    async with kube_emulator() as (emulator, _, kube):
        backend = KubeBackend(kube, "east", NAMESPACE, read_only=False)
        async with running_operator(client, backend):
            yield emulator, kube, backend


async def command(client: Client, verb: str, **body: Any) -> dict[str, Any]:
    reply = await send_until_answered(client, verb, {"command_id": f"t-{verb}"} | body)
    assert reply["ok"], reply
    result: dict[str, Any] = reply["result"]
    return result


async def events(hub: Hub, aggregate_id: str) -> list[str]:
    history = await hub.store.run(hub.store.store.history, aggregate_id)
    return [type(e).__name__ for e in history]


async def test_discover_adopt_and_promote_without_writing_or_restarting(
    hub: Hub, client: Client
) -> None:
    manifest = load_manifest(FIXTURE.read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    async with operator_on_kmock(client) as (emulator, kube, backend):
        for name in ("gpu-1", "gpu-2"):
            await cluster_create(emulator, "node", node(name, product="H100", gpus=8))
        await cluster_create(emulator, "dgd/v1beta1", manifest)
        before = await kube.get_dgd(NAMESPACE, "qwen3-chat")

        async def sighted() -> bool:
            return "DiscoverySighted" in await events(hub, f"discovery:{DISCOVERY}")

        await wait_for(sighted, 20, "the operator's discovery to reach the hub")
        await command(
            client, "project.set_quota", project="search", device_class="H100", devices=16
        )
        await command(client, "discovery.promote", discovery_id=DISCOVERY, project="search")

        adopted = await hub.store.run(hub.store.store.load, "deployment:qwen3-chat--east")
        assert adopted is not None and adopted.imported_args  # type: ignore[attr-defined]
        await command(
            client,
            "deployment.set_engine_args",
            deployment_id="qwen3-chat--east",
            engine_args=list(adopted.imported_args),  # type: ignore[attr-defined]
        )
        await command(
            client,
            "deployment.promote_authority",
            deployment_id="qwen3-chat--east",
            authority="managed",
        )

        async def admitted() -> bool:
            return "AdmissionDecided" in await events(hub, "deployment:qwen3-chat--east")

        await wait_for(admitted, 20, "admission of the promoted deployment")

        async def managed_render_applied() -> bool:
            applied = backend.applied.get("qwen3-chat--east") or {}
            return applied.get("authority") == "managed" and applied.get("replicas") == 2

        await wait_for(managed_render_applied, 20, "the first managed render at the operator")
        assert write_requests(emulator) == []
        assert await kube.get_dgd(NAMESPACE, "qwen3-chat") == before
