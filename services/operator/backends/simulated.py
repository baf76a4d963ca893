"""A simulated cluster: what Kubernetes and Dynamo would do for an operator, with no Kubernetes.

It is an operator backend (`services.operator.runtime.Backend`): it keeps each deployment's
DynamoGraphDeployment as last written, runs its pods on named devices of its nodes the way
Dynamo makes them, and reports what happens: every write it performed or held back (kind
`action`), its inventory, every pod as it starts, becomes ready or not and terminates, and each
deployment's status and live digests. Every report carries the cluster's own ordering
(`version`), as a real cluster's resourceVersion.

A replica is what Dynamo runs of one: an aggregated one is one worker pod, a disaggregated one a
prefill pod and a decode pod; each worker spans `nodes_per_worker` pods on distinct nodes, its
devices split evenly. A replica starts whole or not at all, counts as ready once all its pods
are, and a lost pod takes its replica with it. Replicas that found no devices start as soon as
devices free up.

Rollouts go as Dynamo's do: replicas of the new serving configuration start beside the old ones
while there are devices for them, and the old ones terminate once the new ones are all ready.
When there are no devices for a new replica, an old one is terminated first to make room.

Faults on demand, by request on `wingsmith.sim.<cluster>.fault` (docs/operator.md): a node lost
and restored; pods of a deployment that cannot pull their image, crash-loop or are OOM-killed
(transient: those pods are not ready, the status shows why, the rest serve on); the API server
refusing a deployment's DynamoGraphDeployment (permanent: the cluster phase is `failed`);
`clear` ends them and the deployment recovers by itself.

Models nobody declared, the same way: `{"fault": "run_model", "namespace": NS, "name": NAME,
"model": M, "backend": B, "engine_version": V, "replicas": N, "gpus": G, "args": [...]}` starts
one on the cluster (as if someone had applied a DynamoGraphDeployment by hand), which the
operator reports as discovered; with `"loading": true` its pods stay not ready until
`model_loaded` (namespace, name), as a large model's do while its weights load; `stop_model`
(namespace, name) removes it. Once a deployment
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
from typing import Any, Literal

import orjson
from prometheus_client import CollectorRegistry

from wingsmith.adapters import nats_bus
from wingsmith.domain import names
from wingsmith.domain.cluster import Node
from wingsmith.domain.contracts.reports import (
    ActionReport,
    DeploymentReport,
    DiscoveryReport,
    InventoryReport,
    ReplicaReport,
    ReplicaState,
    SyncedReplica,
    SyncReport,
)
from wingsmith.domain.deployment import (
    MAX_CONDITIONS,
    Authority,
    ClusterPhase,
    DeploymentStatus,
    StatusCondition,
)
from wingsmith.domain.discovery import DiscoveredComponent, Sighting
from wingsmith.domain.values import ServingMode
from wingsmith.services.operator.metrics import OperatorMetrics
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


NAMESPACE = "wingsmith"  # where its DynamoGraphDeployments are, as `wingsmith operator`'s default

# Pod faults a request may ask for, and the reason Kubernetes shows for each.
POD_FAULTS = {
    "image_pull": "ImagePullBackOff",
    "crash_loop": "CrashLoopBackOff",
    "oom_kill": "OOMKilled",
}
_MESSAGES = {  # what a pod shows, as the kubelet words it; `{pod}` is the pod's name
    "ImagePullBackOff": 'Back-off pulling image "{image}"',
    "CrashLoopBackOff": "back-off restarting failed container main in pod {pod}",
    "OOMKilled": "container main in pod {pod} was OOMKilled (exit code 137)",
}
REFUSED = "Invalid"  # the API server's reason for a refusal, unless the request names one
_REASON = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")  # a StatusCondition's reason
Verb = Literal["create", "apply", "delete"]  # the writes it makes (server-side apply)
FAULTS = (
    "node_loss",
    "node_restore",
    *POD_FAULTS,
    "refuse",
    "clear",
    "run_model",
    "model_loaded",
    "stop_model",
)


@dataclass
class PodFault:
    """How the pods of some of a deployment's replicas fail, until it is cleared or the
    deployment's serving configuration changes (a new image, a new engine)."""

    reason: str  # one of POD_FAULTS' values
    message: str  # `{pod}` stands for the pod's name
    digest: str  # the serving configuration whose pods it hits
    replicas: int | None  # how many replicas it hits; None: all of them


