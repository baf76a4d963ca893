"""The node agent and what it tells: a real gRPC server on a Unix socket plays the kubelet's
pod-resources service (kubelet/server.py, speaking the whole v1 API), the agent reads it and
publishes on a real nats-server, and the operator (against kmock) reports replicas with the
device ids the kubelet gave and counts what pods Wingsmith does not manage hold."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.podresources import KubeletUnavailable, NodeDevices, PodResources
from wingsmith.domain import names
from wingsmith.domain.contracts.reports import NodeDevicesReport
from wingsmith.services.hub.wiring import Hub
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.dgd import LABEL_DEPLOYMENT, deployment_label

from ..dra_objects import Gpu, claim_pod, resource_claim, resource_slice
from .conftest import LLAMA, send_until_answered, wait_for
from .kube_fixtures import (
    NAMESPACE,
    cluster_create,
    cluster_patch,
    kube_emulator,
    node,
    pod,
    running_operator,
)
from .test_operator import Cluster, desired, operator
from .test_sync import allocations

WINGSMITH = [sys.executable, "-m", "wingsmith"]
SERVER = Path(__file__).parent / "kubelet" / "server.py"
GPU = "nvidia.com/gpu"
H100 = "NVIDIA-H100-80GB-HBM3"
UUIDS = [f"GPU-{i:08x}-7c1e-4f0a-9d2b-5e6f7a8b9c0d" for i in range(8)]


class Kubelet:
    """The test kubelet: a node's devices and the pods holding some, served from a file."""

    def __init__(self, directory: Path) -> None:
        self.socket = directory / "kubelet.sock"
        self.state_file = directory / "state.json"
        self.state: dict[str, Any] = {"allocatable": {GPU: UUIDS}, "pods": []}
        self.save()

    def save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        tmp.replace(self.state_file)  # the server never reads half a file

    def holds(self, namespace: str, name: str, devices: list[str], resource: str = GPU) -> None:
        self.state["pods"].append(
            {"namespace": namespace, "name": name, "devices": {resource: devices}}
        )
        self.save()


