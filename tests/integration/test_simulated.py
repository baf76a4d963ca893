"""The whole system on simulated clusters, against a real nats-server: an operator that goes
silent makes its cluster unreachable and its deployments stale, and faults injected into a
simulated cluster (node loss, pods that fail, an API server that refuses) move deployments as a
real cluster's would: a transient fault is shown and moves nothing, a permanent one fails the
deployment, and each ends by itself once cleared."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.simulated import (
    SimNode,
    simulated_operators,
)

from .conftest import LLAMA, read_store, send_until_answered, wait_for


async def command(client: Client, n: str, verb: str, **body: Any) -> dict[str, Any]:
    reply = await send_until_answered(client, verb, {"command_id": n} | body)
    assert reply["ok"], reply
    return dict(reply["result"])


async def event_types(client: Client, aggregate: str, aggregate_id: str) -> list[str]:
    subject = f"wingsmith.evt.{aggregate}.{aggregate_id}.>"
    stream = nats_bus.read_stream(client, names.EVENTS_STREAM, subject, follow=False)
    return [orjson.loads(m.data)["type"] async for m in stream]


async def until_event(
    client: Client, aggregate: str, aggregate_id: str, kind: str, n: int = 1
) -> None:
    async def seen() -> bool:
        return (await event_types(client, aggregate, aggregate_id)).count(kind) >= n

    await wait_for(seen, 30, f"{n} x {kind} on {aggregate} {aggregate_id}")


def pinned(workload_id: str = "chat", replicas: int = 2) -> dict[str, Any]:
    """The body of a workload pinned to `east`."""
    body = {"workload_id": workload_id, "project": "p", "device_class": "H100"}
    return body | {"serving": LLAMA, "replicas": replicas, "cluster": "east"}


async def pinned_workload(
    client: Client, n: str = "w", workload_id: str = "chat", replicas: int = 2
) -> dict[str, Any]:
    """A workload pinned to `east` (the command must succeed)."""
    return await command(client, n, "workload.create", **pinned(workload_id, replicas))


async def view(client: Client, projection: str, key: str) -> dict[str, Any] | None:
    _, latest = (await nats_bus.latest_views(client, projection)).get(key, (0, None))
    return None if latest is None else dict(orjson.loads(latest))


async def health(client: Client, deployment_id: str) -> dict[str, Any]:
    return await view(client, "deployment_health", deployment_id) or {}


Status = dict[str, Any]


async def until_status(
    client: Client, deployment_id: str, what: str, check: Callable[[Status], bool]
) -> Status:
    """Wait until the deployment's status in its health view passes `check`; return it."""
    seen: Status = {}

    async def passes() -> bool:
        nonlocal seen
        seen = (await health(client, deployment_id)).get("status") or {}
        return bool(seen) and check(seen)

    await wait_for(passes, 30, f"{deployment_id}: {what}")
    return seen


def backing_off(pods: int) -> Callable[[Status], bool]:
    """A status whose pods (this many) cannot pull their image."""

    def check(status: Status) -> bool:
        return any(
            c["reason"] == "ImagePullBackOff" and c["pods"] == pods and not c["permanent"]
            for c in status.get("conditions", ())
        )

    return check


def serving(ready: int) -> Callable[[Status], bool]:
    """A status with every one of `ready` replicas ready and nothing wrong."""

    def check(status: Status) -> bool:
        return (
            status["phase"] == "ready"
            and status["ready_replicas"] == ready
            and not status.get("conditions")
        )

    return check


async def test_a_silent_operator_makes_its_cluster_unreachable_and_its_deployments_stale(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", cluster_silence=1.5
    )
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, ready_after=0.1, heartbeat_every=0.3):
            await until_event(client, "cluster", "east", "OperatorConnected")
            await pinned_workload(client)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
        # the operator stopped: after the silence the cluster is unreachable
        await until_event(client, "cluster", "east", "ClusterUnreachable")

        async def stale() -> bool:
            view = await health(client, "chat--east")
            return view.get("stale") is True and view.get("status") is not None

        await wait_for(stale, 30, "the deployment to keep its last status, flagged stale")
        async with simulated_operators(client, nodes, ready_after=0.1, heartbeat_every=0.3):
            await until_event(client, "cluster", "east", "ClusterReachable")
            await until_event(client, "cluster", "east", "OperatorConnected", n=2)  # a new start

            async def fresh() -> bool:
                return (await health(client, "chat--east")).get("stale") is False

            await wait_for(fresh, 30, "the deployment to be fresh again")


async def fault(client: Client, cluster_id: str, **body: Any) -> dict[str, Any]:
    reply = await client.request(names.fault_subject(cluster_id), orjson.dumps(body), timeout=5)
    answer: dict[str, Any] = orjson.loads(reply.data)
    return answer


