"""A simulated cluster: what an operator and its Kubernetes cluster would do, with no Kubernetes.

It reads its render commands (`wingsmith.render.<cluster>.>`, from the latest desired state of
each deployment on), runs pods on named devices of its nodes, and reports what happens on
`wingsmith.obs.<cluster>.<kind>`: its inventory, every replica as it starts, becomes ready and
terminates, and each deployment's status and live digests.

Rollouts go as Dynamo's do: replicas of the new serving configuration start beside the old ones
while there are devices for them, and the old ones terminate once the new ones are all ready.
When there are no devices for a new replica, an old one is terminated first to make room.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from nats.nuid import NUID

from adapters import nats_bus

log = logging.getLogger(__name__)


@dataclass
class SimNode:
    node_id: str
    device_class: str
    devices: int
    topology_domain: str | None = None
    free: list[str] = field(init=False)  # device UUIDs no pod holds

    def __post_init__(self) -> None:
        self.device_ids = [f"GPU-{self.node_id}-{i}" for i in range(self.devices)]
        self.free = list(self.device_ids)


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
        nc: nats_bus.Connection,
        cluster_id: str,
        nodes: list[SimNode],
        *,
        ready_after: float = 0.3,
    ) -> None:
        self.nc, self.cluster_id, self.nodes = nc, cluster_id, nodes
        self.ready_after = ready_after
        self.desired: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Pod]] = {}  # deployment id -> pod name -> pod
        self._names = itertools.count()
        self._later: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._nuid = NUID()

    async def run(self) -> None:
        await self._report("inventory", {"nodes": [self._node(n) for n in self.nodes]})
        subject = f"{nats_bus.RENDER_PREFIX}.{self.cluster_id}.>"
        try:
            stream = nats_bus.read_stream(
                self.nc, nats_bus.RENDER_STREAM, subject, follow=True, start="last"
            )
            async for message in stream:
                deployment_id = message.subject.split(".", 3)[3]
                if message.headers.get(nats_bus.DELETED_HEADER):
                    self.desired.pop(deployment_id, None)
                else:
                    self.desired[deployment_id] = orjson.loads(message.data)
                await self.reconcile(deployment_id)
        finally:
            for task in self._later:
                task.cancel()

    async def reconcile(self, deployment_id: str) -> None:
        async with self._lock:
            await self._reconcile(deployment_id)

    async def _reconcile(self, deployment_id: str) -> None:
        want = self.desired.get(deployment_id)
        pods = self.pods.setdefault(deployment_id, {})
        replicas = want["replicas"] if want and want["enabled"] else 0
        digest = want["serving_digest"] if want else None
        current = [p for p in pods.values() if p.digest == digest]
        old = [p for p in pods.values() if p.digest != digest]
        for pod in current[replicas:]:
            await self._terminate(deployment_id, pod)
        missing = replicas - len(current)
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
        await self._report_status(deployment_id, replicas, short=missing > 0)

    async def _start(self, deployment_id: str, want: dict[str, Any]) -> Pod | None:
        per = want["serving"]["devices_per_replica"]
        node = next(
            (
                n
                for n in self.nodes
                if n.device_class == want["device_class"] and len(n.free) >= per
            ),
            None,
        )
        if node is None:
            return None
        devices, node.free = tuple(node.free[:per]), node.free[per:]
        pod = Pod(
            f"{deployment_id}-{want['serving_digest'][-6:]}-{next(self._names)}",
            node,
            devices,
            want["serving_digest"],
            want["serving"]["engine_version"],
        )
        self.pods[deployment_id][pod.name] = pod
        await self._report_replica(deployment_id, pod, "started")
        task = asyncio.create_task(self._become_ready(deployment_id, pod))
        self._later.add(task)
        task.add_done_callback(self._later.discard)
        return pod

    async def _become_ready(self, deployment_id: str, pod: Pod) -> None:
        await asyncio.sleep(self.ready_after)
        async with self._lock:
            if pod.name not in self.pods.get(deployment_id, {}):
                return  # terminated meanwhile
            pod.ready = True
            await self._report_replica(deployment_id, pod, "ready")
            await self._reconcile(deployment_id)

    async def _terminate(self, deployment_id: str, pod: Pod) -> None:
        del self.pods[deployment_id][pod.name]
        pod.node.free += pod.device_ids
        await self._report_replica(deployment_id, pod, "terminated")

    # -- reports ---------------------------------------------------------------------------

    async def _report_replica(self, deployment_id: str, pod: Pod, state: str) -> None:
        await self._report(
            "replica",
            {
                "deployment_id": deployment_id,
                "pod": pod.name,
                "node_id": pod.node.node_id,
                "device_ids": list(pod.device_ids),
                "serving_digest": pod.digest,
                "engine_version": pod.engine_version,
                "state": state,
            },
        )

    async def _report_status(self, deployment_id: str, replicas: int, *, short: bool) -> None:
        pods = self.pods[deployment_id].values()
        ready = sum(p.ready for p in pods)
        digests = Counter(p.digest for p in pods)
        if short and not pods:
            phase, reason = "pending", "InsufficientDevices"
        elif ready == replicas and len(digests) <= 1 and not short:
            phase, reason = "ready", None
        else:
            phase, reason = "progressing", "InsufficientDevices" if short else None
        status = {
            "phase": phase,
            "reason": reason,
            "ready_replicas": ready,
            "desired_replicas": replicas,
        }
        await self._report(
            "deployment",
            {"deployment_id": deployment_id, "status": status, "live_digests": dict(digests)},
        )

    async def _report(self, kind: str, payload: dict[str, Any]) -> None:
        msg_id = f"{self.cluster_id}:{kind}:{self._nuid.next().decode()}"
        await nats_bus.publish_observation(
            self.nc, self.cluster_id, kind, {"cluster_id": self.cluster_id} | payload, msg_id
        )

    @staticmethod
    def _node(node: SimNode) -> dict[str, Any]:
        return {
            "node_id": node.node_id,
            "device_class": node.device_class,
            "devices": node.devices,
            "device_ids": node.device_ids,
            "topology_domain": node.topology_domain,
        }