@contextlib.contextmanager
def kubelet_serving(directory: Path) -> Iterator[Kubelet]:
    kubelet = Kubelet(directory)
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(kubelet.socket), str(kubelet.state_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "serving"
        yield kubelet
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    with kubelet_serving(tmp_path) as served:
        yield served


# -- reading the kubelet ----------------------------------------------------------------------


async def test_the_reader_gets_each_pods_devices_of_the_resources_asked_for(
    kubelet: Kubelet,
) -> None:
    """The test kubelet sends CPU ids, memory, NUMA topology and a sidecar without devices
    too, all of which the reader's narrower description of the API skips."""
    kubelet.holds("serving", "llama-worker-0", UUIDS[:2])
    kubelet.holds("batch", "train-0", UUIDS[2:6])
    kubelet.holds("batch", "nic-user", ["mlx5_0"], resource="rdma/hca")
    reader = PodResources(str(kubelet.socket))
    try:
        read = await reader.read([GPU])
    finally:
        await reader.close()
    assert read == NodeDevices(
        allocatable=tuple(UUIDS),
        pods={
            ("serving", "llama-worker-0"): tuple(UUIDS[:2]),
            ("batch", "train-0"): tuple(UUIDS[2:6]),
        },
    )


async def test_a_kubelet_too_old_to_tell_allocatable_devices_still_tells_the_pods(
    kubelet: Kubelet,
) -> None:
    kubelet.state["unimplemented"] = ["GetAllocatableResources"]
    kubelet.holds("serving", "llama-worker-0", UUIDS[:1])
    reader = PodResources(str(kubelet.socket))
    try:
        read = await reader.read([GPU])
    finally:
        await reader.close()
    assert read == NodeDevices(allocatable=None, pods={("serving", "llama-worker-0"): (UUIDS[0],)})


async def test_a_missing_socket_is_said_with_its_path(tmp_path: Path) -> None:
    reader = PodResources(str(tmp_path / "nowhere.sock"), timeout=2)
    try:
        with pytest.raises(KubeletUnavailable, match=r"List on .*nowhere\.sock: UNAVAILABLE"):
            await reader.read([GPU])
    finally:
        await reader.close()


# -- the agent ----------------------------------------------------------------------------------


def agent_env(nats_url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WINGSMITH_", "HANGAR_"))}
    return clean | {"WINGSMITH_NATS_URL": nats_url, "WINGSMITH_NODE_NAME": "gpu-1"}


@contextlib.asynccontextmanager
async def node_agent(nats_url: str, kubelet: Kubelet) -> AsyncIterator[subprocess.Popen[str]]:
    """`wingsmith node-agent` for node gpu-1 of cluster east, reading every 0.2 s."""
    command = [
        *WINGSMITH,
        "node-agent",
        "--cluster-id",
        "east",
        "--socket",
        str(kubelet.socket),
        "--interval",
        "0.2",
    ]
    process = subprocess.Popen(command, env=agent_env(nats_url), stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        started = await asyncio.to_thread(process.stdout.readline)  # its signals are handled
        assert started.startswith("wingsmith node-agent for node gpu-1 of east"), started
        yield process
    finally:
        process.terminate()
        assert await asyncio.to_thread(process.wait, 30) == 0


async def test_the_agent_publishes_what_the_kubelet_says_and_again_when_it_changes(
    nats_server: EmbeddedNatsServer, client: Client, kubelet: Kubelet
) -> None:
    await nats_bus.ensure_streams(client)
    heard: list[NodeDevicesReport] = []

    async def listen() -> None:
        async for data in nats_bus.node_devices(client, "east"):
            heard.append(NodeDevicesReport.model_validate_json(data, strict=True))

    async def reports(count: int) -> bool:
        return len(heard) >= count

    listening = asyncio.create_task(listen())
    try:
        async with node_agent(nats_server.url, kubelet):
            await wait_for(lambda: reports(1), 30, "the agent's first report")
            first = heard[-1]
            assert (first.node_id, first.resources, first.pods) == ("gpu-1", [GPU], [])
            assert first.allocatable == sorted(UUIDS)
            assert first.refresh == pytest.approx(1.2)  # six reads of 0.2 s
            kubelet.holds("serving", "llama-worker-0", UUIDS[3:5])

            async def changed() -> bool:
                return [(p.name, p.device_ids) for p in heard[-1].pods] == [
                    ("llama-worker-0", UUIDS[3:5])
                ]

            await wait_for(changed, 30, "the change")
            # unchanged, it is published again every refresh ...
            count = len(heard)
            await wait_for(lambda: reports(count + 2), 30, "two refreshes")
    finally:
        listening.cancel()
    # ... and the stream keeps each content once per duplicate window
    stored = [
        orjson.loads(m.data)
        async for m in nats_bus.read_stream(
            client, names.OBS_STREAM, "wingsmith.obs.east.devices.gpu-1", follow=False
        )
    ]
    assert [[p["name"] for p in r["pods"]] for r in stored] == [[], ["llama-worker-0"]]


def test_the_agent_needs_its_node_named(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WINGSMITH_")}
    done = subprocess.run(
        [*WINGSMITH, "node-agent", "--cluster-id", "east"],
        env=clean | {"WINGSMITH_NATS_URL": "nats://127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--node: give the node's name, or set WINGSMITH_NODE_NAME" in done.stderr
    done = subprocess.run(
        [*WINGSMITH, "node-agent", "--cluster-id", "east", "--node", "Not_A_Node"],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--node: " in done.stderr


# -- through the operator to the plane ------------------------------------------------------------


def gpu_pod(
    name: str, gpus: int, *, deployment: str | None = None, node_name: str = "gpu-1"
) -> dict[str, Any]:
    """A pod asking for `gpus` GPUs: a worker of `deployment`, or someone else's."""
    labels = (
        {
            LABEL_DEPLOYMENT: deployment_label(deployment),
            "nvidia.com/dynamo-component-type": "worker",
            "nvidia.com/dynamo-component": "worker",
        }
        if deployment
        else {"app": "training"}
    )
    body = pod(name, labels=labels, node=node_name)
    body["spec"]["containers"] = [
        {"name": "main", "image": "x", "resources": {"limits": {GPU: str(gpus)}}}
    ]
    return body


def workload(name: str, replicas: int, devices: int) -> dict[str, Any]:
    return {
        "workload_id": name,
        "project": "research",
        "device_class": H100,
        "serving": LLAMA | {"devices_per_replica": devices, "parallelism": {"tensor": devices}},
        "replicas": replicas,
        "cluster": "east",
    }


async def until_view(
    client: Client, projection: str, key: str, holds: Callable[[dict[str, Any]], bool]
) -> None:
    """Wait until a view, as its KV bucket holds it, has the key and `holds` of it (views are
    published after the events they fold: a moment later)."""
    seen: list[Any] = []

    async def held() -> bool:
        entry = (await nats_bus.latest_views(client, projection)).get(key)
        seen[:] = [None if entry is None or entry[1] is None else orjson.loads(entry[1])]
        return seen[0] is not None and holds(seen[0])

    try:
        await wait_for(held, 30, f"{projection} {key}")
    except AssertionError:
        raise AssertionError(f"{projection} {key} never held: {seen}") from None


async def admission_of(client: Client, deployment_id: str) -> dict[str, Any] | None:
    views = await nats_bus.latest_views(client, "deployment_health")
    found = views.get(deployment_id)
    if found is None or found[1] is None:
        return None
    admission: dict[str, Any] | None = orjson.loads(found[1]).get("admission")
    return admission


async def test_replicas_carry_the_kubelets_uuids_and_outside_pods_take_capacity(
    hub: Hub, nats_server: EmbeddedNatsServer, client: Client, kubelet: Kubelet
) -> None:
    async with kube_emulator() as (emulator, _, kube):
        await cluster_create(emulator, "node", node("gpu-1", product=H100, gpus=8))
        await cluster_create(emulator, "node", node("gpu-2", product=H100, gpus=8))
        # gpu-2 runs no agent: what its pods hold is counted from their GPU limits
        await cluster_create(emulator, "pod", gpu_pod("batch-0", 5, node_name="gpu-2"))
        backend = KubeBackend(kube, "east", NAMESPACE, read_only=False, node_agents=True)
        async with running_operator(client, backend), node_agent(nats_server.url, kubelet):
            commands: list[tuple[str, dict[str, Any]]] = [
                ("cluster.register", {"cluster_id": "east"}),
                ("project.set_quota", {"project": "research", "device_class": H100, "devices": 16}),
                ("workload.create", workload("llama", 1, 2)),
            ]
            for verb, body in commands:
                reply = await send_until_answered(client, verb, {"command_id": verb, **body})
                assert reply["ok"], reply

            async def rendered() -> bool:
                return await kube.get_dgd(NAMESPACE, "llama") is not None

            await wait_for(rendered, 30, "the DGD")
            # Dynamo's operator starts the worker; until the kubelet has allocated its
            # devices the operator does not report it (it would have only stand-ins)
            worker = gpu_pod("llama-worker-0", 2, deployment="llama--east")
            await cluster_create(emulator, "pod", worker)
            await asyncio.sleep(1.0)
            assert await allocations(client) == {}
            kubelet.holds(NAMESPACE, "llama-worker-0", [UUIDS[6], UUIDS[1]])

            async def replica() -> dict[str, Any] | None:
                return (await allocations(client)).get("llama-worker-0")

            await wait_for(replica, 30, "the replica")
            assert (await replica() or {})["device_ids"] == [UUIDS[6], UUIDS[1]]

            # someone else's training job takes 4 of gpu-1's GPUs: 2 are left there, and 3
            # on gpu-2; 5 are free in sum, but a worker of 4 fits no node, so it waits
            await cluster_create(emulator, "pod", gpu_pod("train-0", 4))
            kubelet.holds(NAMESPACE, "train-0", UUIDS[2:6])
            await asyncio.sleep(1.0)  # the agent's next read, the operator's inventory
            reply = await send_until_answered(
                client, "workload.create", {"command_id": "big", **workload("big", 1, 4)}
            )
            assert reply["ok"], reply

            async def decided() -> dict[str, Any] | None:
                admission = await admission_of(client, "big--east")
                return admission if admission and admission.get("evidence") else None

            await wait_for(decided, 30, "big's admission")
            admission = await decided() or {}
            assert (admission["phase"], admission["reason"]) == ("pending", "insufficient_capacity")
            evidence = admission["evidence"]
            assert (evidence["capacity"], evidence["held_in_cluster"]) == (7, 2)
            assert (evidence["pod_devices"], evidence["nodes_fitting"]) == (4, 0)
            assert evidence["largest_node_free"] == 3
            # the capacity views say the same: 9 of 16 held outside, 2 by llama, 5 free
            fields = ("total", "held_outside", "allocated", "free")
            await until_view(
                client,
                "capacity",
                f"east.{H100}",
                lambda row: [row[k] for k in fields] == [16, 9, 2, 5],
            )
            await until_view(
                client,
                "capacity_nodes",
                f"east.{H100}.gpu-1",
                lambda n: [n[k] for k in ("held_outside", "allocated", "free")] == [4, 2, 2],
            )
            assert not (await replica() or {})["stand_in"]


# -- the operator's join, rule by rule (the agent's reports handed over as published) -----------


def agent_report(
    pods: dict[str, list[str]], *, allocatable: list[str] | None = UUIDS, refresh: float = 30.0
) -> bytes:
    """What node gpu-1's agent publishes: `pods` by name (namespace wingsmith)."""
    return orjson.dumps(
        {
            "cluster_id": "east",
            "node_id": "gpu-1",
            "resources": [GPU],
            "allocatable": allocatable,
            "pods": [
                {"namespace": NAMESPACE, "name": name, "device_ids": ids}
                for name, ids in pods.items()
            ],
            "refresh": refresh,
        }
    )


async def replica_ids(cluster: Cluster, pod: str) -> list[list[str]]:
    """The device ids of every report of replica `pod`, in order."""
    return [r["device_ids"] for r in await cluster.reported("replica") if r["pod"] == pod]


async def last_inventory(cluster: Cluster) -> dict[str, Any]:
    reported = await cluster.reported("inventory")
    return reported[-1]["nodes"][0] if reported and reported[-1]["nodes"] else {}


@contextlib.asynccontextmanager
async def joined(client: Client, **options: Any) -> AsyncIterator[Cluster]:
    """An operator for east with node gpu-1 (8 GPUs) and llama's render object."""
    async with operator(client, **options) as cluster:
        await cluster_create(cluster.emulator, "node", node("gpu-1", product=H100, gpus=8))
        await cluster.until_reported("inventory", lambda r: r["nodes"], "the node")
        await cluster.render(desired(replicas=1))
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        yield cluster


async def test_a_worker_waits_for_its_nodes_agent_then_keeps_the_ids_it_was_given(
    client: Client,
) -> None:
    async with joined(client, node_agents=True) as cluster:
        await cluster.backend.take_node_devices(agent_report({}))
        await cluster_create(cluster.emulator, "pod", gpu_pod("w-0", 2, deployment="llama--east"))
        await asyncio.sleep(0.5)
        assert await replica_ids(cluster, "w-0") == []  # not allocated yet: not reported
        await cluster.backend.take_node_devices(agent_report({"w-0": UUIDS[:2]}))
        await cluster.until_reported("replica", lambda r: r["pod"] == "w-0", "the replica")
        # the node's devices are named in the inventory, so the hub can check replicas' ids
        node_seen = await last_inventory(cluster)
        assert (node_seen["devices"], node_seen["device_ids"]) == (8, sorted(UUIDS))
        # an agent that later says otherwise does not change a replica's devices
        await cluster.backend.take_node_devices(agent_report({"w-0": UUIDS[4:6]}))
        await cluster_patch(
            cluster.emulator, "pod", gpu_pod("w-0", 2), {"metadata": {"labels": {"x": "y"}}}
        )
        await asyncio.sleep(0.5)
        assert {tuple(ids) for ids in await replica_ids(cluster, "w-0")} == {tuple(UUIDS[:2])}


async def test_stand_ins_where_no_agent_speaks_for_the_node(client: Client) -> None:
    """With node agents expected, a node never heard from waits out the grace; an agent gone
    silent, or a pod asking for no resource the agent watches, gets stand-ins at once."""
    async with joined(client, node_agents=True, agent_grace=1.0) as cluster:
        await cluster_create(cluster.emulator, "pod", gpu_pod("w-0", 2, deployment="llama--east"))
        await cluster.until_reported("replica", lambda r: r["pod"] == "w-0", "after the grace")
        assert await replica_ids(cluster, "w-0") == [["gpu-1/w-0/gpu0", "gpu-1/w-0/gpu1"]]
        # an agent heard once, then silent for three refreshes: stand-ins again
        await cluster.backend.take_node_devices(agent_report({}, refresh=0.5))
        await cluster.until_reported(
            "inventory", lambda r: "device_ids" in r["nodes"][0], "the agent's devices"
        )
        await cluster.until_reported(
            "inventory",
            lambda r: r["nodes"] and "device_ids" not in r["nodes"][0],
            "the silent agent's devices dropped",
        )
        await cluster_create(cluster.emulator, "pod", gpu_pod("w-1", 2, deployment="llama--east"))
        await cluster.until_reported("replica", lambda r: r["pod"] == "w-1", "w-1")
        assert await replica_ids(cluster, "w-1") == [["gpu-1/w-1/gpu0", "gpu-1/w-1/gpu1"]]


async def test_a_report_that_does_not_hold_is_refused_and_changes_nothing(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    async with joined(client, node_agents=True) as cluster:
        backend = cluster.backend
        await backend.take_node_devices(b"{not json")
        twice = orjson.loads(agent_report({"w-0": [UUIDS[0]], "w-1": [UUIDS[0]]}))
        await backend.take_node_devices(orjson.dumps(twice))
        other = orjson.loads(agent_report({})) | {"cluster_id": "west"}
        await backend.take_node_devices(orjson.dumps(other))
        invented = orjson.loads(agent_report({})) | {"node_id": "gpu-99"}
        await backend.take_node_devices(orjson.dumps(invented))
        assert backend._agent("gpu-1") is None and backend._agent("gpu-99") is None
        refusals = [r.getMessage() for r in caplog.records if "node agent" in r.getMessage()]
        assert len(refusals) == 4, refusals
        assert f"pods: '{UUIDS[0]}' is listed more than once" in refusals[1]
        assert "for cluster 'west'" in refusals[2]
        assert "for node 'gpu-99', which the cluster lacks" in refusals[3]


async def test_pods_wingsmith_does_not_manage_hold_devices_outside_it(client: Client) -> None:
    """Counted from the pods the operator sees where no agent speaks, and from what the
    agent lists (pods the operator may not even watch) where one does."""
    async with joined(client) as cluster:
        await cluster.until_reported("inventory", lambda r: r["nodes"], "the node")
        await cluster_create(cluster.emulator, "pod", gpu_pod("train-0", 3))
        await cluster_create(cluster.emulator, "pod", gpu_pod("w-0", 2, deployment="llama--east"))
        await cluster.until_reported(
            "inventory", lambda r: r["nodes"][0].get("held_outside") == 3, "3 outside"
        )
        await cluster.backend.take_node_devices(
            agent_report({"w-0": UUIDS[:2], "train-0": UUIDS[2:5], "unwatched": UUIDS[5:6]})
        )
        await cluster.until_reported(
            "inventory", lambda r: r["nodes"][0].get("held_outside") == 4, "4 outside"
        )
        finished = gpu_pod("train-0", 3)
        await cluster_patch(cluster.emulator, "pod", finished, {"status": {"phase": "Succeeded"}})
        await cluster.backend.take_node_devices(
            agent_report({"w-0": UUIDS[:2], "unwatched": UUIDS[5:6]})
        )
        await cluster.until_reported(
            "inventory", lambda r: r["nodes"][0].get("held_outside") == 1, "1 outside"
        )


async def test_a_cordoned_or_not_ready_node_is_unschedulable(client: Client) -> None:
    async with joined(client) as cluster:
        gpu_1 = node("gpu-1", product=H100, gpus=8)
        await cluster.until_reported("inventory", lambda r: r["nodes"], "the node")
        await cluster_patch(cluster.emulator, "node", gpu_1, {"spec": {"unschedulable": True}})
        await cluster.until_reported(
            "inventory", lambda r: r["nodes"][0].get("unschedulable") is True, "cordoned"
        )
        await cluster_patch(cluster.emulator, "node", gpu_1, {"spec": {"unschedulable": False}})
        await cluster.until_reported(
            "inventory", lambda r: "unschedulable" not in r["nodes"][0], "uncordoned"
        )
        not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
        await cluster_patch(cluster.emulator, "node", gpu_1, not_ready)
        await cluster.until_reported(
            "inventory", lambda r: r["nodes"][0].get("unschedulable") is True, "not ready"
        )


# -- Dynamic Resource Allocation: ids from claims and slices ------------------------------------


async def test_on_a_dra_cluster_replicas_carry_the_uuids_their_claims_were_allocated(
    client: Client,
) -> None:
    gpus = [Gpu(f"gpu-{i}", uuid=UUIDS[i]) for i in range(4)]
    async with operator(client) as cluster:
        emulator = cluster.emulator
        await cluster_create(emulator, "node", node("gpu-1", product=H100, gpus=0))
        await cluster_create(
            emulator, "resourceslice/v1", resource_slice("gpu-1-gpus", gpus, node="gpu-1")
        )
        await cluster.render(desired(replicas=1))
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        worker = claim_pod("w-0", node="gpu-1", generated="w-0-gpus")
        worker["metadata"]["labels"] = gpu_pod("w-0", 2, deployment="llama--east")["metadata"][
            "labels"
        ]
        await cluster_create(emulator, "pod", worker)
        pending = resource_claim("w-0-gpus", owner=worker)
        await cluster_create(emulator, "resourceclaim/v1", pending)
        await asyncio.sleep(1.0)
        assert await replica_ids(cluster, "w-0") == []  # not allocated yet: not reported
        allocated = resource_claim(
            "w-0-gpus",
            owner=worker,
            allocated=[("gpu-1", "gpu-2"), ("gpu-1", "gpu-0")],
            reserved_for=[worker],
        )
        await cluster_patch(emulator, "resourceclaim/v1", pending, {"status": allocated["status"]})
        await cluster.until_reported("replica", lambda r: r["pod"] == "w-0", "the replica")
        assert await replica_ids(cluster, "w-0") == [sorted([UUIDS[2], UUIDS[0]])]
        # the slices name the node's devices; someone else's claim holds one of them
        other = claim_pod("train-0", namespace="default", node="gpu-1", generated="train-gpus")
        await cluster_create(emulator, "pod", other)
        taken = resource_claim(
            "train-gpus",
            "default",
            owner=other,
            allocated=[("gpu-1", "gpu-3")],
            reserved_for=[other],
        )
        await cluster_create(emulator, "resourceclaim/v1", taken)
        seen = await cluster.until_reported(
            "inventory", lambda r: r["nodes"][0].get("held_outside") == 1, "1 held outside"
        )
        assert seen["nodes"][0]["devices"] == 4
        assert seen["nodes"][0]["device_ids"] == sorted(UUIDS[:4])
        assert cluster.backend.readiness()["listed_claims"]