@dataclass
class Pod:
    name: str
    node: SimNode
    device_ids: tuple[str, ...]
    digest: str
    engine_version: str
    ready: bool = False
    replica: str = ""  # the replica it is a pod of ("": a replica of its own)
    size: int = 1  # how many pods that replica has
    fault: str | None = None  # why it cannot become ready (a PodFault's reason)

    @property
    def group(self) -> str:
        return self.replica or self.name


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
        namespace: str = NAMESPACE,
    ) -> None:
        """`state_file`: where the cluster keeps its pods, so that they outlive the operator's
        process as a real cluster's do (None: they live as long as this object)."""
        self.cluster_id, self.nodes = cluster_id, nodes
        self.ready_after, self.inventory_every = ready_after, inventory_every
        self.read_only, self.state_file, self.namespace = read_only, state_file, namespace
        self.desired: dict[str, Mapping[str, Any]] = {}
        # deployment id -> the render object its DynamoGraphDeployment was last written from
        self.written: dict[str, Mapping[str, Any]] = {}
        self.pods: dict[str, dict[str, Pod]] = {}  # deployment id -> pod name -> pod
        self.faults: dict[str, PodFault] = {}  # deployment id -> how some of its pods fail
        self.refused: dict[str, tuple[str, str]] = {}  # deployment id -> (reason, message)
        self.foreign: dict[str, dict[str, Any]] = {}  # `ns/name` -> sighting of a model run by hand
        self.loading: set[str] = set()  # pods of such models not ready until `model_loaded`
        # Pod names and report versions go on across restarts, as a real cluster's do: a new
        # start neither reuses a name nor orders its reports before the last start's.
        self._instance = uuid.uuid4().hex[:5]
        self._names = itertools.count()
        self._versions = itertools.count(time.time_ns() // 1000)
        self._later: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._report: Report | None = None
        self._held: dict[str, ActionReport] = {}  # deployment id -> the write last held back
        self._freed = False  # devices were freed since the short deployments last tried
        self._load()

    # -- the backend ---------------------------------------------------------------------

    async def apply(self, deployment_id: str, desired: Mapping[str, Any] | None) -> None:
        """Write the deployment's DynamoGraphDeployment and run what it says; a write the
        operator may not make (read-only, an observed deployment) or the API server refuses is
        held back and reported so, and what runs stays as it is."""
        async with self._lock:
            if desired is None:
                removed = self.desired.pop(deployment_id, None)
                if removed is not None and _adopted_key(removed) in self.foreign:
                    # what was adopted was never ours: it keeps running, as before adoption
                    self.written.pop(deployment_id, None)
                    self.pods[f"dgd:{_adopted_key(removed)}"] = self.pods.pop(deployment_id, {})
                    self._save()
                    await self._report_inventory()
                    return
            else:
                self.desired[deployment_id] = desired
                await self._adopt(deployment_id, desired)
            await self._write(deployment_id)
            await self._reconcile(deployment_id)
            await self._catch_up()
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
                deployment_id: [_saved(p) for p in pods.values()]
                for deployment_id, pods in self.pods.items()
            },
            "written": self.written,
            "faults": {d: vars(f) for d, f in self.faults.items()},
            "refused": self.refused,
            "foreign": self.foreign,
            "lost": [n.node_id for n in self.nodes if n.lost],
        }
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_file.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps(state))
        temporary.replace(self.state_file)

    def _load(self) -> None:
        """Pods on nodes the spec no longer has, or on devices it no longer has, are gone, and
        so is the rest of their replica."""
        if self.state_file is None or not self.state_file.exists():
            return
        state = orjson.loads(self.state_file.read_bytes())
        nodes = {n.node_id: n for n in self.nodes}
        for each in self.nodes:  # the saved state is the whole truth
            each.free, each.lost = list(each.device_ids), False
        for node_id in state.get("lost", []):
            if node_id in nodes:
                nodes[node_id].lost = True
        self.written = dict(state.get("written", {}))
        self.faults = {d: PodFault(**f) for d, f in state.get("faults", {}).items()}
        for deployment_id, digest in state.get("failing", {}).items():  # an older state file
            message = _MESSAGES["ImagePullBackOff"]
            self.faults[deployment_id] = PodFault("ImagePullBackOff", message, digest, None)
        self.refused = {d: (r, m) for d, (r, m) in state.get("refused", {}).items()}
        self.foreign = dict(state.get("foreign", {}))
        for deployment_id, pods in state.get("pods", {}).items():
            for saved in pods:
                node = nodes.get(saved["node"])
                if node is None or node.lost or not set(saved["device_ids"]) <= set(node.free):
                    continue
                node.free = [d for d in node.free if d not in saved["device_ids"]]
                pod = Pod(**(saved | {"node": node, "device_ids": tuple(saved["device_ids"])}))
                self.pods.setdefault(deployment_id, {})[pod.name] = pod
            for group in self._replicas(deployment_id):
                if len(group) < group[0].size:
                    for pod in group:
                        pod.node.free += pod.device_ids
                        del self.pods[deployment_id][pod.name]

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
                reply: dict[str, Any] = {"ok": True}
            elif fault in POD_FAULTS or fault in {"refuse", "clear"}:
                try:
                    reply = await self._deployment_fault(fault, request)
                except ValueError as e:  # checked before anything changed
                    return {"ok": False, "error": str(e)}
            elif fault in {"run_model", "stop_model"}:
                reply = await self._foreign_model(request, run=fault == "run_model")
            elif fault == "model_loaded":
                reply = await self._model_loaded(request)
            else:
                return {"ok": False, "error": f"fault: one of {', '.join(FAULTS)}"}
            await self._catch_up()
            self._save()
        return reply

    async def _deployment_fault(self, fault: str, request: Mapping[str, Any]) -> dict[str, Any]:
        """A fault of one deployment's: its pods' (which need it to be known here), the API
        server's refusal (which may come first), or their end."""
        deployment_id = request.get("deployment_id")
        if not isinstance(deployment_id, str) or not deployment_id:
            return {"ok": False, "error": "deployment_id: the deployment the fault is for"}
        known = deployment_id in self.desired
        if fault == "refuse":
            self.refused[deployment_id] = _refusal(request)
        elif fault == "clear":
            if not (known or deployment_id in self.refused or deployment_id in self.faults):
                return {"ok": False, "error": f"deployment_id: unknown {deployment_id!r}"}
            self.faults.pop(deployment_id, None)
            self.refused.pop(deployment_id, None)
            await self._unmark(deployment_id)
            await self._write(deployment_id)  # what was held back goes through now
        elif not known:
            return {"ok": False, "error": f"deployment_id: unknown {deployment_id!r}"}
        else:
            self.faults[deployment_id] = _pod_fault(fault, self.desired[deployment_id], request)
            await self._unmark(deployment_id)  # a new fault takes the last one's place
            await self._mark(deployment_id, at_once=True)
        await self._reconcile(deployment_id)
        return {"ok": True}

    async def _mark(self, deployment_id: str, *, at_once: bool = False) -> None:
        """Hit as many replicas as the deployment's pod fault asks for, oldest first: any of
        them when the fault is asked for (`at_once`), later only ones that are not serving, so
        that a fault never moves on to a replica that serves."""
        fault = self.faults.get(deployment_id)
        if fault is None:
            return
        groups = self._replicas(deployment_id)
        hit = sum(any(p.fault for p in g) for g in groups)
        wanted = len(groups) if fault.replicas is None else fault.replicas
        for group in groups:
            if hit >= wanted:
                break
            if group[0].digest != fault.digest or any(p.fault for p in group):
                continue
            if not at_once and all(p.ready for p in group):
                continue
            hit += 1
            for pod in group:
                pod.fault = fault.reason
                if pod.ready:
                    pod.ready = False
                    await self._report_replica(deployment_id, pod, ReplicaState.NOT_READY)

    async def _unmark(self, deployment_id: str) -> None:
        """The fault is over: its pods become ready as a started pod does."""
        for pod in self.pods.get(deployment_id, {}).values():
            if pod.fault is not None:
                pod.fault = None
                self._later_ready(deployment_id, pod)

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
            await self._report_inventory()
            return {"ok": True}
        if key in self.foreign:
            return {"ok": False, "error": f"name: {key!r} runs already"}
        replicas, gpus = int(request.get("replicas", 1)), int(request.get("gpus", 1))
        loading = request.get("loading", False)
        if not isinstance(loading, bool):
            return {"ok": False, "error": "loading: true or false"}
        want = {
            "workload_id": name,
            "device_class": self.nodes[0].device_class,
            "serving": {"devices_per_replica": gpus, "engine_version": request["engine_version"]},
            "serving_digest": "worker",  # names its pods <name>-worker-…
        }
        self.pods.setdefault(owner, {})
        started: list[list[Pod]] = []
        for _ in range(replicas):
            new = await self._start_replica(owner, want)
            if new is None:
                for each in started:  # all or nothing
                    await self._terminate_replica(owner, each)
                return {"ok": False, "error": "replicas: not enough free devices"}
            started.append(new)
        if loading:
            self.loading.update(pod.name for each in started for pod in each)
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
        await self._report_inventory()
        return {"ok": True}

    async def _model_loaded(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A model run by hand with `loading` has loaded: its pods are ready now, whichever
        deployment holds them."""
        key = f"{request.get('namespace') or 'default'}/{request.get('name')}"
        if key not in self.foreign:
            return {"ok": False, "error": f"name: no model {key!r} runs here"}
        for deployment_id, pods in list(self.pods.items()):
            for pod in [p for p in pods.values() if p.name in self.loading]:
                self.loading.discard(pod.name)
                await self._ready(deployment_id, pod)
        return {"ok": True}

    async def _adopt(self, deployment_id: str, want: Mapping[str, Any]) -> None:
        """A deployment adopted a model run by hand: its pods are that deployment's now, running
        the configuration the deployment says they run, and its DynamoGraphDeployment is as
        the deployment declares it (nothing to write)."""
        key = _adopted_key(want)
        pods = self.pods.pop(f"dgd:{key}", None)
        if pods is None:
            return
        self.pods[deployment_id] = pods
        self.written[deployment_id] = want
        for pod in pods.values():
            pod.digest = want["serving_digest"]
            state = ReplicaState.READY if pod.ready else ReplicaState.STARTED
            await self._report_replica(deployment_id, pod, state)
        await self._report_status(deployment_id)
        await self._report_inventory()  # its devices are no longer held outside Wingsmith

    async def _set_lost(self, node: SimNode, lost: bool) -> None:
        """A lost node takes its pods with it, and every replica one of them was part of."""
        node.lost = lost
        if lost:
            for deployment_id, pods in self.pods.items():
                hit = {p.group for p in pods.values() if p.node is node}
                for pod in [p for p in pods.values() if p.group in hit]:
                    await self._terminate(deployment_id, pod)
            node.free = list(node.device_ids)
        await self._report_inventory()
        for deployment_id in list(self.desired):
            await self._reconcile(deployment_id)

    # -- writing -------------------------------------------------------------------------

    async def _write(self, deployment_id: str) -> None:
        """Bring the deployment's DynamoGraphDeployment to its render object, as an operator
        writes one, or hold the write back: read-only, observed, or refused by the API server
        (a deletion never is). An adopted graph is never created or deleted, only changed."""
        desired, written = self.desired.get(deployment_id), self.written.get(deployment_id)
        verb: Verb
        if desired is None:
            if written is None:
                return
            if written.get("adopted"):
                del self.written[deployment_id]  # it was never ours to delete
                return
            verb, why, source = "delete", "the deployment was removed", written
        elif written is None:
            if desired.get("adopted"):
                return  # not on the cluster: nothing to change
            verb, why, source = "create", "no DynamoGraphDeployment yet", desired
        elif _spec(written) == _spec(desired):
            return  # up to date
        else:
            verb, why, source = "apply", "it differs from the desired state", desired
        held = self._held_back(deployment_id, desired)
        if held is not None:
            await self._act(deployment_id, verb, source, performed=False, reason=held)
            return
        if desired is None:
            del self.written[deployment_id]
        else:
            self.written[deployment_id] = desired
        await self._act(deployment_id, verb, source, performed=True, reason=why)

    def _held_back(self, deployment_id: str, desired: Mapping[str, Any] | None) -> str | None:
        """Why a write for the deployment is not made, or None if it is."""
        if self.read_only:
            return "read-only mode"
        if desired is None:
            return None
        if _observed(desired):
            return "observed"
        refused = self.refused.get(deployment_id)
        return f"refused: {refused[0]}: {refused[1]}" if refused else None

    async def _act(
        self,
        deployment_id: str,
        verb: Verb,
        source: Mapping[str, Any],
        *,
        performed: bool,
        reason: str,
    ) -> None:
        """Report a write, or one held back: the same one held back again is reported once."""
        target = source.get("adopted") or {
            "namespace": self.namespace,
            "name": source["workload_id"],
        }
        report = ActionReport.model_construct(
            cluster_id=self.cluster_id,
            deployment_id=deployment_id,
            verb=verb,
            namespace=target["namespace"],
            name=target["name"],
            performed=performed,
            reason=reason[:256],
        )
        if performed:
            self._held.pop(deployment_id, None)
        elif self._held.get(deployment_id) == report:
            return
        else:
            self._held[deployment_id] = report
        what = verb if performed else f"would {verb}"
        log.info(
            "%s: %s DynamoGraphDeployment %s/%s (%s)",
            deployment_id,
            what,
            report.namespace,
            report.name,
            reason,
        )
        if self._report is not None:  # reports start with `observe`
            await self._report(report)

    # -- reconciling ---------------------------------------------------------------------

    async def _reconcile(self, deployment_id: str) -> None:
        """Run what the deployment's DynamoGraphDeployment says, as far as there are devices."""
        desired = self.desired.get(deployment_id)
        if deployment_id.startswith("dgd:"):
            return  # a model run by hand: not the plane's
        if self.read_only or (desired is not None and _observed(desired)):
            # read-only, or observed: nothing on the cluster changes, but what runs there still
            # does (a pod became ready) and is reported as it is
            if desired is not None and self.pods.get(deployment_id):
                await self._report_status(deployment_id)
            return
        want = self.written.get(deployment_id)
        self.pods.setdefault(deployment_id, {})
        replicas = want["replicas"] if want and want["enabled"] else 0
        digest = want["serving_digest"] if want else None
        fault = self.faults.get(deployment_id)
        if fault is not None and fault.digest != digest and digest is not None:
            del self.faults[deployment_id]  # a new serving configuration: a new image, engine
            await self._unmark(deployment_id)
        current = [g for g in self._replicas(deployment_id) if g[0].digest == digest]
        old = [g for g in self._replicas(deployment_id) if g[0].digest != digest]
        for group in current[replicas:]:
            await self._terminate_replica(deployment_id, group)
        missing = replicas - len(current)
        while missing > 0 and want is not None:
            if await self._start_replica(deployment_id, want) is not None:
                missing -= 1
            elif old:  # no devices for it: an old replica makes room
                await self._terminate_replica(deployment_id, old.pop(0))
            else:
                break  # short of devices: it stays short until devices free up
        await self._mark(deployment_id)
        new = [g for g in self._replicas(deployment_id) if g[0].digest == digest]
        if len(new) >= replicas and all(p.ready for g in new for p in g):
            for group in old:  # the new generation serves in full: the old one goes
                await self._terminate_replica(deployment_id, group)
        if desired is not None or self.pods[deployment_id]:
            await self._report_status(deployment_id)

    async def _catch_up(self) -> None:
        """Devices freed up: the deployments short of them try again, until none frees more."""
        while self._freed:
            self._freed = False
            for deployment_id in list(self.desired):
                if self._short(deployment_id):
                    await self._reconcile(deployment_id)

    async def _start_replica(self, deployment_id: str, want: Mapping[str, Any]) -> list[Pod] | None:
        """Start one replica's pods, all or none: a worker pod, or a prefill and a decode pod
        when disaggregated, each worker on `nodes_per_worker` distinct nodes with its devices
        split evenly between them. None when there are no devices for all of them."""
        serving = want["serving"]
        roles = ("prefill", "decode") if serving.get("mode") == ServingMode.DISAGGREGATED else ("",)
        spread = int(want.get("nodes_per_worker") or 1)
        per_pod = max(1, int(serving["devices_per_replica"]) // len(roles) // spread)
        nodes = self._place(want["device_class"], len(roles), spread, per_pod)
        if nodes is None:
            return None
        replica = (
            f"{want['workload_id']}-{want['serving_digest'][-6:]}-{self._instance}"
            f"{next(self._names)}"
        )
        pod_names = [
            "-".join(filter(None, (replica, role, str(i) if spread > 1 else "")))
            for role in roles
            for i in range(spread)
        ]
        started = []
        for name, node in zip(pod_names, nodes, strict=True):
            devices, node.free = tuple(node.free[:per_pod]), node.free[per_pod:]
            pod = Pod(
                name,
                node,
                devices,
                want["serving_digest"],
                serving["engine_version"],
                replica=replica,
                size=len(pod_names),
            )
            self.pods[deployment_id][name] = pod
            started.append(pod)
        for pod in started:
            await self._report_replica(deployment_id, pod, ReplicaState.STARTED)
            self._later_ready(deployment_id, pod)
        return started

    def _place(
        self, device_class: str, workers: int, spread: int, per_pod: int
    ) -> list[SimNode] | None:
        """A node for each of the workers' pods, first fit, each worker's on distinct nodes;
        None when they do not all fit."""
        free = {
            n.node_id: len(n.free)
            for n in self.nodes
            if not n.lost and n.device_class == device_class
        }
        chosen: list[SimNode] = []
        for _ in range(workers):
            fits = [n for n in self.nodes if free.get(n.node_id, 0) >= per_pod][:spread]
            if len(fits) < spread:
                return None
            for node in fits:
                free[node.node_id] -= per_pod
            chosen += fits
        return chosen

    def _later_ready(self, deployment_id: str, pod: Pod) -> None:
        task = asyncio.create_task(self._become_ready(deployment_id, pod))
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _become_ready(self, deployment_id: str, pod: Pod) -> None:
        await asyncio.sleep(self.ready_after)
        async with self._lock:
            # under its deployment, or the one that adopted it meanwhile; else terminated
            owners = [d for d, pods in self.pods.items() if pods.get(pod.name) is pod]
            if not owners or pod.ready or pod.fault is not None or pod.name in self.loading:
                return  # gone, ready already, failing until its fault is cleared, or loading
            await self._ready(owners[0], pod)
            await self._catch_up()
            self._save()

    async def _ready(self, deployment_id: str, pod: Pod) -> None:
        pod.ready = True
        await self._report_replica(deployment_id, pod, ReplicaState.READY)
        await self._reconcile(deployment_id)

    async def _terminate(self, deployment_id: str, pod: Pod) -> None:
        del self.pods[deployment_id][pod.name]
        self.loading.discard(pod.name)
        if not pod.node.lost:
            pod.node.free += pod.device_ids
            self._freed = True
        await self._report_replica(deployment_id, pod, ReplicaState.TERMINATED)

    async def _terminate_replica(self, deployment_id: str, group: list[Pod]) -> None:
        for pod in group:
            await self._terminate(deployment_id, pod)

    def _replicas(self, deployment_id: str) -> list[list[Pod]]:
        """The deployment's replicas, each its pods, oldest first."""
        groups: dict[str, list[Pod]] = {}
        for pod in self.pods.get(deployment_id, {}).values():
            groups.setdefault(pod.group, []).append(pod)
        return list(groups.values())

    # -- reports ---------------------------------------------------------------------------

    async def _send(self, report: ReplicaReport | DeploymentReport) -> None:
        """With the cluster's next version; none for a model run by hand, which has no
        deployment to report for until it is adopted."""
        if report.deployment_id.startswith("dgd:"):
            return
        if self._report is not None:  # reports start with `observe`
            await self._report(report.model_copy(update={"version": next(self._versions)}))

    async def _report_inventory(self) -> None:
        """Every node not lost, and the devices models run by hand (not adopted) hold there:
        held outside Wingsmith."""
        outside: Counter[str] = Counter()
        for owner, pods in self.pods.items():
            if owner.startswith("dgd:"):
                for pod in pods.values():
                    outside[pod.node.node_id] += len(pod.device_ids)
        nodes = []
        for n in self.nodes:
            if n.lost:
                continue
            held: dict[str, Any] = (
                {"held_outside": outside[n.node_id]} if n.node_id in outside else {}
            )
            nodes.append(
                Node.model_construct(
                    node_id=n.node_id,
                    device_class=n.device_class,
                    devices=n.devices,
                    device_ids=tuple(n.device_ids),
                    topology_domain=n.topology_domain,
                    **held,
                )
            )
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

    async def _report_status(self, deployment_id: str) -> None:
        """The deployment's status, and how many replicas run each serving configuration."""
        digests = Counter(g[0].digest for g in self._replicas(deployment_id))
        report = DeploymentReport.model_construct(
            cluster_id=self.cluster_id,
            deployment_id=deployment_id,
            status=self._status(deployment_id),
            live_digests=dict(digests),
        )
        await self._send(report)

    def readiness(self) -> dict[str, bool]:
        """Nothing to wait for: the simulated cluster is in memory from the start."""
        return {}

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
        if (want is None or self._hands_off(want)) and not self.pods.get(deployment_id):
            return None
        return self._status(deployment_id)

    def _hands_off(self, want: Mapping[str, Any]) -> bool:
        """Whether the cluster runs what it has of the deployment without writing for it."""
        return self.read_only or _observed(want)

    def _wanted(self, deployment_id: str) -> int:
        """How many replicas the deployment should have here: what it asks for when the
        cluster runs it, else (observed) what runs."""
        want = self.desired.get(deployment_id)
        if want is None:
            return 0
        if _observed(want):
            return len(self._replicas(deployment_id))
        return int(want["replicas"]) if want["enabled"] else 0

    def _short(self, deployment_id: str) -> bool:
        """Fewer replicas of its serving configuration than its DynamoGraphDeployment says:
        no devices for more."""
        want = self.desired.get(deployment_id)
        written = self.written.get(deployment_id)
        if want is None or written is None or self._hands_off(want):
            return False
        replicas = int(written["replicas"]) if written["enabled"] else 0
        digest = written["serving_digest"]
        current = sum(g[0].digest == digest for g in self._replicas(deployment_id))
        return bool(current < replicas)

    def _status(self, deployment_id: str) -> DeploymentStatus:
        """Ready replicas count whole replicas (every pod of one ready). A refusal is the
        phase `failed`; pods that fail are conditions beside the phase the replicas give."""
        replicas, short = self._wanted(deployment_id), self._short(deployment_id)
        groups = self._replicas(deployment_id)
        ready = sum(all(p.ready for p in g) for g in groups)
        want = self.desired.get(deployment_id)
        refused = None if want is None or self._hands_off(want) else self.refused.get(deployment_id)
        conditions = self._conditions(deployment_id, refused)
        message = None
        if refused is not None:
            phase, (reason, message) = ClusterPhase.FAILED, refused
        elif short and not groups:
            phase, reason = ClusterPhase.PENDING, "InsufficientDevices"
        elif ready == replicas and len({g[0].digest for g in groups}) <= 1 and not short:
            phase, reason = ClusterPhase.READY, None
        else:
            phase, reason = ClusterPhase.PROGRESSING, "InsufficientDevices" if short else None
        if reason is None and conditions:
            reason, message = conditions[0].reason, conditions[0].message
        return DeploymentStatus.model_construct(
            phase=phase,
            reason=reason,
            message=message,
            ready_replicas=ready,
            desired_replicas=replicas,
            conditions=tuple(conditions),
        )

    def _conditions(
        self, deployment_id: str, refused: tuple[str, str] | None
    ) -> list[StatusCondition]:
        """The refusal (of the graph itself), and each way its pods fail, with how many do."""
        conditions = []
        if refused is not None:
            conditions.append(
                StatusCondition.model_construct(
                    reason=refused[0], message=refused[1], permanent=True, pods=0
                )
            )
        failing: dict[str, list[Pod]] = {}
        for pod in self.pods.get(deployment_id, {}).values():
            if pod.fault is not None and not pod.ready:
                failing.setdefault(pod.fault, []).append(pod)
        fault = self.faults.get(deployment_id)
        for reason, pods in failing.items():
            template = fault.message if fault and fault.reason == reason else reason
            conditions.append(
                StatusCondition.model_construct(
                    reason=reason,
                    message=template.replace("{pod}", pods[0].name),
                    permanent=False,
                    pods=len(pods),
                )
            )
        return conditions[:MAX_CONDITIONS]


def _observed(want: Mapping[str, Any]) -> bool:
    """Whether the plane only observes this deployment here (a render object without an
    authority is managed)."""
    return bool(want.get("authority", Authority.MANAGED) != Authority.MANAGED)


def _spec(want: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a render object its DynamoGraphDeployment shows: a write is needed when this
    differs (the authority, say, is the plane's own)."""
    return (
        want["serving_digest"],
        tuple(want.get("engine_args") or ()),
        want["replicas"],
        want["enabled"],
        want.get("nodes_per_worker", 1),
    )


def _pod_fault(fault: str, want: Mapping[str, Any], request: Mapping[str, Any]) -> PodFault:
    """A pod fault as asked for, on the deployment's serving configuration."""
    replicas = request.get("replicas")
    if replicas is not None and (type(replicas) is not int or replicas < 1):
        raise ValueError("replicas: how many of the deployment's replicas, at least 1")
    serving = want["serving"]
    image = serving.get("image") or (
        f"nvcr.io/nvidia/ai-dynamo/{serving.get('backend')}-runtime:{serving['engine_version']}"
    )
    reason = POD_FAULTS[fault]
    message = _MESSAGES[reason].replace("{image}", image)
    return PodFault(reason, message, want["serving_digest"], replicas)


def _refusal(request: Mapping[str, Any]) -> tuple[str, str]:
    """The API server's reason and message for a refusal, as asked for."""
    reason = request.get("reason") or REFUSED
    message = request.get("message") or (
        'admission webhook "vdynamographdeployment.kb.io" denied the request (simulated)'
    )
    if not isinstance(reason, str) or not _REASON.match(reason):
        raise ValueError("reason: a word such as Invalid or Forbidden, at most 64 characters")
    if not isinstance(message, str) or len(message) > 1024:
        raise ValueError("message: text of at most 1024 characters")
    return reason, message


def _saved(pod: Pod) -> dict[str, Any]:
    """A pod as the state file keeps it."""
    return {
        "name": pod.name,
        "node": pod.node.node_id,
        "device_ids": list(pod.device_ids),
        "digest": pod.digest,
        "engine_version": pod.engine_version,
        "ready": pod.ready,
        "replica": pod.replica,
        "size": pod.size,
        "fault": pod.fault,
    }


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
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[dict[str, SimulatedCluster]]:
    """An operator on a simulated cluster for each entry, for as long as the block runs; with
    `state_dir`, the clusters' pods outlive it; `read_only`, they observe and never write;
    their metrics in `registry`, if given."""
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
        metrics = OperatorMetrics(cluster_id, registry)
        operator = run_operator(nc, cluster, options, metrics=metrics)
        tasks.append(asyncio.create_task(operator, name=cluster_id))
        tasks.append(asyncio.create_task(cluster.serve_faults(nc), name=f"{cluster_id}-faults"))
    try:
        yield simulated
    finally:
        for task in tasks:
            await cancel_and_wait(task)
