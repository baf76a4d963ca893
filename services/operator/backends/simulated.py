"""A simulated cluster: what Kubernetes and Dynamo would do for an operator, with no Kubernetes.

It is an operator backend (`services.operator.runtime.Backend`): it runs each deployment's pods
on named devices of its nodes and reports what happens: its inventory, every replica as it
starts, becomes ready and terminates, and each deployment's status and live digests. Every
report carries the cluster's own ordering (`version`), as a real cluster's resourceVersion.

Rollouts go as Dynamo's do: replicas of the new serving configuration start beside the old ones
while there are devices for them, and the old ones terminate once the new ones are all ready.
When there are no devices for a new replica, an old one is terminated first to make room.

Faults on demand, by request on `wingsmith.sim.<cluster>.fault`: `{"fault": "node_loss",
"node": ID}` takes a node and its pods away (`node_restore` brings it back); `{"fault":
"image_pull", "deployment_id": ID}` makes the deployment's pods fail to pull their image until
its serving configuration changes or `{"fault": "clear", "deployment_id": ID}`.

Models nobody declared, the same way: `{"fault": "run_model", "namespace": NS, "name": NAME,
"model": M, "backend": B, "engine_version": V, "replicas": N, "gpus": G, "args": [...]}` starts
one on the cluster (as if someone had applied a DynamoGraphDeployment by hand), which the
operator reports as discovered; `stop_model` (namespace, name) removes it. Once a deployment
adopts it, its pods are reported as that deployment's replicas; promoted to managed, the
deployment takes them over without restarting them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from wingsmith.adapters import nats_bus
from wingsmith.domain import names
from wingsmith.domain.cluster import Node
from wingsmith.domain.contracts.reports import (
    DeploymentReport,
    DiscoveryReport,
    InventoryReport,
    ReplicaReport,
    ReplicaState,
    SyncedReplica,
    SyncReport,
)
from wingsmith.domain.deployment import Authority, ClusterPhase, DeploymentStatus
from wingsmith.domain.discovery import DiscoveredComponent, Sighting
from wingsmith.services.operator.runtime import OperatorOptions, Report, run_operator
from wingsmith.services.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_SPEC = re.compile(r"^(?:(\d+)x)?(\d+):([A-Za-z0-9][-_A-Za-z0-9]*)(?:@([-._A-Za-z0-9]+))?$")


@dataclass
class SimNode:
    node_id: str
    device_class: str
    devices: int
    topology_domain: str | None = None
    lost: bool = False
    free: list[str] = field(init=False)  # device UUIDs no pod holds

    def __post_init__(self) -> None:
        self.device_ids = [f"GPU-{self.node_id}-{i}" for i in range(self.devices)]
        self.free = list(self.device_ids)


WORKER_NAMES = {"vllm": "VllmWorker", "sglang": "SGLangWorker", "trtllm": "TRTLLMWorker"}


def _adopted_key(want: Mapping[str, Any]) -> str | None:
    adopted = want.get("adopted")
    return f"{adopted['namespace']}/{adopted['name']}" if adopted else None


def nodes_from_spec(cluster_id: str, spec: str) -> list[SimNode]:
    """Nodes from `[COUNTx]GPUS:CLASS[@DOMAIN]`, comma-separated: `2x8:H100@rack-a,4:A100` is
    two nodes of 8 H100 in rack-a and one of 4 A100."""
    nodes: list[SimNode] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = _SPEC.match(part)
        if match is None:
            raise ValueError(f"simulated spec {part!r}: expected [COUNTx]GPUS:CLASS[@DOMAIN]")
        count, gpus, device_class, domain = match.groups()
        for _ in range(int(count or 1)):
            node_id = f"{cluster_id}-n{len(nodes) + 1}"
            nodes.append(SimNode(node_id, device_class, int(gpus), domain))
    if not nodes:
        raise ValueError("simulated spec: no nodes")
    return nodes


@dataclass
class Pod:
    name: str
    node: SimNode
    device_ids: tuple[str, ...]
    digest: str
    engine_version: str
    ready: bool = False


class SimulatedCluster:
    def __init__(
        self,
        cluster_id: str,
        nodes: list[SimNode],
        *,
        ready_after: float = 0.3,
        inventory_every: float = 30.0,
        read_only: bool = False,
        state_file: Path | None = None,
    ) -> None:
        """`state_file`: where the cluster keeps its pods, so that they outlive the operator's
        process as a real cluster's do (None: they live as long as this object)."""
        self.cluster_id, self.nodes = cluster_id, nodes
        self.ready_after, self.inventory_every = ready_after, inventory_every
        self.read_only, self.state_file = read_only, state_file
        self.desired: dict[str, Mapping[str, Any]] = {}
        self.pods: dict[str, dict[str, Pod]] = {}  # deployment id -> pod name -> pod
        self.failing: dict[str, str] = {}  # deployment id -> digest whose image cannot be pulled
        self.foreign: dict[str, dict[str, Any]] = {}  # `ns/name` -> sighting of a model run by hand
        # Pod names and report versions go on across restarts, as a real cluster's do: a new
        # start neither reuses a name nor orders its reports before the last start's.
        self._instance = uuid.uuid4().hex[:5]
        self._names = itertools.count()
        self._versions = itertools.count(time.time_ns() // 1000)
        self._later: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._report: Report | None = None
        self._load()

    # -- the backend ---------------------------------------------------------------------

    async def apply(self, deployment_id: str, desired: Mapping[str, Any] | None) -> None:
        """Keep the render object; run it unless the operator is read-only or the deployment is
        observed (then nothing on the cluster changes, as for a real one)."""
        async with self._lock:
            if desired is None:
                removed = self.desired.pop(deployment_id, None)
                if removed is not None and _adopted_key(removed) in self.foreign:
                    # what was adopted was never ours: it keeps running, as before adoption
                    self.pods[f"dgd:{_adopted_key(removed)}"] = self.pods.pop(deployment_id, {})
                    self._save()
                    return
            else:
                self.desired[deployment_id] = desired
                await self._adopt(deployment_id, desired)
            await self._reconcile(deployment_id)
            self._save()

    async def observe(self, report: Report) -> None:
        """Report the inventory now and every `inventory_every` seconds (a hub that refused it,
        say before the cluster was known, gets it again)."""
        self._report = report
        for key in self.foreign:  # what a restarted operator finds again
            await self._report_sighting(key)
        for deployment_id, pods in self.pods.items():  # restored, and not ready yet
            for pod in pods.values():
                if not pod.ready:
                    self._later_ready(deployment_id, pod)
        try:
            while True:
                await self._report_inventory()
                await asyncio.sleep(self.inventory_every)
        finally:
            for task in self._later:
                task.cancel()

    async def serve_faults(self, nc: nats_bus.Connection) -> None:
        """Answer fault requests until cancelled."""

        async def answer(request: bytes) -> bytes:
            try:
                reply = await self._fault(request)
            except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as e:
                reply = {"ok": False, "error": f"not a fault request: {e}"}
            return orjson.dumps(reply)

        await nats_bus.answer_requests(nc, names.fault_subject(self.cluster_id), answer)

    # -- what survives a restart ---------------------------------------------------------

    def _save(self) -> None:
        if self.state_file is None:
            return
        state = {
            "pods": {
                deployment_id: [
                    {
                        "name": p.name,
                        "node": p.node.node_id,
                        "device_ids": list(p.device_ids),
                        "digest": p.digest,
                        "engine_version": p.engine_version,
                        "ready": p.ready,
                    }
                    for p in pods.values()
                ]
                for deployment_id, pods in self.pods.items()
            },
            "failing": self.failing,
            "foreign": self.foreign,
            "lost": [n.node_id for n in self.nodes if n.lost],
        }
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_file.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps(state))
        temporary.replace(self.state_file)

    def _load(self) -> None:
        """Pods on nodes the spec no longer has, or on devices it no longer has, are gone."""
        if self.state_file is None or not self.state_file.exists():
            return
        state = orjson.loads(self.state_file.read_bytes())
        nodes = {n.node_id: n for n in self.nodes}
        for each in self.nodes:  # the saved state is the whole truth
            each.free, each.lost = list(each.device_ids), False
        for node_id in state.get("lost", []):
            if node_id in nodes:
                nodes[node_id].lost = True
        self.failing = dict(state.get("failing", {}))
        self.foreign = dict(state.get("foreign", {}))
        for deployment_id, pods in state.get("pods", {}).items():
            for saved in pods:
                node = nodes.get(saved["node"])
                if node is None or node.lost or not set(saved["device_ids"]) <= set(node.free):
                    continue
                node.free = [d for d in node.free if d not in saved["device_ids"]]
                pod = Pod(
                    saved["name"],
                    node,
                    tuple(saved["device_ids"]),
                    saved["digest"],
                    saved["engine_version"],
                    saved["ready"],
                )
                self.pods.setdefault(deployment_id, {})[pod.name] = pod

    # -- faults --------------------------------------------------------------------------

    async def _fault(self, data: bytes) -> dict[str, Any]:
        request = orjson.loads(data)
        fault = request.get("fault")
        async with self._lock:
            if fault in {"node_loss", "node_restore"}:
                node = next((n for n in self.nodes if n.node_id == request.get("node")), None)
                if node is None:
                    return {"ok": False, "error": f"node: no node {request.get('node')!r}"}
                await self._set_lost(node, fault == "node_loss")
            elif fault in {"image_pull", "clear"}:
                deployment_id = request.get("deployment_id")
                want = self.desired.get(deployment_id or "")
                if want is None:
                    return {"ok": False, "error": f"deployment_id: unknown {deployment_id!r}"}
                if fault == "image_pull":
                    self.failing[want["deployment_id"]] = want["serving_digest"]
                else:
                    self.failing.pop(want["deployment_id"], None)
                await self._reconcile(want["deployment_id"])
            elif fault in {"run_model", "stop_model"}:
                reply = await self._foreign_model(request, run=fault == "run_model")
                self._save()
                return reply
            else:
                kinds = "node_loss, node_restore, image_pull, clear, run_model, stop_model"
                return {"ok": False, "error": f"fault: one of {kinds}"}
            self._save()
        return {"ok": True}

    async def _foreign_model(self, request: dict[str, Any], *, run: bool) -> dict[str, Any]:
        """Start (or stop) a model as if someone had applied its DynamoGraphDeployment by hand:
        its pods run under `dgd:<ns>/<name>` until a deployment adopts them."""
        namespace, name = request.get("namespace") or "default", request.get("name")
        if not isinstance(name, str) or not name:
            return {"ok": False, "error": "name: the model's DynamoGraphDeployment name"}
        key = f"{namespace}/{name}"
        owner = next(
            (d for d, want in self.desired.items() if _adopted_key(want) == key), f"dgd:{key}"
        )
        if not run:
            if self.foreign.pop(key, None) is None:
                return {"ok": False, "error": f"name: no model {key!r} runs here"}
            for pod in list(self.pods.get(owner, {}).values()):
                await self._terminate(owner, pod)
            await self._report_sighting(key, gone=True)
            return {"ok": True}
        if key in self.foreign:
            return {"ok": False, "error": f"name: {key!r} runs already"}
        replicas, gpus = int(request.get("replicas", 1)), int(request.get("gpus", 1))
        want = {
            "workload_id": name,
            "device_class": self.nodes[0].device_class,
            "serving": {"devices_per_replica": gpus, "engine_version": request["engine_version"]},
            "serving_digest": "worker",  # names its pods <name>-worker-…
        }
        self.pods.setdefault(owner, {})
        started: list[Pod] = []
        for _ in range(replicas):
            new = await self._start(owner, want)
            if new is None:
                for each in started:  # all or nothing
                    await self._terminate(owner, each)
                return {"ok": False, "error": "replicas: not enough free devices"}
            started.append(new)
        self.foreign[key] = {
            "namespace": namespace,
            "name": name,
            "api_version": "nvidia.com/v1beta1",
            "backend": request.get("backend"),
            "components": [
                {"name": "Frontend", "role": "frontend", "replicas": 1, "gpus_per_replica": 0},
                {
                    "name": WORKER_NAMES.get(str(request.get("backend")), "Worker"),
                    "role": "worker",
                    "replicas": replicas,
                    "gpus_per_replica": gpus,
                    "imported_args": list(request.get("args", [])),
                },
            ],
            "model": request.get("model"),
            "engine_version": request["engine_version"],
            "tensor_parallel": gpus,
        }
        await self._report_sighting(key)
        return {"ok": True}

    async def _adopt(self, deployment_id: str, want: Mapping[str, Any]) -> None:
        """A deployment adopted a model run by hand: its pods are that deployment's now, running
        the configuration the deployment says they run."""
        key = _adopted_key(want)
        pods = self.pods.pop(f"dgd:{key}", None)
        if pods is None:
            return
        self.pods[deployment_id] = pods
        for pod in pods.values():
            pod.digest = want["serving_digest"]
            state = ReplicaState.READY if pod.ready else ReplicaState.STARTED
            await self._report_replica(deployment_id, pod, state)
        await self._report_status(deployment_id, len(pods))

    async def _set_lost(self, node: SimNode, lost: bool) -> None:
        node.lost = lost
        if lost:
            for deployment_id, pods in self.pods.items():
                for pod in [p for p in pods.values() if p.node is node]:
                    await self._terminate(deployment_id, pod)
            node.free = list(node.device_ids)
        await self._report_inventory()
        for deployment_id in list(self.desired):
            await self._reconcile(deployment_id)

    # -- reconciling ---------------------------------------------------------------------

    async def _reconcile(self, deployment_id: str) -> None:
        want = self.desired.get(deployment_id)
        if deployment_id.startswith("dgd:"):
            return  # a model run by hand: not the plane's
        if self.read_only or (want is not None and _observed(want)):
            # read-only, or observed: nothing on the cluster changes, but what runs there still
            # does (a pod became ready) and is reported as it is
            if want is not None and self.pods.get(deployment_id):
                await self._report_status(deployment_id, self._wanted(deployment_id))
            return
        pods = self.pods.setdefault(deployment_id, {})
        replicas = want["replicas"] if want and want["enabled"] else 0
        digest = want["serving_digest"] if want else None
        if self.failing.get(deployment_id, digest) != digest:
            del self.failing[deployment_id]  # a new serving configuration: a new image
        current = [p for p in pods.values() if p.digest == digest]
        old = [p for p in pods.values() if p.digest != digest]
        for pod in current[replicas:]:
            await self._terminate(deployment_id, pod)
        missing = replicas - len(current)
        if deployment_id in self.failing:
            await self._report_status(deployment_id, replicas, failed=True)
            return
        while missing > 0 and want is not None:
            if await self._start(deployment_id, want) is not None:
                missing -= 1
            elif old:  # no devices for it: an old replica makes room
                await self._terminate(deployment_id, old.pop(0))
            else:
                break  # short of devices: it stays short
        new = [p for p in pods.values() if p.digest == digest]
        if len(new) >= replicas and all(p.ready for p in new):
            for pod in old:  # the new generation serves in full: the old one goes
                await self._terminate(deployment_id, pod)
        if want is not None or pods:
            await self._report_status(deployment_id, replicas, short=missing > 0)

    async def _start(self, deployment_id: str, want: Mapping[str, Any]) -> Pod | None:
        per = want["serving"]["devices_per_replica"]
        node = next(
            (
                n
                for n in self.nodes
                if not n.lost and n.device_class == want["device_class"] and len(n.free) >= per
            ),
            None,
        )
        if node is None:
            return None
        devices, node.free = tuple(node.free[:per]), node.free[per:]
        pod = Pod(
            f"{want['workload_id']}-{want['serving_digest'][-6:]}-{self._instance}"
            f"{next(self._names)}",
            node,
            devices,
            want["serving_digest"],
            want["serving"]["engine_version"],
        )
        self.pods[deployment_id][pod.name] = pod
        await self._report_replica(deployment_id, pod, ReplicaState.STARTED)
        self._later_ready(deployment_id, pod)
        return pod

    def _later_ready(self, deployment_id: str, pod: Pod) -> None:
        task = asyncio.create_task(self._become_ready(deployment_id, pod))
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _become_ready(self, deployment_id: str, pod: Pod) -> None:
        await asyncio.sleep(self.ready_after)
        async with self._lock:
            # under its deployment, or the one that adopted it meanwhile; else terminated
            owners = [d for d, pods in self.pods.items() if pods.get(pod.name) is pod]
            if not owners:
                return
            deployment_id = owners[0]
            pod.ready = True
            await self._report_replica(deployment_id, pod, ReplicaState.READY)
            await self._reconcile(deployment_id)
            self._save()

    async def _terminate(self, deployment_id: str, pod: Pod) -> None:
        del self.pods[deployment_id][pod.name]
        if not pod.node.lost:
            pod.node.free += pod.device_ids
        await self._report_replica(deployment_id, pod, ReplicaState.TERMINATED)

    # -- reports ---------------------------------------------------------------------------

    async def _send(self, report: ReplicaReport | DeploymentReport) -> None:
        """With the cluster's next version; none for a model run by hand, which has no
        deployment to report for until it is adopted."""
        if report.deployment_id.startswith("dgd:"):
            return
        if self._report is not None:  # reports start with `observe`
            await self._report(report.model_copy(update={"version": next(self._versions)}))

    async def _report_inventory(self) -> None:
        nodes = [
            Node.model_construct(
                node_id=n.node_id,
                device_class=n.device_class,
                devices=n.devices,
                device_ids=tuple(n.device_ids),
                topology_domain=n.topology_domain,
            )
            for n in self.nodes
            if not n.lost
        ]
        if self._report is not None:
            await self._report(
                InventoryReport.model_construct(cluster_id=self.cluster_id, nodes=nodes)
            )

    async def _report_sighting(self, key: str, *, gone: bool = False) -> None:
        namespace, name = key.split("/", 1)
        report = DiscoveryReport.model_construct(
            cluster_id=self.cluster_id, namespace=namespace, name=name
        )
        if not gone:
            report = DiscoveryReport.model_construct(
                cluster_id=self.cluster_id,
                namespace=namespace,
                name=name,
                sighting=_sighting(self.foreign[key]),
            )
        if self._report is not None:
            await self._report(report)

    async def _report_replica(self, deployment_id: str, pod: Pod, state: ReplicaState) -> None:
        """Saved first, as a real cluster stores a pod before anyone can watch it: what was
        reported outlives the operator's process."""
        self._save()
        report = ReplicaReport.model_construct(
            cluster_id=self.cluster_id, deployment_id=deployment_id, **_pod(pod), state=state
        )
        await self._send(report)

    async def _report_status(
        self, deployment_id: str, replicas: int, *, short: bool = False, failed: bool = False
    ) -> None:
        status = self._status(deployment_id, replicas, short=short, failed=failed)
        digests = Counter(p.digest for p in self.pods[deployment_id].values())
        report = DeploymentReport.model_construct(
            cluster_id=self.cluster_id,
            deployment_id=deployment_id,
            status=status,
            live_digests=dict(digests),
        )
        await self._send(report)

    def snapshot(self, only: str | None = None) -> list[SyncReport]:
        """Every deployment the cluster was told of (or `only` that one), with all its pods and
        its status, as of one version: what a sync reports. The pods are the saved ones (every
        change is saved before it is reported)."""
        version = next(self._versions)
        # a removed deployment is synced while it has pods, or when asked for (its removal
        # applied after a start): a plane that missed its last pods' ends hears it once more
        told = self.desired.keys() | {d for d, pods in self.pods.items() if pods}
        if only is not None:
            told = {only} & (self.desired.keys() | self.pods.keys())
        deployments = sorted(d for d in told if not d.startswith("dgd:"))
        return [
            SyncReport.model_construct(
                cluster_id=self.cluster_id,
                deployment_id=deployment_id,
                replicas=[
                    SyncedReplica.model_construct(
                        **_pod(p),
                        state=ReplicaState.READY if p.ready else ReplicaState.NOT_READY,
                    )
                    for p in self.pods.get(deployment_id, {}).values()
                ],
                status=self._sync_status(deployment_id),
                version=version,
            )
            for deployment_id in deployments
        ]

    def _sync_status(self, deployment_id: str) -> DeploymentStatus | None:
        """What the last status report said, or would have: none where nothing runs and
        nothing is to be run (removed, read-only, observed)."""
        want = self.desired.get(deployment_id)
        hands_off = want is None or self.read_only or _observed(want)
        if hands_off and not self.pods.get(deployment_id):
            return None
        wanted = self._wanted(deployment_id)
        return self._status(deployment_id, wanted, short=self._short(deployment_id))

    def _wanted(self, deployment_id: str) -> int:
        """How many replicas the deployment should have here: what it asks for when the
        cluster runs it, else (observed, read-only) what runs."""
        want = self.desired.get(deployment_id)
        if want is None:
            return 0
        if _observed(want):
            return len(self.pods.get(deployment_id, {}))
        return int(want["replicas"]) if want["enabled"] else 0

    def _short(self, deployment_id: str) -> bool:
        """Fewer pods of its serving configuration than it should have: no devices for more."""
        want = self.desired.get(deployment_id)
        if want is None or self.read_only or _observed(want):
            return False
        current = [
            p
            for p in self.pods.get(deployment_id, {}).values()
            if p.digest == want["serving_digest"]
        ]
        return len(current) < self._wanted(deployment_id)

    def _status(
        self, deployment_id: str, replicas: int, *, short: bool = False, failed: bool = False
    ) -> DeploymentStatus:
        pods = self.pods.get(deployment_id, {}).values()
        failed = failed or deployment_id in self.failing
        ready = sum(p.ready for p in pods)
        digests = Counter(p.digest for p in pods)
        message = None
        if failed:
            phase, reason = ClusterPhase.FAILED, "ImagePullBackOff"
            message = "the serving image could not be pulled"
        elif short and not pods:
            phase, reason = ClusterPhase.PENDING, "InsufficientDevices"
        elif ready == replicas and len(digests) <= 1 and not short:
            phase, reason = ClusterPhase.READY, None
        else:
            phase, reason = ClusterPhase.PROGRESSING, "InsufficientDevices" if short else None
        return DeploymentStatus.model_construct(
            phase=phase,
            reason=reason,
            message=message,
            ready_replicas=ready,
            desired_replicas=replicas,
        )


