"""Growth decided like anything else, over a real nats-server with a simulated cluster: a
workload scaled past its quota runs the replicas that fit and says why the rest waits, with
the numbers; raising the quota starts the rest, and lowering it stops nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.simulated import SimNode, simulated_operators

from .conftest import wait_for
from .test_simulated import command, health, pinned_workload, serving, until_event, until_status


def quota(devices: int) -> dict[str, Any]:
    return {"project": "p", "device_class": "H100", "devices": devices}


async def test_scaling_past_quota_runs_what_fits_and_the_rest_waits_saying_why(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 8)]}
    async with running_hub(settings):
        await command(client, "q4", "project.set_quota", **quota(4))
        async with simulated_operators(client, nodes, ready_after=0.1):
            await until_event(client, "cluster", "east", "InventoryReported")
            await pinned_workload(client, replicas=2)
            await until_status(client, "chat--east", "2 replicas ready", serving(2))

            loop = asyncio.get_running_loop()
            scaled_at = loop.time()
            await command(client, "s6", "workload.scale", workload_id="chat", replicas=6)

            async def told() -> dict[str, Any] | None:
                view = await health(client, "chat--east")
                return view if view.get("waiting_replicas") == 2 else None

            await wait_for(told, 30, "the two replicas past the quota to wait")
            told_after = loop.time() - scaled_at
            view = await told() or {}
            admission = view["admission"]
            assert admission["phase"] in ("admitted", "placed", "running")
            assert admission["reason"] == "insufficient_quota"
            evidence = admission["evidence"]
            assert (evidence["wanted"], evidence["quota"]) == (6, 4)
            assert (evidence["granted"], evidence["waiting"]) == (4, 2)
            assert view["granted_devices"] == 4 and view["desired_replicas"] == 6
            await until_status(client, "chat--east", "the 4 granted replicas ready", serving(4))
            running_after = loop.time() - scaled_at
            # reported, never asserted (the simulated pods take 0.1 s to be ready)
            print(f"past quota: told in {told_after:.3f} s, 4 of 6 ready in {running_after:.3f} s")

            await command(client, "q2", "project.set_quota", **quota(2))

            async def reported() -> dict[str, Any] | None:
                view = await health(client, "chat--east")
                evidence = (view.get("admission") or {}).get("evidence") or {}
                return view if evidence.get("quota") == 2 else None

            await wait_for(reported, 30, "the smaller quota to be reported")
            view = await reported() or {}
            assert view["admission"]["reason"] == "insufficient_quota"
            assert (view["granted_devices"], view["ready_replicas"]) == (4, 4)  # nothing stopped
            await command(client, "q6", "project.set_quota", **quota(6))
            await until_status(client, "chat--east", "all 6 replicas ready", serving(6))
            view = await health(client, "chat--east")
            assert (view["admission"]["phase"], view["admission"]["reason"]) == ("running", None)
            assert view["waiting_replicas"] == 0 and view["granted_devices"] == 6
