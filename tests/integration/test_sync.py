"""Anti-entropy, end to end: `wingsmith up` killed with SIGKILL again and again while a cluster
starts pods, and after a restart and one sync period the plane's allocations are exactly the
pods the cluster has, with no device in two of them; on a simulated cluster and on kmock.
Also: a promoted model whose pod becomes ready just after adoption is reported ready."""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.kube import COMPONENT_TYPE_LABEL, DEVICE_IDS_ANNOTATION
from wingsmith.services.operator.backends.simulated import (
    SimNode,
    simulated_operators,
)
from wingsmith.services.operator.dgd import LABEL_DEPLOYMENT, deployment_label

from .conftest import HubProcess, read_store, wait_for
from .kube_fixtures import (
    cluster_create,
    cluster_delete,
    kube_emulator,
    node,
    pod,
    write_kubeconfig,
)
from .test_simulated import command, health, pinned, until_event, view

SYNC_EVERY = "1"  # seconds: short, so that a test waits one period, not a minute


class Up(HubProcess):
    """`wingsmith up` with arguments (say `--simulated`), killable with SIGKILL."""

    def __init__(self, nats_url: str, data_dir: Path, *args: str) -> None:
        super().__init__(nats_url, data_dir, {"WINGSMITH_OPERATOR_SYNC_EVERY": SYNC_EVERY})
        self.args = args

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "wingsmith", "-v", "up", "--no-api", *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )


async def allocations(client: Client) -> dict[str, dict[str, Any]]:
    """The plane's live replicas, by pod name, as the allocations view has them."""
    views = await nats_bus.latest_views(client, "allocations")
    live = [orjson.loads(v) for _, v in views.values() if v is not None]
    return {a["name"]: a for a in live}


def no_device_twice(held: dict[str, dict[str, Any]]) -> None:
    devices = [(a["node_id"], d) for a in held.values() for d in a["device_ids"]]
    assert len(devices) == len(set(devices)), f"a device is in two allocations: {held}"


async def until_converged(client: Client, cluster: Any) -> None:
    """Wait until the plane holds exactly the cluster's pods (`cluster()`: pod -> node,
    devices); fail showing both."""
    seen: list[Any] = []
    try:
        await wait_for(lambda: converged(client, cluster(), seen), 60, "the plane to heal")
    except AssertionError:
        raise AssertionError(f"the plane never held the cluster's pods: {seen}") from None


async def converged(
    client: Client, cluster: dict[str, tuple[str, tuple[str, ...]]], seen: list[Any]
) -> bool:
    """Whether the plane holds exactly the cluster's pods (`cluster`: pod -> node, devices)."""
    held = await allocations(client)
    plane = {name: (a["node_id"], tuple(a["device_ids"])) for name, a in held.items()}
    seen[:] = [plane, cluster]
    return plane == cluster


# -- the simulated cluster ------------------------------------------------------------------