def _observed(want: Mapping[str, Any]) -> bool:
    """Whether the plane only observes this deployment here (a render object without an
    authority is managed)."""
    return bool(want.get("authority", Authority.MANAGED) != Authority.MANAGED)


def _sighting(seen: Mapping[str, Any]) -> Sighting:
    """A model run by hand, as kept (and saved) since it started, as a discovery's sighting."""
    components = tuple(DiscoveredComponent.model_construct(**c) for c in seen["components"])
    return Sighting.model_construct(**(dict(seen) | {"components": components}))


def _pod(pod: Pod) -> dict[str, Any]:
    """A pod's fields, as a replica report and a sync list them."""
    return {
        "pod": pod.name,
        "node_id": pod.node.node_id,
        "device_ids": list(pod.device_ids),
        "serving_digest": pod.digest,
        "engine_version": pod.engine_version,
    }


@contextlib.asynccontextmanager
async def simulated_operators(
    nc: nats_bus.Connection,
    clusters: dict[str, list[SimNode]],
    *,
    ready_after: float = 1.0,
    heartbeat_every: float = 5.0,
    state_dir: Path | None = None,
    sync_every: float = 60.0,
    read_only: bool = False,
) -> AsyncIterator[dict[str, SimulatedCluster]]:
    """An operator on a simulated cluster for each entry, for as long as the block runs; with
    `state_dir`, the clusters' pods outlive it; `read_only`, they observe and never write."""
    simulated = {
        cluster_id: SimulatedCluster(
            cluster_id,
            nodes,
            ready_after=ready_after,
            read_only=read_only,
            state_file=state_dir / f"{cluster_id}.json" if state_dir else None,
        )
        for cluster_id, nodes in clusters.items()
    }
    tasks = []
    for cluster_id, cluster in simulated.items():
        options = OperatorOptions(
            cluster_id=cluster_id,
            read_only=read_only,
            simulated=True,
            heartbeat_every=heartbeat_every,
            sync_every=sync_every,
        )
        tasks.append(asyncio.create_task(run_operator(nc, cluster, options), name=cluster_id))
        tasks.append(asyncio.create_task(cluster.serve_faults(nc), name=f"{cluster_id}-faults"))
    try:
        yield simulated
    finally:
        for task in tasks:
            await cancel_and_wait(task)
