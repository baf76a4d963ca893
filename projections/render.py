"""Render objects: what an operator reconciles, one per deployment.

Key: `<cluster>.<deployment>`, published on `wingsmith.render.<cluster>.<deployment>` (stream
`WINGSMITH_RENDER`, the latest value per subject). A managed deployment appears once admission
has granted it devices, with as many replicas as the grant covers; every later change to what
should run there (scale, serving configuration, engine arguments, enabling) publishes the whole
object again. Disabling renders zero replicas: the operator scales to zero and keeps the
DynamoGraphDeployment. So does a failure the cluster reports: it releases the grant, and the
deployment runs again once admission has started over. Deleting removes the view: the operator
deletes what it rendered (an adopted DynamoGraphDeployment is left alone).

An observed deployment (adopted from a DynamoGraphDeployment the plane did not render) appears
at once with `authority: observed` and the object it was adopted from, so the operator can
report its replicas; the operator never writes for it. Once promoted, it stays as it was until
admission has granted what it runs, so the first managed render asks for what already runs.

`nodes_per_worker` is how many nodes one engine worker spans on its cluster, as admission counts
it (domain/nodes.py): from the largest node of the deployment's device class in the cluster's
latest inventory, so a node coming or going changes it only when the largest size changes, and
then only the render objects whose span it changes are published again. While no node of the
class could hold a pod of the worker (admission grants nothing then), the span stays as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from wingsmith.domain.cluster import InventoryReported
from wingsmith.domain.contracts.render import RenderDocument
from wingsmith.domain.deployment import (
    AdmissionDecided,
    AdmissionPhase,
    Authority,
    AuthorityPromoted,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentDisabled,
    DeploymentEnabled,
    DeploymentFailed,
    DeploymentScaled,
    EngineArgsSet,
    ServingConfigAmended,
    ServingConfigChanged,
)
from wingsmith.domain.nodes import span, worker_devices
from wingsmith.projections.base import Keys, Projection, View, handles

E = Mapping[str, Any]


class Render(Projection):
    name = "render"

    def __init__(self) -> None:
        super().__init__()
        self.desired: dict[str, dict[str, Any]] = {}  # deployment id -> what should run
        self.largest: dict[str, dict[str, int]] = {}  # cluster -> device class -> node devices
        self.on_cluster: dict[str, dict[str, bool]] = {}  # cluster -> its deployment ids

    @handles(InventoryReported)
    def _inventory(self, cluster_id: str, e: E) -> Keys:
        """Render again only the deployments whose span the largest nodes change."""
        largest: dict[str, int] = {}
        for node in e["nodes"]:
            device_class = node["device_class"]
            largest[device_class] = max(largest.get(device_class, 0), node["devices"])
        if largest == self.largest.get(cluster_id, {}):
            return ()
        self.largest[cluster_id] = largest
        changed: list[str] = []
        for deployment_id in self.on_cluster.get(cluster_id, {}):
            d = self.desired[deployment_id]
            if self._span(d) != d.get("nodes_per_worker", 1):
                changed += self._set(deployment_id)
        return changed

    @handles(DeploymentCreated)
    def _created(self, deployment_id: str, e: E) -> Keys:
        self.desired[deployment_id] = {
            "deployment_id": deployment_id,
            "workload_id": e["workload_id"],
            "cluster_id": e["cluster_id"],
            "project": e["project"],
            "device_class": e["device_class"],
            "generation": 1,
            "serving": e["serving"],
            "serving_digest": e["serving_digest"],
            "engine_args": list(e["engine_args"]),
            "desired_replicas": e["desired_replicas"],
            "granted_devices": 0,
            "enabled": True,
            "managed": e["authority"] == Authority.MANAGED,
            "admitted": False,
            "adopted": e.get("adopted"),
            "promoting": False,  # promoted, and not admitted since
            "nodes_per_worker": 1,
        }
        self.on_cluster.setdefault(e["cluster_id"], {})[deployment_id] = True
        return () if self.desired[deployment_id]["managed"] else self._set(deployment_id)

    @handles(AdmissionDecided)
    def _admission(self, deployment_id: str, e: E) -> Keys:
        admitted = e["phase"] != AdmissionPhase.PENDING  # in whole, or in part
        fields: dict[str, Any] = {"granted_devices": e.get("devices", 0), "admitted": admitted}
        if admitted:
            fields["promoting"] = False
        return self._set(deployment_id, **fields)

    @handles(DeploymentFailed)
    def _failed(self, deployment_id: str, e: E) -> Keys:
        """A failure releases the grant: nothing runs until admission starts over."""
        return self._set(deployment_id, granted_devices=0, admitted=False)

    @handles(DeploymentScaled)
    def _scaled(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, desired_replicas=e["desired_replicas"])

    @handles(ServingConfigChanged)
    def _serving(self, deployment_id: str, e: E) -> Keys:
        return self._set(
            deployment_id,
            generation=e["generation"],
            serving=e["serving"],
            serving_digest=e["serving_digest"],
        )

    @handles(ServingConfigAmended)
    def _amended(self, deployment_id: str, e: E) -> Keys:
        """Same generation and digest: the operator re-renders the pods, nothing rolls out."""
        return self._set(deployment_id, serving=e["serving"])

    @handles(EngineArgsSet)
    def _engine_args(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, engine_args=list(e["engine_args"]))

    @handles(DeploymentEnabled)
    def _enabled(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, enabled=True)

    @handles(DeploymentDisabled)
    def _disabled(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, enabled=False)

    @handles(AuthorityPromoted)
    def _promoted(self, deployment_id: str, e: E) -> Keys:
        return self._set(deployment_id, managed=True, promoting=True)

    @handles(DeploymentDeleted)
    def _deleted(self, deployment_id: str, e: E) -> Keys:
        """A removed view is published as a removal; one never rendered has nothing to
        remove."""
        d = self.desired.pop(deployment_id, None)
        if d is None:
            return ()
        on_cluster = self.on_cluster.get(d["cluster_id"], {})
        on_cluster.pop(deployment_id, None)
        if not on_cluster:
            self.on_cluster.pop(d["cluster_id"], None)
        key = f"{d['cluster_id']}.{deployment_id}"
        return (key,) if self.views.pop(key, None) is not None else ()

    def _set(self, deployment_id: str, **fields: Any) -> Keys:
        d = self.desired.get(deployment_id)
        if d is None:
            return ()
        d.update(fields)
        d["nodes_per_worker"] = self._span(d)
        key = f"{d['cluster_id']}.{deployment_id}"
        if d["promoting"] or (d["managed"] and key not in self.views and not d["admitted"]):
            return ()  # not admitted (since its promotion): nothing for the operator to do
        view = self._render(d)
        if self.views.get(key) == view:
            return ()
        self.views[key] = cast(View, view)  # views are JSON objects; this one is a contract's
        return (key,)

    def _span(self, d: dict[str, Any]) -> int:
        """The nodes one engine worker spans on the cluster's largest nodes of its class; what
        it was when none could hold a pod of it (or the inventory is not known yet)."""
        largest = self.largest.get(d["cluster_id"], {}).get(d["device_class"], 0)
        n = span(worker_devices(d["serving"]), largest)
        return int(d.get("nodes_per_worker", 1)) if n is None else n

    @staticmethod
    def _render(d: dict[str, Any]) -> RenderDocument:
        """The render object the operator receives (`domain/contracts/render.py`): what should
        run, and how many replicas of it."""
        per_replica = d["serving"]["devices_per_replica"]
        covered = d["granted_devices"] // per_replica if d["managed"] else d["desired_replicas"]
        replicas = min(d["desired_replicas"], covered) if d["enabled"] else 0
        return {
            "deployment_id": d["deployment_id"],
            "workload_id": d["workload_id"],
            "cluster_id": d["cluster_id"],
            "project": d["project"],
            "device_class": d["device_class"],
            "generation": d["generation"],
            "serving": d["serving"],
            "serving_digest": d["serving_digest"],
            "engine_args": d["engine_args"],
            "replicas": replicas,
            "enabled": d["enabled"],
            "authority": Authority.MANAGED if d["managed"] else Authority.OBSERVED,
            "adopted": d["adopted"],
            "nodes_per_worker": d["nodes_per_worker"],
        }