def simulated_pods(state_file: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The pods the simulated cluster has saved: all it has."""
    state = orjson.loads(state_file.read_bytes()) if state_file.exists() else {"pods": {}}
    return {
        p["name"]: (p["node"], tuple(p["device_ids"]))
        for deployment_id, pods in state["pods"].items()
        if not deployment_id.startswith("dgd:")
        for p in pods
    }


@contextlib.asynccontextmanager
async def replica_news(client: Client) -> AsyncIterator[asyncio.Event]:
    """Set whenever the plane records that a replica started or terminated (the relay
    publishes it right after the hub stored it; one published again after a restart is no
    news): the moment to kill, mid-way through the cluster's reports of a scale."""
    news, seen = asyncio.Event(), set()

    async def heard(msg: Any) -> None:
        if msg.subject not in seen:
            seen.add(msg.subject)
            news.set()

    subscriptions = [
        await client.subscribe(f"wingsmith.evt.replica.*.{kind}", cb=heard)
        for kind in ("ReplicaStarted", "ReplicaTerminated")
    ]
    try:
        yield news
    finally:
        for subscription in subscriptions:
            await subscription.unsubscribe()


async def test_sigkill_during_pod_starts_on_a_simulated_cluster_heals_within_a_sync(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    data_dir = tmp_path / "up"
    up = Up(nats_server.url, data_dir, "--simulated", "east=2x4:H100")
    state_file = data_dir / "simulated" / "east.json"
    await up.start()
    try:
        await up.wait_ready(client)
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=8)
        await until_event(client, "cluster", "east", "OperatorConnected")  # east is known
        await command(client, "w", "workload.create", **pinned("chat", replicas=1))
        async with replica_news(client) as news:
            mid_change = 0  # rounds killed as the plane recorded a change, not after a wait
            for round_ in range(6):  # scale up and down; kill as the first pod is recorded
                replicas = 2 if len(simulated_pods(state_file)) > 4 else 8
                news.clear()
                await command(
                    client, f"s{round_}", "workload.scale", workload_id="chat", replicas=replicas
                )
                with contextlib.suppress(TimeoutError):  # the cluster may be there already
                    await asyncio.wait_for(news.wait(), 15)
                mid_change += news.is_set()
                up.kill()
                await up.start()
                await up.wait_ready(client)
            assert mid_change >= 3, f"only {mid_change} of 6 kills landed during a change"
        await command(client, "final", "workload.scale", workload_id="chat", replicas=8)

        async def eight_pods() -> bool:
            return len(simulated_pods(state_file)) == 8

        await wait_for(eight_pods, 30, "the cluster to run 8 pods")
        await until_converged(client, lambda: simulated_pods(state_file))
        no_device_twice(await allocations(client))
        capacity = await view(client, "capacity", "east.H100")
        assert capacity is not None and capacity["allocated"] == 8, capacity

        await quiet_syncs(client, data_dir)

        # a report the cluster never should have sent (or one long overtaken): a pod it does
        # not have, on a device another pod holds; the next sync takes it back
        await phantom(client, state_file)
        await wait_for(lambda: has_phantom(client), 20, "the phantom replica to be recorded")
        await until_converged(client, lambda: simulated_pods(state_file))
        assert "observation refused" not in up.log.read_text()
    finally:
        up.kill()


async def quiet_syncs(client: Client, data_dir: Path) -> None:
    """Once the cluster is settled, syncs that agree with the plane record no event."""

    async def all_ready() -> bool:
        return (await health(client, "chat--east")).get("ready_replicas") == 8

    await wait_for(all_ready, 30, "every replica to be ready")
    notes = read_store(data_dir)
    events = [n for n in notes if not str(n.originator_id).startswith("command:")]

    async def three_more_syncs() -> bool:
        later = read_store(data_dir)[len(notes) :]
        return sum(":sync:" in str(n.originator_id) for n in later) >= 3

    await wait_for(three_more_syncs, 30, "three more syncs")
    later = [n for n in read_store(data_dir) if not str(n.originator_id).startswith("command:")]
    assert [n.originator_id for n in later] == [n.originator_id for n in events]


async def phantom(client: Client, state_file: Path) -> None:
    node_id, devices = next(iter(simulated_pods(state_file).values()))
    report = {
        "cluster_id": "east",
        "deployment_id": "chat--east",
        "pod": "chat-phantom",
        "node_id": node_id,
        "device_ids": list(devices),
        "serving_digest": "svg_phantom",
        "engine_version": "0.9.2",
        "state": "ready",
        "version": 1,
    }
    await nats_bus.publish_observation(client, "east", "replica", report, "east:phantom:1")


async def has_phantom(client: Client) -> bool:
    return "chat-phantom" in await allocations(client)


async def test_a_promoted_model_whose_pod_becomes_ready_after_adoption_is_ready(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """The pod becomes ready after its deployment adopted it: the cluster's status says so,
    not only the replica (no sync in between to set it right)."""
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=4)
        async with simulated_operators(client, nodes, heartbeat_every=0.3, sync_every=600):
            await until_event(client, "cluster", "east", "OperatorConnected")
            model = {"model": "q", "backend": "vllm", "engine_version": "1", "gpus": 1}
            # its pod loads until the test says it has loaded: ready only after adoption
            fault = {"fault": "run_model", "name": "qwen", "loading": True} | model
            await nats_bus.request(client, names.fault_subject("east"), orjson.dumps(fault), 5)

            async def sighted() -> bool:
                return await view(client, "discovered", "east--default--qwen") is not None

            await wait_for(sighted, 20, "the sighting")
            await command(
                client, "p", "discovery.promote", discovery_id="east--default--qwen", project="p"
            )

            async def adopted_before_ready() -> bool:
                status = (await health(client, "qwen--east")).get("status")
                return status is not None

            await wait_for(adopted_before_ready, 20, "the adopted deployment's first status")
            first = (await health(client, "qwen--east"))["status"]
            assert first["ready_replicas"] == 0, "the pod was ready before it loaded"
            loaded = orjson.dumps({"fault": "model_loaded", "name": "qwen"})
            reply = await nats_bus.request(client, names.fault_subject("east"), loaded, 5)
            assert orjson.loads(reply) == {"ok": True}

            async def ready() -> bool:
                status = (await health(client, "qwen--east")).get("status") or {}
                return bool(status.get("ready_replicas") == 1)

            await wait_for(ready, 20, "the status to count the ready pod")
            assert (await health(client, "qwen--east"))["ready_replicas"] == 1


# -- kmock ----------------------------------------------------------------------------------

DEPLOYMENT = "chat--east"


class Kubelet:
    """What Dynamo and the kubelet would do, by hand: worker pods of the deployment, each on a
    node with devices of its own."""

    def __init__(self, emulator: Any, nodes: dict[str, int]) -> None:
        self.emulator = emulator
        self.free = {n: [f"GPU-{n}-{i}" for i in range(count)] for n, count in nodes.items()}
        self.pods: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._names = iter(range(10_000))

    async def start(self) -> None:
        node_id = next(n for n, free in self.free.items() if free)
        device = self.free[node_id].pop(0)
        name = f"chat-worker-{next(self._names)}"
        labels = {LABEL_DEPLOYMENT: deployment_label(DEPLOYMENT), COMPONENT_TYPE_LABEL: "worker"}
        annotations = {DEVICE_IDS_ANNOTATION: device}
        body = pod(name, labels=labels, annotations=annotations, node=node_id, ready=False)
        await cluster_create(self.emulator, "pod", body)
        self.pods[name] = (node_id, (device,))

    async def stop(self) -> None:
        name = next(iter(self.pods))
        node_id, devices = self.pods.pop(name)
        await cluster_delete(self.emulator, "pod", pod(name))
        self.free[node_id] += devices

    async def scale(self, replicas: int, pause: float) -> None:
        while len(self.pods) != replicas:
            await (self.start() if len(self.pods) < replicas else self.stop())
            await asyncio.sleep(pause)


class OperatorProcess:
    """`wingsmith operator` on the kmock cluster, in its own process: killable with SIGKILL."""

    def __init__(self, env: dict[str, str], kubeconfig: Path, log: Path) -> None:
        self.env, self.kubeconfig, self.log = env, kubeconfig, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["operator", "--cluster-id", "east", "--kubeconfig", str(self.kubeconfig)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "wingsmith", "-v", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextlib.asynccontextmanager
async def kmock_cluster(tmp_path: Path) -> AsyncIterator[tuple[Any, Path]]:
    """kmock with two nodes of 4 GPUs, and a kubeconfig that reaches it."""
    async with kube_emulator() as (emulator, server, _):
        for name in ("east-n1", "east-n2"):
            await cluster_create(emulator, "node", node(name, product="H100", gpus=4))
        yield emulator, write_kubeconfig(tmp_path / "kubeconfig", str(server.url))


async def test_sigkill_during_pod_starts_on_kmock_heals_within_a_sync(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """The hub and the operator are both killed while pods come and go: reports are lost
    (a pod deleted while no operator watched is never reported gone) and the sync heals."""
    data_dir = tmp_path / "up"
    up = Up(nats_server.url, data_dir)
    rng = random.Random(7)
    async with kmock_cluster(tmp_path) as (emulator, kubeconfig):
        operator = OperatorProcess(up.env, kubeconfig, data_dir / "operator.log")
        kubelet = Kubelet(emulator, {"east-n1": 4, "east-n2": 4})
        await up.start()
        try:
            await up.wait_ready(client)
            operator.start()
            await command(
                client, "q", "project.set_quota", project="p", device_class="H100", devices=8
            )
            await until_event(client, "cluster", "east", "OperatorConnected")
            await command(client, "w", "workload.create", **pinned("chat", replicas=8))
            await until_event(client, "deployment", DEPLOYMENT, "AdmissionDecided")
            async with replica_news(client) as news:
                mid_change = 0  # rounds killed as the plane recorded a change, not after a wait
                for round_ in range(6):  # kill both as the plane records the first change
                    replicas = 8 if round_ % 2 == 0 else 2
                    news.clear()
                    pause = rng.uniform(0.02, 0.1)
                    scaling = asyncio.create_task(kubelet.scale(replicas, pause))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(news.wait(), 15)
                    mid_change += news.is_set()
                    up.kill()
                    operator.kill()
                    await scaling  # the rest happens while nobody watches
                    await up.start()
                    await up.wait_ready(client)
                    operator.start()
                assert mid_change >= 3, f"only {mid_change} of 6 kills landed during a change"
            await kubelet.scale(8, 0.01)

            await until_converged(client, lambda: dict(kubelet.pods))
            no_device_twice(await allocations(client))
            assert "observation refused" not in up.log.read_text()
        finally:
            operator.kill()
            up.kill()