async def test_node_loss_and_failed_image_pulls(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 2), SimNode("east-n2", "H100", 2)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=8)
        async with simulated_operators(client, nodes, ready_after=0.1, heartbeat_every=0.5):
            await until_event(client, "cluster", "east", "InventoryReported")
            await pinned_workload(client)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")

            assert (await fault(client, "east", fault="node_loss", node="east-n1"))["ok"]
            await until_event(client, "cluster", "east", "InventoryReported", n=2)  # 2 devices
            await until_event(client, "replica", "*", "ReplicaTerminated")
            assert (await fault(client, "east", fault="node_restore", node="east-n1"))["ok"]
            await until_event(client, "cluster", "east", "InventoryReported", n=3)

            refused = await fault(client, "east", fault="node_loss", node="nowhere")
            assert not refused["ok"] and "node" in refused["error"]

            # Image pulls that fail are transient: the pods wait, the deployment is not failed.
            assert (await fault(client, "east", fault="image_pull", deployment_id="chat--east"))[
                "ok"
            ]
            await command(client, "s", "workload.scale", workload_id="chat", replicas=3)
            await until_status(client, "chat--east", "every pod backing off", backing_off(3))
            assert "DeploymentFailed" not in await event_types(client, "deployment", "chat--east")


async def test_a_simulated_cluster_keeps_its_pods_across_operator_restarts(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    state = tmp_path / "simulated"
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(
            client, nodes, ready_after=0.1, heartbeat_every=0.3, state_dir=state
        ):
            await until_event(client, "cluster", "east", "OperatorConnected")
            await pinned_workload(client)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
        async with simulated_operators(
            client, nodes, ready_after=0.1, heartbeat_every=0.3, state_dir=state
        ):
            await until_event(client, "cluster", "east", "OperatorConnected", n=2)
            await command(client, "s", "workload.scale", workload_id="chat", replicas=1)
            await until_event(client, "replica", "*", "ReplicaTerminated")
        started = await event_types(client, "replica", "*")
        assert started.count("ReplicaStarted") == 2  # the same two pods: none started again


async def test_read_only_simulated_operators_observe_and_start_nothing(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """What `wingsmith up --simulated` starts with HANGAR_OPERATOR_READ_ONLY=true: the render
    object arrives, and no pod is started for it."""
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, ready_after=0.1, read_only=True) as clusters:
            await until_event(client, "cluster", "east", "OperatorConnected")
            await pinned_workload(client)
            east = clusters["east"]

            async def arrived() -> bool:
                return "chat--east" in east.desired

            await wait_for(arrived, 30, "the render object to reach the read-only cluster")
            await asyncio.sleep(0.5)  # five times what a pod takes to be ready here
            assert east.pods.get("chat--east", {}) == {}
    history = read_store(settings.data_dir)
    connected = [n for n in history if n.topic.endswith("OperatorConnected")]
    assert connected and all(orjson.loads(n.state)["operator"]["read_only"] for n in connected)
    # what it held back is on the audit trail
    assert actions(history) == [("create", "wingsmith/chat", False, "read-only mode")]


def actions(history: list[Any]) -> list[tuple[str, str, bool, str]]:
    """The operator actions in a store's history: verb, target, performed, reason."""
    acted = [orjson.loads(n.state) for n in history if n.topic.endswith("OperatorActed")]
    return [(a["verb"], a["target"], a["performed"], a["reason"]) for a in acted]


async def test_a_failed_image_pull_on_one_replica_leaves_the_others_serving(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """The pod that cannot pull its image is not ready and the status says why; the other
    two replicas serve on, the grant stays, and once the fault is cleared the pod becomes
    ready by itself: no disable, no enable."""
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, ready_after=0.1, heartbeat_every=0.5):
            await until_event(client, "cluster", "east", "InventoryReported")
            await pinned_workload(client, replicas=3)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
            await until_status(client, "chat--east", "3 replicas ready", serving(3))
            decided = (await event_types(client, "deployment", "chat--east")).count(
                "AdmissionDecided"
            )

            pulled = await fault(
                client, "east", fault="image_pull", deployment_id="chat--east", replicas=1
            )
            assert pulled["ok"], pulled
            status = await until_status(client, "chat--east", "one pod backing off", backing_off(1))
            assert status["ready_replicas"] == 2 and status["desired_replicas"] == 3
            assert status["phase"] == "progressing"
            assert "Back-off pulling image" in status["conditions"][0]["message"]
            view = await health(client, "chat--east")
            assert view["admission"]["phase"] == "running"
            assert (await view_of_render(client))["replicas"] == 3  # the grant stays

            assert (await fault(client, "east", fault="clear", deployment_id="chat--east"))["ok"]
            await until_status(client, "chat--east", "3 replicas ready again", serving(3))
            events = await event_types(client, "deployment", "chat--east")
            assert "DeploymentFailed" not in events and "DeploymentDisabled" not in events
            assert events.count("AdmissionDecided") == decided
            replicas = await event_types(client, "replica", "*")
            assert replicas.count("ReplicaNotReady") == 1  # only the pod that failed
            assert replicas.count("ReplicaTerminated") == 0  # none restarted
    # the operator's write is on the audit trail
    assert actions(read_store(settings.data_dir))[0] == (
        "create",
        "wingsmith/chat",
        True,
        "no DynamoGraphDeployment yet",
    )


async def view_of_render(client: Client) -> dict[str, Any]:
    return await view(client, "render", "east.chat--east") or {}


async def test_a_disaggregated_deployment_counts_pairs(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """A disaggregated replica is a prefill pod and a decode pod: two replicas are four pods,
    and a pair with a pod down is not a ready replica."""
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    disaggregated = LLAMA | {"mode": "disaggregated", "devices_per_replica": 2}
    body = pinned() | {"serving": disaggregated, "replicas": 2}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, ready_after=0.1) as clusters:
            await until_event(client, "cluster", "east", "InventoryReported")
            await command(client, "w", "workload.create", **body)
            status = await until_status(client, "chat--east", "2 pairs ready", serving(2))
            assert status["desired_replicas"] == 2
            pods = clusters["east"].pods["chat--east"].values()
            assert (
                sorted(p.name.rsplit("-", 1)[1] for p in pods) == ["decode"] * 2 + ["prefill"] * 2
            )
            assert all(len(p.device_ids) == 1 for p in pods)

            crashed = await fault(
                client, "east", fault="crash_loop", deployment_id="chat--east", replicas=1
            )
            assert crashed["ok"], crashed

            def one_pair_down(status: Status) -> bool:
                conditions = status.get("conditions", ())
                return status["ready_replicas"] == 1 and [
                    (c["reason"], c["pods"]) for c in conditions
                ] == [("CrashLoopBackOff", 2)]

            await until_status(client, "chat--east", "one pair crash-looping", one_pair_down)
            assert (await fault(client, "east", fault="clear", deployment_id="chat--east"))["ok"]
            await until_status(client, "chat--east", "both pairs ready again", serving(2))


async def test_a_refused_deployment_fails_and_recovers_once_the_refusal_is_lifted(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """The API server refuses the DynamoGraphDeployment: the deployment fails with the
    server's message, the write is on the audit trail as not performed; lifted, the cluster
    takes it, the failure clears and admission starts over, up to running."""
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    said = 'admission webhook "vdynamographdeployment.kb.io" denied the request: name too long'
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, ready_after=0.1) as clusters:
            await until_event(client, "cluster", "east", "InventoryReported")
            refused = await fault(
                client, "east", fault="refuse", deployment_id="chat--east", message=said
            )
            assert refused["ok"], refused
            await pinned_workload(client)
            await until_event(client, "deployment", "chat--east", "DeploymentFailed")
            status = await until_status(
                client, "chat--east", "failed", lambda s: s["phase"] == "failed"
            )
            assert status["conditions"] == [
                {"reason": "Invalid", "message": said, "permanent": True, "pods": 0}
            ]
            assert clusters["east"].pods.get("chat--east", {}) == {}  # nothing was created

            assert (await fault(client, "east", fault="clear", deployment_id="chat--east"))["ok"]
            await until_event(client, "deployment", "chat--east", "FailureCleared")
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
            await until_status(client, "chat--east", "2 replicas ready", serving(2))
    verbs = actions(read_store(settings.data_dir))
    assert verbs[0] == ("create", "wingsmith/chat", False, f"refused: Invalid: {said}")
    assert ("create", "wingsmith/chat", True, "no DynamoGraphDeployment yet") in verbs


async def test_a_worker_wider_than_a_node_runs_on_whole_nodes_or_waits_saying_why(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """12 devices per replica on 8-device nodes: two pods of 6 on two nodes. A second such
    replica finds 12 devices free in sum but no two nodes with 6, and waits with the numbers."""
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode(f"east-n{i}", "H100", 8) for i in (1, 2, 3)]}
    wide = LLAMA | {"devices_per_replica": 12, "parallelism": {"tensor": 4}}
    async with running_hub(settings):
        await command(
            client, "q", "project.set_quota", project="p", device_class="H100", devices=24
        )
        async with simulated_operators(client, nodes, ready_after=0.1) as clusters:
            await until_event(client, "cluster", "east", "InventoryReported")
            body = pinned() | {"serving": wide, "replicas": 1}
            await command(client, "w", "workload.create", **body)
            await until_status(client, "chat--east", "one wide replica ready", serving(1))
            assert (await view_of_render(client))["nodes_per_worker"] == 2
            pods = list(clusters["east"].pods["chat--east"].values())
            assert sorted(len(p.device_ids) for p in pods) == [6, 6]
            assert len({p.node.node_id for p in pods}) == 2  # one pod per node

            other = pinned("other") | {"serving": wide, "replicas": 1}
            await command(client, "o", "workload.create", **other)

            async def refused() -> dict[str, Any] | None:
                admission = (await health(client, "other--east")).get("admission") or {}
                return admission if admission.get("reason") == "insufficient_capacity" else None

            await wait_for(refused, 30, "the second wide replica to wait for whole nodes")
            evidence = (await refused() or {})["evidence"]
            assert evidence["pod_devices"] == 6 and evidence["nodes_per_worker"] == 2
            assert (evidence["pods_needed"], evidence["nodes_fitting"]) == (2, 1)
            assert (
                "other--east" not in clusters["east"].pods
                or not clusters["east"].pods["other--east"]
            )
