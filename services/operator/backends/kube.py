"""The operator backend for a real Kubernetes cluster running Dynamo.

Reconciling is two steps: `plan.plan` (pure) compares a deployment's render object with the
DynamoGraphDeployment the cluster holds and says what to write; `KubeBackend.execute` is the
one place that writes. For an observed deployment, or in read-only mode, it writes nothing and
reports what it would have done instead, so the zero-write guarantee has a single choke point.
Writes go to the DGD version the cluster serves (v1beta1, else v1alpha1).

Failures are told as they are. The API server refusing a write (a 4xx: the webhook, the schema,
RBAC), a same-named DGD Wingsmith did not render, or a render it cannot express is permanent:
the deployment's status says `failed` with the server's message, the action is reported as not
performed, and the same render is not written again until it changes or a backoff has passed
(a minute, doubling up to an hour). An API server that cannot be reached
or answers 5xx is transient: a condition on the status, and the render is retried with backoff.

Observing follows DynamoGraphDeployments (in the version it renders), pods and nodes through
informers (list, then watch; reconnects and `410 Gone` relists are the adapter's) and reports:
- replicas: every worker pod (worker, prefill, decode) once scheduled, with its node, devices,
  serving digest and readiness; the pod's resourceVersion orders the reports;
- deployment status and live digests, from the DGD's status and its pods;
- discoveries: every DGD Wingsmith did not render, as `inspect_dgd` reads it;
- inventory: GPU nodes by `nvidia.com/gpu.product`, allocatable `nvidia.com/gpu` and a topology
  label;
- syncs (`snapshot`, taken by the runtime on start and periodically): every deployment with all
  its worker pods and its status, from the same caches, so the hub can set right a report it
  lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError

from wingsmith.adapters.kube import (
    DGD_GROUP,
    Change,
    Kind,
    KindNotServed,
    Kube,
    KubeConflict,
    KubeError,
    served_dra,
)
from wingsmith.domain.cluster import Node
from wingsmith.domain.contracts.reports import (
    ActionReport,
    DeploymentReport,
    DiscoveryReport,
    InventoryReport,
    NodeDevicesReport,
    ReplicaReport,
    ReplicaState,
    Report,
    SyncedReplica,
    SyncReport,
)
from wingsmith.domain.deployment import (
    MAX_CONDITIONS,
    Authority,
    ClusterPhase,
    StatusCondition,
)
from wingsmith.domain.discovery import WORKER_ROLES, DiscoveredComponent, Sighting
from wingsmith.domain.pods import PodNeeds
from wingsmith.domain.values import stand_in_device_id
from wingsmith.services.operator.dgd import (
    ANNOTATION_DEPLOYMENT_ID,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    LABEL_DEPLOYMENT,
    LABEL_SERVING_DIGEST,
    deployment_label,
)
from wingsmith.services.operator.dra import DraDevices, dra_devices
from wingsmith.services.operator.inspect import inspect_dgd, is_rendered_by_wingsmith
from wingsmith.services.operator.metrics import OperatorMetrics
from wingsmith.services.operator.plan import Action, Obj, plan
from wingsmith.services.operator.pods import with_defaults
from wingsmith.services.operator.runtime import Report as Send
from wingsmith.services.operator.status import deployment_status
from wingsmith.services.tasks import stop_all

log = logging.getLogger(__name__)

DEVICE_IDS_ANNOTATION = "wingsmith.dev/device-ids"
TOPOLOGY_LABEL = "topology.kubernetes.io/zone"
GRAPH_LABEL = "nvidia.com/dynamo-graph-deployment-name"
COMPONENT_TYPE_LABEL = "nvidia.com/dynamo-component-type"
SUB_COMPONENT_TYPE_LABEL = "nvidia.com/dynamo-sub-component-type"
V1BETA1, V1ALPHA1 = "nvidia.com/v1beta1", "nvidia.com/v1alpha1"
REFUSED_AGAIN = (60.0, 3600.0)  # seconds before a refused render is tried again: first, cap
AGENT_SILENT = 3  # refreshes a node agent may miss before its node's devices are not its word
AGENT_GRACE = 60.0  # seconds after a start to hear from each node's agent, with --node-agents
AGENT_CHECK = 2.0  # seconds between two looks for node agents gone silent
DRA_ASK_AGAIN = 10.0  # seconds before asking again whether the cluster serves DRA
DRA_SETTLE = 0.2  # seconds a burst of claim, slice and pod changes is let settle, joined once
EVENT_SOURCE = "wingsmith-operator"  # who the Kubernetes Events it records come from
DONE = {  # a write's Event reason
    "create": "Created",
    "apply": "Applied",
    "patch": "Patched",
    "replace": "Replaced",
    "delete": "Deleted",
}


@dataclass(frozen=True)
class Refusal:
    """The render the cluster refused (its digest), why, and when it may be tried again."""

    render: str
    condition: StatusCondition
    retry_at: float
    attempts: int


class KubeBackend:
    def __init__(
        self,
        kube: Kube,
        cluster_id: str,
        namespace: str,
        *,
        read_only: bool,
        api_version: str = "nvidia.com/v1beta1",
        pod_defaults: PodNeeds | None = None,
        refused_again: tuple[float, float] = REFUSED_AGAIN,
        pod_selector: str | None = None,
        node_agents: bool = False,
        agent_grace: float = AGENT_GRACE,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.kube, self.cluster_id, self.namespace = kube, cluster_id, namespace
        self.metrics = metrics if metrics is not None else OperatorMetrics(cluster_id)
        self.pod_defaults = pod_defaults  # the cluster's: what a render object leaves unset
        self.refused_again = refused_again
        self.pod_selector = pod_selector  # only these pods are watched (a large cluster's)
        self.node_agents = node_agents  # every GPU node runs one: its pods wait for its word
        self.agent_grace = agent_grace
        self.read_only, self.api_version = read_only, api_version
        self.desired: dict[str, Mapping[str, Any]] = {}
        self.applied: dict[str, Mapping[str, Any] | None] = {}  # the last render object applied
        self._report: Send | None = None
        # what the cluster holds, per kind ("dgd", "pod", "node") and (namespace, name)
        # (and, on a DRA cluster, "claim" and "slice")
        self._cache: dict[str, dict[tuple[str, str], Obj]] = {
            "dgd": {},
            "pod": {},
            "node": {},
            "claim": {},
            "slice": {},
        }
        self._synced: set[str] = set()
        self._reported: dict[str, str] = {}  # what was last reported per key: no repeats
        self._locks: dict[str, asyncio.Lock] = {}  # one reconcile at a time per deployment
        # which deployment an object belongs to, by its pods' label or the DGD it adopted
        self._by_label: dict[str, str] = {}
        self._by_adopted: dict[tuple[str, str], str] = {}
        self._live: dict[str, dict[tuple[str, str], str]] = {}  # deployment -> pod -> digest
        self._pods_seen = 0  # the highest pod resourceVersion seen: what a sync is as of
        self._served: str | None = None  # the DGD API version writes go to, once known
        self._refused: dict[str, Refusal] = {}  # permanent: the render is not written again
        self._trouble: dict[str, StatusCondition] = {}  # transient: the last write failed
        self._denied: dict[str, StatusCondition] = {}  # cache -> why the API server refuses it
        self._recording: set[asyncio.Task[None]] = set()  # Events on their way, off the writes
        # pods by the label that ties them to a deployment: ours, or an adopted graph's name
        self._pods_by_tie: dict[tuple[str, str], set[tuple[str, str]]] = {}
        # node agents: each node's last report, when it came, and its pods' devices; the
        # devices each pod was reported with (a replica's devices do not change); the pods
        # that request GPUs (what is held outside Wingsmith is counted from them)
        self._agents: dict[str, tuple[NodeDevicesReport, float]] = {}
        self._held: dict[str, dict[tuple[str, str], list[str]]] = {}
        self._given: dict[tuple[str, str], list[str]] = {}
        self._gpu_pods: dict[tuple[str, str], Obj] = {}
        self._started = time.monotonic()
        # Dynamic Resource Allocation: whether the cluster serves it (None: not known yet),
        # the pods that name resource claims, and the last join of claims, slices and pods
        self._dra_served: bool | None = None
        self._claim_pods: dict[tuple[str, str], Obj] = {}
        self._dra: DraDevices | None = None
        self._dra_due = asyncio.Event()

    # -- render object -------------------------------------------------------------------

    async def apply(self, deployment_id: str, desired: Mapping[str, Any] | None) -> None:
        if desired is not None:
            desired = with_defaults(desired, self.pod_defaults)
        async with self._locks.setdefault(deployment_id, asyncio.Lock()):
            await self._apply(deployment_id, desired)

    async def _restore(self, deployment_id: str) -> None:
        """Someone changed or deleted what we rendered: put back what is desired now. A failure
        here is logged: the next change, or the next render object, tries again."""
        async with self._locks.setdefault(deployment_id, asyncio.Lock()):
            if (desired := self.desired.get(deployment_id)) is None:
                return
            try:
                await self._apply(deployment_id, desired)
            except (KubeError, ValueError, RuntimeError) as e:
                log.warning("%s: could not put it back: %s", deployment_id, e)

    async def _apply(self, deployment_id: str, desired: Mapping[str, Any] | None) -> None:
        previous = self.desired.get(deployment_id)
        self._index(deployment_id, desired)
        refusal = self._refused.get(deployment_id)
        if refusal is not None:
            if refusal.render == _render_key(desired) and time.monotonic() < refusal.retry_at:
                return  # refused as it is: not sent again every time something moves
            if refusal.render != _render_key(desired):
                self._refused.pop(deployment_id)  # a new render: a new try
        for _ in range(3):  # a conflict means someone wrote meanwhile: look again
            try:
                action = await self._plan(deployment_id, desired, previous)
            except ValueError as e:  # a render the operator cannot express
                await self._refuse(deployment_id, desired, None, "Unrenderable", str(e))
                return
            if action.refused:
                await self._refuse(deployment_id, desired, action, "Foreign", action.why)
                return
            try:
                await self.execute(deployment_id, desired, action)
            except KubeConflict:
                continue
            except KubeError as e:
                if e.permanent:
                    await self._refuse(deployment_id, desired, action, _refusal(e), _text(e))
                    return
                await self._troubled(deployment_id, e)
                raise
            self.applied[deployment_id] = desired
            await self._cleared(deployment_id)
            if previous is None:  # new here: what was seen of it before can be told now
                await self._resync(deployment_id)
            return
        raise RuntimeError(f"{deployment_id}: the DynamoGraphDeployment keeps changing")

    async def _refuse(
        self,
        deployment_id: str,
        desired: Mapping[str, Any] | None,
        action: Action | None,
        reason: str,
        message: str,
    ) -> None:
        """A permanent failure: the action reported not performed, with why, and the status
        `failed` with a permanent condition; the same render waits for a long backoff."""
        attempts = (
            (self._refused[deployment_id].attempts + 1) if deployment_id in self._refused else 0
        )
        first, cap = self.refused_again
        condition = StatusCondition.model_construct(
            reason=reason, message=message[:1024] or reason, permanent=True, pods=0
        )
        self._refused[deployment_id] = Refusal(
            _render_key(desired),
            condition,
            time.monotonic() + min(first * 2**attempts, cap),
            attempts,
        )
        log.error("%s: refused: %s: %s", deployment_id, reason, message)
        if action is not None and not self.read_only:
            self._event(action, "Warning", reason, f"{deployment_id}: {message}")
        name = (desired or {}).get("workload_id") or deployment_id.rsplit("--", 1)[0]
        report = ActionReport.model_construct(
            cluster_id=self.cluster_id,
            deployment_id=deployment_id,
            verb=(action.verb if action is not None and action.verb else "apply"),
            namespace=action.namespace if action is not None else self.namespace,
            name=action.name if action is not None else name,
            performed=False,
            reason=f"refused ({reason}): {message}"[:256],
        )
        await self._send(f"refused:{deployment_id}", report)
        await self._report_status(deployment_id)

    async def _troubled(self, deployment_id: str, e: KubeError) -> None:
        """A transient failure to write: a condition on the status; the write is retried."""
        reason = e.reason if e.reason and e.reason[0].isalpha() else "ApiServerError"
        self._trouble[deployment_id] = StatusCondition.model_construct(
            reason=reason.replace(" ", "")[:64], message=_text(e)[:1024], permanent=False, pods=0
        )
        await self._report_status(deployment_id)

    async def _cleared(self, deployment_id: str) -> None:
        """Written: a refusal or a failed write before is over."""
        refused = self._refused.pop(deployment_id, None)
        troubled = self._trouble.pop(deployment_id, None)
        self._reported.pop(f"refused:{deployment_id}", None)
        if refused is not None or troubled is not None:
            await self._report_status(deployment_id)

    def _index(self, deployment_id: str, desired: Mapping[str, Any] | None) -> None:
        """Keep the render object, and which pods and DGDs belong to it."""
        before = self.desired.pop(deployment_id, None)
        if desired is not None:
            self.desired[deployment_id] = desired
        self._by_label[deployment_label(deployment_id)] = deployment_id
        adopted = (before or {}).get("adopted")
        if adopted:
            self._by_adopted.pop((adopted["namespace"], adopted["name"]), None)
        adopted = (desired or {}).get("adopted")
        if adopted:
            self._by_adopted[(adopted["namespace"], adopted["name"])] = deployment_id

    async def _plan(
        self,
        deployment_id: str,
        desired: Mapping[str, Any] | None,
        previous: Mapping[str, Any] | None,
    ) -> Action:
        # after a restart a removal may be all the operator knows of a deployment: its id ends
        # with `--<cluster>`, and what comes before is the workload, the DGD's name
        workload: Mapping[str, Any] = {
            "workload_id": deployment_id.removesuffix(f"--{self.cluster_id}")
        }
        previous = previous or workload
        source = desired or previous
        ref: Mapping[str, Any] = source.get("adopted") or {
            "namespace": self.namespace,
            "name": source["workload_id"],
        }
        api_version = await self.served_version()
        current = await self.kube.get_dgd(ref["namespace"], ref["name"], api_version.split("/")[1])
        return plan(
            deployment_id,
            desired,
            current,
            namespace=self.namespace,
            api_version=api_version,
            previous=previous,
        )

    async def served_version(self) -> str:
        """The DGD API version to write: the one configured when the cluster serves it, else
        the other one it serves (a Dynamo older than v1beta1 serves only v1alpha1)."""
        if self._served is None:
            other = V1ALPHA1 if self.api_version == V1BETA1 else V1BETA1
            for candidate in (self.api_version, other):
                if await self.kube.serves(_kind(candidate)):
                    self._served = candidate
                    break
            else:
                return self.api_version  # no DGDs at all yet: writing will say so
            if self._served != self.api_version:
                log.warning("the cluster does not serve %s: writing %s", self.api_version, other)
        return self._served

    async def execute(
        self, deployment_id: str, desired: Mapping[str, Any] | None, action: Action
    ) -> None:
        """The one place that writes to the cluster."""
        if action.verb is None:
            return
        observed = desired is not None and desired.get("authority") != Authority.MANAGED
        performed = not (self.read_only or observed)
        if performed:
            try:
                await self._write(action)
            except Exception:
                self.metrics.api_errors[action.verb].inc()
                raise
        self.metrics.acted(action.verb, performed=performed)
        if performed:
            self._event(action, "Normal", DONE[action.verb], f"{deployment_id}: {action.why}")
        why = "read-only mode" if self.read_only else "observed" if observed else action.why
        log.info(
            "%s: %s DynamoGraphDeployment %s/%s (%s)",
            deployment_id,
            action.verb if performed else f"would {action.verb}",
            action.namespace,
            action.name,
            why,
        )
        report = ActionReport.model_construct(
            cluster_id=self.cluster_id,
            deployment_id=deployment_id,
            verb=action.verb,
            namespace=action.namespace,
            name=action.name,
            performed=performed,
            reason=why,
        )
        if performed:
            self._reported.pop(f"would:{deployment_id}", None)
            if self._report is not None:
                await self._report(report)
        else:  # held back again and again (each change of the DGD): reported once
            await self._send(f"would:{deployment_id}", report)

    async def _write(self, action: Action) -> None:
        """Server-side apply, forced on a DGD Wingsmith renders (it is its only author, see
        `plan`); deleting first for a replacement."""
        if action.verb == "delete":
            await self.kube.delete_dgd(action.namespace, action.name, action.version)
            return
        if action.verb == "replace":
            await self.kube.delete_dgd(action.namespace, action.name, action.version)
        if action.body is not None:
            await self.kube.apply_dgd(action.body, force=True)
        for adapter, replicas in action.scales:
            await self.kube.scale_adapter(action.namespace, adapter, replicas, action.version)

    def _event(self, action: Action, kind: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the DGD acted on, for `kubectl describe` and whoever watches
        events, sent beside the reconcile rather than in its way. Best effort: an Event that
        cannot be written changes nothing else."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{action.name}.{uuid.uuid4().hex[:16]}",
                "namespace": action.namespace,
            },
            "involvedObject": {
                "apiVersion": f"{DGD_GROUP}/{action.version}",
                "kind": "DynamoGraphDeployment",
                "namespace": action.namespace,
                "name": action.name,
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "reportingInstance": self.cluster_id,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        task = asyncio.create_task(self._record(body), name="event")
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record(self, event: Obj) -> None:
        try:
            await self.kube.create_event(event)
        except KubeError as e:
            where = event["involvedObject"]
            log.debug("%s/%s: no event recorded: %s", where["namespace"], where["name"], e)

    # -- observing -----------------------------------------------------------------------

    async def observe(self, report: Send) -> None:
        self._report = report
        dgds = _kind(self.api_version)
        tasks = [
            asyncio.create_task(self._follow_dgds(dgds), name="dgd"),
            asyncio.create_task(self._follow("pod", "pod"), name="pod"),
            asyncio.create_task(self._follow("node", "node"), name="node"),
            asyncio.create_task(self._retry_refused(), name="refused"),
            asyncio.create_task(self._watch_agents(), name="agents"),
            asyncio.create_task(self._follow_dra(), name="dra"),
        ]
        # Not a TaskGroup: a follower reports through NATS, whose client can swallow a
        # cancellation, and a TaskGroup cancels its tasks only once; `stop_all` cancels again
        # until each has ended.
        try:
            await asyncio.gather(*tasks)
        finally:
            await stop_all([*tasks, *self._recording])

    async def _retry_refused(self) -> None:
        """Try a refused render again once its backoff has passed: what refused it (a
        webhook, a policy, a missing namespace) may have changed meanwhile."""
        while True:
            await asyncio.sleep(self.refused_again[0] / 2)
            now = time.monotonic()
            for deployment_id, refusal in list(self._refused.items()):
                if refusal.retry_at > now or deployment_id not in self.desired:
                    continue
                try:
                    async with self._locks.setdefault(deployment_id, asyncio.Lock()):
                        if (desired := self.desired.get(deployment_id)) is not None:
                            await self._apply(deployment_id, desired)
                except (KubeError, RuntimeError) as e:
                    log.warning("%s: could not try again: %s", deployment_id, e)

    async def _follow_dgds(self, kind: Kind) -> None:
        """The API server converts between DGD versions, so one version shows every DGD: the
        one rendered, or v1alpha1 on clusters whose Dynamo predates v1beta1."""
        try:
            await self._follow(kind, "dgd")
        except KindNotServed:
            other: Kind = "dgd/v1alpha1" if kind == "dgd/v1beta1" else "dgd/v1beta1"
            if kind != _kind(self.api_version):
                log.error("this cluster serves no DynamoGraphDeployments: is Dynamo installed?")
                return
            log.warning("this cluster does not serve DGD %s: watching %s", kind, other)
            await self._follow_dgds(other)

    async def _follow(self, kind: Kind, cache: str) -> None:
        """Mirror one kind into its cache. An informer started again (after a failure) begins
        from the cache, so what went while nobody watched is reported gone."""
        selector = self.pod_selector if cache == "pod" else None
        async with self.kube.informer(kind, None, selector, self._cache[cache]) as changes:
            async for change in changes:
                await self._on_change(cache, change)

    async def _on_change(self, cache: str, change: Change) -> None:
        if change.type == "RELISTING":  # until SYNCED the cache mixes old and new: no sync
            self._synced.discard(cache)
            return
        obj, gone = change.obj, change.type == "DELETED"
        if cache == "pod":  # a list's own version covers the deletions it no longer shows
            self._pods_seen = max(self._pods_seen, _version(obj.get("metadata", {})))
        if change.type == "DENIED":
            await self._deny(cache, obj)
            return
        if change.type == "SYNCED":
            self._synced.add(cache)
            if self._denied.pop(cache, None) is not None:
                log.info("informer %s: let in again", cache)
                await self._report_statuses()
            if cache == "node":
                await self._report_inventory()
            if cache in ("claim", "slice", "pod"):
                self._dra_due.set()
            return
        outside = False  # whether devices held outside Wingsmith may have changed
        if cache == "pod":
            self._index_pod(self._cache["pod"].get(_key(obj)), obj, gone)
            holds = not gone and _gpus(obj) > 0
            if holds or self._gpu_pods.pop(_key(obj), None) is not None:
                if holds:
                    self._gpu_pods[_key(obj)] = obj
                outside = self._owner_of_pod(obj) is None and "node" in self._synced
            claims = not gone and bool(obj.get("spec", {}).get("resourceClaims"))
            if claims or self._claim_pods.pop(_key(obj), None) is not None:
                if claims:
                    self._claim_pods[_key(obj)] = obj
                self._dra_due.set()
        if gone:
            self._cache[cache].pop(_key(obj), None)
        else:
            self._cache[cache][_key(obj)] = obj
        if cache == "dgd":
            await self._on_dgd(obj, gone)
            deployment_id = self._deployment_of_dgd(obj)
            if deployment_id is not None and is_rendered_by_wingsmith(obj):
                await self._restore(deployment_id)
        elif cache == "pod":
            await self._on_pod(obj, gone)
            if gone:
                self._given.pop(_key(obj), None)
            if outside:
                await self._report_inventory()
            if (deployment_id := self._deployment_of_pod(obj)) is not None:
                await self._report_status(deployment_id)
        elif cache in ("claim", "slice"):
            self._dra_due.set()
        elif "node" in self._synced:
            await self._report_inventory()

    async def _deny(self, cache: str, status: Obj) -> None:
        """The API server refuses the operator a kind (its RBAC, say, for a namespace-scoped
        install): said once in the log and on every deployment's status, until it lets it in."""
        verb = "list and watch" if cache != "node" else "list and watch cluster-wide"
        condition = StatusCondition.model_construct(
            reason="Unauthorized" if status.get("code") == 401 else "Forbidden",
            message=f"the operator may not {verb} {cache}s: {status.get('message', '')}"[:1024],
            permanent=False,
            pods=0,
        )
        if self._denied.get(cache) != condition:
            log.error("informer %s: %s", cache, condition.message)
            self._denied[cache] = condition
            await self._report_statuses()

    async def _report_statuses(self) -> None:
        for deployment_id in list(self.desired):
            await self._report_status(deployment_id)

    async def _resync(self, deployment_id: str) -> None:
        """Report again what was seen of a deployment before its render object arrived: its
        pods and DGD could not be told apart from others' until then."""
        for dgd in list(self._cache["dgd"].values()):
            if self._deployment_of_dgd(dgd) == deployment_id:
                await self._on_dgd(dgd, gone=False)
        for pod in list(self._cache["pod"].values()):
            if self._deployment_of_pod(pod) == deployment_id:
                await self._on_pod(pod, gone=False)
        if "node" in self._synced:  # its pods are no longer held outside Wingsmith
            await self._report_inventory()

    async def _on_dgd(self, dgd: Obj, gone: bool) -> None:
        deployment_id = self._deployment_of_dgd(dgd)
        if not is_rendered_by_wingsmith(dgd):
            await self._report_discovery(dgd, gone)
        if deployment_id is not None and not gone:
            await self._report_status(deployment_id, dgd)

    async def _report_status(self, deployment_id: str, dgd: Obj | None = None) -> None:
        """The deployment's status from its DGD and pods, with what the operator knows besides:
        a refusal (then `failed`), a write that failed (a condition). Nothing while there is
        neither a DGD nor anything to tell."""
        dgd = dgd if dgd is not None else self._dgd_of(deployment_id)
        refusal, trouble = self._refused.get(deployment_id), self._trouble.get(deployment_id)
        if dgd is None and refusal is None and trouble is None and not self._denied:
            return
        desired = self.desired.get(deployment_id) or self.applied.get(deployment_id) or {}
        pods = self._pods_of(deployment_id)
        extra = [*([trouble] if trouble is not None else []), *self._denied.values()]
        status = deployment_status(dgd or {}, pods, desired.get("replicas"), extra)
        if dgd is None:
            status = status.model_copy(update={"phase": ClusterPhase.PENDING})
        if refusal is not None:
            conditions = (refusal.condition, *status.conditions)[:MAX_CONDITIONS]
            status = status.model_copy(
                update={
                    "phase": ClusterPhase.FAILED,
                    "reason": refusal.condition.reason,
                    "message": refusal.condition.message,
                    "conditions": conditions,
                }
            )
        report = DeploymentReport.model_construct(
            cluster_id=self.cluster_id,
            deployment_id=deployment_id,
            status=status,
            version=_version((dgd or {}).get("metadata", {})),
        )
        await self._send(f"deployment:{deployment_id}", report)

    def _index_pod(self, before: Obj | None, pod: Obj, gone: bool) -> None:
        """Keep the index of pods by what ties them to a deployment."""
        if before is not None and (tie := _tie(before)) is not None:
            self._pods_by_tie.get(tie, set()).discard(_key(before))
        if not gone and (tie := _tie(pod)) is not None:
            self._pods_by_tie.setdefault(tie, set()).add(_key(pod))

    def _pods_of(self, deployment_id: str) -> list[Obj]:
        desired = self.desired.get(deployment_id) or self.applied.get(deployment_id) or {}
        ties = [("label", deployment_label(deployment_id))]
        if adopted := desired.get("adopted"):
            ties.append(("graph", f"{adopted['namespace']}/{adopted['name']}"))
        keys = set().union(*(self._pods_by_tie.get(t, set()) for t in ties))
        pods = [self._cache["pod"][k] for k in sorted(keys) if k in self._cache["pod"]]
        return [p for p in pods if self._owner_of_pod(p) == deployment_id]

    def _dgd_of(self, deployment_id: str) -> Obj | None:
        return next(
            (d for d in self._cache["dgd"].values() if self._deployment_of_dgd(d) == deployment_id),
            None,
        )

    async def _report_discovery(self, dgd: Obj, gone: bool) -> None:
        meta = dgd["metadata"]
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        report = DiscoveryReport.model_construct(
            cluster_id=self.cluster_id, namespace=namespace, name=name
        )
        if not gone:
            try:
                inspection = inspect_dgd(dgd)
            except ValueError as e:
                log.warning("%s/%s: cannot read it: %s", namespace, name, e)
                return
            sighting = Sighting.model_construct(
                namespace=namespace,
                name=name,
                api_version=str(inspection.api_version),
                backend=inspection.backend,
                components=tuple(
                    DiscoveredComponent.model_construct(**c.summary())
                    for c in inspection.components
                ),
                model=inspection.model,
                image=inspection.image,
                engine_version=inspection.engine_version,
                tensor_parallel=inspection.tensor_parallel,
            )
            report = DiscoveryReport.model_construct(
                cluster_id=self.cluster_id, namespace=namespace, name=name, sighting=sighting
            )
        await self._send(f"discovery:{namespace}/{name}", report)

    async def _on_pod(self, pod: Obj, gone: bool) -> None:
        deployment_id = self._deployment_of_pod(pod)
        if deployment_id is None:
            return
        report = self._replica(deployment_id, pod, gone)
        if report is None:
            return
        meta = pod["metadata"]
        await self._send(f"replica:{meta.get('uid') or meta['name']}", report)
        live = self._live.setdefault(deployment_id, {})
        if report.state == ReplicaState.TERMINATED:
            live.pop(_key(pod), None)
        else:
            live[_key(pod)] = report.serving_digest
        await self._report_live_digests(deployment_id)

    def _replica(self, deployment_id: str, pod: Obj, gone: bool) -> ReplicaReport | None:
        """A worker pod as a replica report; None for any other pod, or one not scheduled yet
        (it holds no devices)."""
        spec, meta = pod.get("spec", {}), pod["metadata"]
        node = spec.get("nodeName")
        if not node or not _is_worker(pod):
            return None
        device_ids = self._devices_of(pod, node)
        if device_ids is None:
            return None
        desired = self.desired.get(deployment_id) or self.applied.get(deployment_id) or {}
        return ReplicaReport.model_construct(
            cluster_id=self.cluster_id,
            deployment_id=deployment_id,
            pod=meta["name"],
            node_id=node,
            device_ids=device_ids,
            serving_digest=_digest(pod, desired),
            engine_version=desired.get("serving", {}).get("engine_version") or "unknown",
            state=_pod_state(pod, gone),
            version=_version(meta),
        )

    def _devices_of(self, pod: Obj, node: str) -> list[str] | None:
        """The devices a worker pod holds: as first reported (a replica's devices do not
        change); else, for a pod naming resource claims, as DRA allocated them; else as its
        node's agent says the kubelet allocated them; else, where no agent speaks for the
        node, from the pod (stand-ins, `_device_ids`). None while those that will name them
        have not yet: the replica is reported once they have."""
        key = _key(pod)
        if (given := self._given.get(key)) is not None:
            return given
        if pod.get("spec", {}).get("resourceClaims") and self._dra_served is not False:
            if self._dra is None:
                return None  # whether the cluster serves DRA, or what it says, is not known
            if held_by_claims := self._dra.by_pod.get(key):
                self._given[key] = list(held_by_claims)
                return self._given[key]
            if not self._claims_allocated(pod):
                return None  # its claims wait for the scheduler's allocation
        agent = self._agent(node)
        if agent is not None:
            held = self._held[node].get(key)
            if held is None and not set(agent.resources).isdisjoint(_requests(pod)):
                return None  # the kubelet has not allocated them yet
        elif self._awaits_agent(node):
            return None
        else:
            held = None
        ids = held if held is not None else _device_ids(pod, node)
        self._given[key] = ids
        return ids

    def _claims_allocated(self, pod: Obj) -> bool:
        """Whether every claim the pod's status names has been allocated devices."""
        namespace = pod["metadata"].get("namespace", "")
        statuses = pod.get("status", {}).get("resourceClaimStatuses") or ()
        named = [s.get("resourceClaimName") for s in statuses]
        named += [
            c.get("resourceClaimName") for c in pod["spec"]["resourceClaims"] if isinstance(c, dict)
        ]
        claims = [self._cache["claim"].get((namespace, n)) for n in named if n]
        return bool(claims) and all(
            c is not None and (c.get("status") or {}).get("allocation") for c in claims
        )

    async def _follow_dra(self) -> None:
        """On a cluster that allocates GPUs with Dynamic Resource Allocation, watch its
        ResourceClaims and ResourceSlices (services/operator/dra.py says what is read)."""
        while True:
            try:
                kinds = await served_dra(self.kube)
                break
            except KubeError as e:
                log.warning("cannot tell whether the cluster serves DRA (%s): asking again", e)
                await asyncio.sleep(DRA_ASK_AGAIN)
        self._dra_served = kinds is not None
        if kinds is None:
            log.info("no Dynamic Resource Allocation served: device ids come from node agents")
            await self._devices_changed(None)  # pods naming claims waited for this answer
            return
        log.info("Dynamic Resource Allocation %s: reading claims and slices", kinds.version)
        await asyncio.gather(
            self._follow(kinds.claims, "claim"),
            self._follow(kinds.slices, "slice"),
            self._join_dra(),
        )

    async def _join_dra(self) -> None:
        """Join claims, slices and the pods naming claims again after each burst of changes;
        report the pods that waited for their devices, and the inventory."""
        logged: set[str] = set()
        while True:
            await self._dra_due.wait()
            await asyncio.sleep(DRA_SETTLE)
            self._dra_due.clear()
            if not {"claim", "slice", "pod"} <= self._synced:
                continue
            self._dra = dra_devices(
                self._claim_pods.values(),
                self._cache["claim"].values(),
                self._cache["slice"].values(),
            )
            for skipped in map(str, self._dra.skipped):
                if skipped not in logged:  # each oddity once, not at every join
                    log.warning("DRA: %s", skipped)
            logged = set(map(str, self._dra.skipped))
            for key, pod in list(self._claim_pods.items()):
                if key not in self._given:  # it waited for its devices: they may be known now
                    await self._on_pod(pod, gone=False)
            if "node" in self._synced:
                await self._report_inventory()

    def _agent(self, node: str) -> NodeDevicesReport | None:
        """The node's agent's report, unless the agent has gone silent."""
        heard = self._agents.get(node)
        if heard is None or time.monotonic() - heard[1] > AGENT_SILENT * heard[0].refresh:
            return None
        return heard[0]

    def _awaits_agent(self, node: str) -> bool:
        """Whether a silent node's pods wait for its agent still: only with `node_agents`,
        for a node never heard from, for `agent_grace` seconds after this start."""
        return (
            self.node_agents
            and node not in self._agents
            and time.monotonic() - self._started < self.agent_grace
        )

    async def take_node_devices(self, data: bytes) -> None:
        """A node agent's report (services/operator/agent.py), as published: checked as
        strictly as the hub checks reports (a node is no more trusted than a client); its
        node's pods are reported again with what it says."""
        try:
            report = NodeDevicesReport.model_validate_json(data, strict=True)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(body)"
            problem = first["msg"].removeprefix("Value error, ")
            log.warning("a node agent's report was refused: %s: %s", where, problem)
            return
        if report.cluster_id != self.cluster_id:
            log.warning("a node agent reported for cluster %r: refused", report.cluster_id)
            return
        node = report.node_id
        if ("", node) not in self._cache["node"]:  # nothing is kept for a node not listed
            log.warning("a node agent reported for node %r, which the cluster lacks", node)
            return
        before = self._agent(node)
        self._agents[node] = (report, time.monotonic())
        if report == before:
            return
        held, self._held[node] = (
            self._held.get(node, {}),
            {(p.namespace, p.name): p.device_ids for p in report.pods},
        )
        if before is None:  # it speaks for the node now: every pod there may be reported
            await self._devices_changed(node)
            return
        for key in held.keys() | self._held[node].keys():  # those whose devices it changed
            pod = self._cache["pod"].get(key)
            if pod is not None and held.get(key) != self._held[node].get(key):
                await self._on_pod(pod, gone=False)
        if "node" in self._synced:
            await self._report_inventory()

    async def _watch_agents(self) -> None:
        """Nodes whose agent went silent, and, with `node_agents`, those never heard from once
        the grace is over: their pods are reported with what the pods say."""
        waiting = self.node_agents
        while True:
            await asyncio.sleep(AGENT_CHECK)
            now = time.monotonic()
            for node, (report, heard) in list(self._agents.items()):
                if now - heard > AGENT_SILENT * report.refresh:
                    log.warning("node %s: its agent is silent; its devices are stand-ins", node)
                    del self._agents[node]
                    self._held.pop(node, None)
                    await self._devices_changed(node)
            if waiting and now - self._started >= self.agent_grace:
                waiting = False
                for node in {p.get("spec", {}).get("nodeName") for p in self._gpu_pods.values()}:
                    if node and node not in self._agents:
                        log.warning("node %s: no agent was heard from; stand-ins", node)
                        await self._devices_changed(node)

    async def _devices_changed(self, node: str | None) -> None:
        """Report again the pods holding devices on `node` (None: on every node)."""
        for pod in [*self._gpu_pods.values(), *self._claim_pods.values()]:
            if node is None or pod.get("spec", {}).get("nodeName") == node:
                await self._on_pod(pod, gone=False)
        if "node" in self._synced:
            await self._report_inventory()

    def readiness(self) -> dict[str, bool]:
        """Each informer has listed what it watches (the DGDs, the pods, the nodes)."""
        caches = ("dgd", "pod", "node", *(("claim", "slice") if self._dra_served else ()))
        return {f"listed_{cache}s": cache in self._synced for cache in caches}

    def snapshot(self, only: str | None = None) -> list[SyncReport] | None:
        """Every deployment this operator was told of (removed ones too), or `only` that one,
        with each worker pod it has, as of the highest resourceVersion of the pods' lists and
        changes seen: every pod change up to it is in the cache. None until the pods have been
        listed, and while a relist is being replayed."""
        if "pod" not in self._synced:
            return None
        # a removed deployment is synced while it has pods, or when asked for (its removal
        # applied after a start): a plane that missed its last pods' ends hears it once more.
        # One whose first write since this start is still in flight is not: its pods are not
        # counted as its yet, and it is synced once that write is done (`_resync`).
        told = self.applied.keys() & (self.desired.keys() if only is None else {only})
        pods: dict[str, list[SyncedReplica]] = {d: [] for d in told}
        for pod in self._cache["pod"].values():
            deployment_id = self._owner_of_pod(pod)
            if deployment_id not in self.applied or only not in (None, deployment_id):
                continue
            replica = self._replica(deployment_id, pod, False)
            synced = _synced(replica) if replica is not None else None
            if synced is not None:
                pods.setdefault(deployment_id, []).append(synced)
        # No status: a DGD's status is as of the DGD's own resourceVersion, which a watch of
        # another kind may be ahead of or behind; it is reported with that version on every
        # change and on every start, and a sync stamped with the pods' version would undo it.
        return [
            SyncReport.model_construct(
                cluster_id=self.cluster_id,
                deployment_id=deployment_id,
                replicas=sorted(replicas, key=lambda r: str(r.pod)),
                version=self._pods_seen,
            )
            for deployment_id, replicas in sorted(pods.items())
        ]

    def _owner_of_pod(self, pod: Obj) -> str | None:
        """The deployment a pod is of, whether or not it is still desired: a removed
        deployment's pods still hold devices while they go."""
        labels = pod.get("metadata", {}).get("labels") or {}
        if LABEL_DEPLOYMENT in labels:
            return self._by_label.get(labels[LABEL_DEPLOYMENT])
        return self._deployment_of_pod(pod)

    async def _report_live_digests(self, deployment_id: str) -> None:
        digests = Counter(self._live.get(deployment_id, {}).values())
        report = DeploymentReport.model_construct(
            cluster_id=self.cluster_id, deployment_id=deployment_id, live_digests=dict(digests)
        )
        await self._send(f"live:{deployment_id}", report)

    async def _report_inventory(self) -> None:
        """Every GPU node: its devices (named, where its agent names them), whether it takes
        new pods, and how many of its devices pods Wingsmith does not manage hold."""
        outside = self._held_outside()
        nodes = []
        for (_, name), node in sorted(self._cache["node"].items()):
            labels = node["metadata"].get("labels") or {}
            if GPU_PRODUCT_LABEL not in labels:
                continue
            devices = _quantity(node.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE))
            fields: dict[str, Any] = {}
            agent = self._agent(name)
            published = self._dra.published.get(name) if self._dra is not None else None
            ids: set[str] = set()
            if agent is not None and agent.allocatable is not None:
                ids.update(agent.allocatable, (d for p in agent.pods for d in p.device_ids))
            if published:  # whole GPUs: not the MIG partitions a GPU could be cut into
                ids.update(i for i, d in published.items() if d.type in (None, "gpu"))
            if ids:
                devices = max(devices, len(ids))
                fields["device_ids"] = sorted(ids)
            if _unschedulable(node):
                fields["unschedulable"] = True
            if held := min(outside.get(name, 0), devices):
                fields["held_outside"] = held
            nodes.append(
                Node.model_construct(
                    node_id=name,
                    device_class=labels[GPU_PRODUCT_LABEL],
                    devices=devices,
                    topology_domain=labels.get(TOPOLOGY_LABEL),
                    **fields,
                )
            )
        report = InventoryReport.model_construct(cluster_id=self.cluster_id, nodes=nodes)
        await self._send("inventory", report)

    def _held_outside(self) -> Counter[str]:
        """Devices per node held by pods that are no deployment's: as a node's agent lists
        them where one speaks, else as the pods Wingsmith sees request them."""
        outside: Counter[str] = Counter()
        spoken = set()
        for node in list(self._agents):
            if (agent := self._agent(node)) is None:
                continue
            spoken.add(node)
            for p in agent.pods:
                pod = self._cache["pod"].get((p.namespace, p.name))
                if pod is None or self._owner_of_pod(pod) is None:
                    outside[node] += len(p.device_ids)
        for pod in self._gpu_pods.values():
            node = pod.get("spec", {}).get("nodeName")
            if (
                node
                and node not in spoken
                and pod.get("status", {}).get("phase") not in {"Succeeded", "Failed"}
                and self._owner_of_pod(pod) is None
            ):
                outside[node] += _gpus(pod)
        if self._dra is not None:  # allocated to claims of pods that are no deployment's
            managed = [k for k, p in self._claim_pods.items() if self._owner_of_pod(p)]
            for node, ids in self._dra.held_outside(managed).items():
                outside[node] += len(ids)
        return outside

    async def _send(self, key: str, report: Report) -> None:
        """Report, unless it says what was last reported under `key` (its `version` aside: an
        object rewritten with the same content is no news). A return to an earlier content is
        news, and goes out under a message id of its own."""
        content = {k: v for k, v in report.wire().items() if k != "version"}
        digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
        if self._report is None or self._reported.get(key) == digest:
            return
        await self._report(report)
        self._reported[key] = digest

    # -- which deployment ---------------------------------------------------------------

    def _deployment_of_dgd(self, dgd: Obj) -> str | None:
        meta = dgd.get("metadata", {})
        if is_rendered_by_wingsmith(dgd):
            return self._current((meta.get("annotations") or {}).get(ANNOTATION_DEPLOYMENT_ID))
        return self._adopted(meta.get("namespace"), meta.get("name"))

    def _deployment_of_pod(self, pod: Obj) -> str | None:
        meta = pod.get("metadata", {})
        labels = meta.get("labels") or {}
        if LABEL_DEPLOYMENT in labels:
            return self._current(self._by_label.get(labels[LABEL_DEPLOYMENT]))
        return self._adopted(meta.get("namespace"), labels.get(GRAPH_LABEL))

    def _adopted(self, namespace: str | None, name: str | None) -> str | None:
        return self._current(self._by_adopted.get((namespace or "", name or "")))

    def _current(self, deployment_id: str | None) -> str | None:
        return deployment_id if deployment_id in self.desired else None


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


def _version(meta: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (0 when it is not one): etcd's revisions."""
    rv = str(meta.get("resourceVersion") or "")
    return int(rv) if rv.isdigit() else 0


def _is_worker(pod: Obj) -> bool:
    labels = pod["metadata"].get("labels") or {}
    kind = labels.get(SUB_COMPONENT_TYPE_LABEL) or labels.get(COMPONENT_TYPE_LABEL)
    return kind in WORKER_ROLES or (LABEL_SERVING_DIGEST in labels and kind != "frontend")


def _digest(pod: Obj, desired: Mapping[str, Any]) -> str:
    labels = pod["metadata"].get("labels") or {}
    return str(labels.get(LABEL_SERVING_DIGEST) or desired.get("serving_digest") or "unknown")


def _pod_state(pod: Obj, gone: bool) -> ReplicaState:
    status = pod.get("status", {})
    if gone or status.get("phase") in {"Succeeded", "Failed"}:
        return ReplicaState.TERMINATED
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    return ReplicaState.READY if ready else ReplicaState.NOT_READY


def _synced(replica: ReplicaReport) -> SyncedReplica | None:
    """A replica report as one of a sync's pods; None for a terminated one (a sync lists what
    holds devices)."""
    state = replica.state
    if state is ReplicaState.TERMINATED:
        return None
    return SyncedReplica.model_construct(
        pod=replica.pod,
        node_id=replica.node_id,
        device_ids=replica.device_ids,
        serving_digest=replica.serving_digest,
        engine_version=replica.engine_version,
        state=state,
    )


def _device_ids(pod: Obj, node: str) -> list[str]:
    """The pod's GPU UUIDs, when a device plugin or webhook annotated them; otherwise one
    stand-in per requested GPU, so device counts stay right."""
    annotated = (pod["metadata"].get("annotations") or {}).get(DEVICE_IDS_ANNOTATION)
    if annotated:
        return [d.strip() for d in annotated.split(",") if d.strip()]
    return [stand_in_device_id(node, pod["metadata"]["name"], i) for i in range(_gpus(pod))]


def _requests(pod: Obj) -> set[str]:
    """The extended resources (those with a `/`) the pod's containers ask for."""
    return {
        name
        for c in pod.get("spec", {}).get("containers") or ()
        for name in ((c.get("resources") or {}).get("limits") or {})
        if "/" in name
    }


def _gpus(pod: Obj) -> int:
    """The GPUs the pod's containers ask for (a GPU's request is its limit)."""
    return sum(
        _quantity(((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE))
        for c in pod.get("spec", {}).get("containers") or ()
    )


def _unschedulable(node: Obj) -> bool:
    """Cordoned, or not Ready (a node that reports no Ready condition yet is taken as it
    is): the scheduler puts no new pod there."""
    if node.get("spec", {}).get("unschedulable"):
        return True
    conditions = node.get("status", {}).get("conditions") or ()
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") != "True"


def _quantity(value: Any) -> int:
    text = str(value or "0")
    return int(text) if text.isdigit() else 0


def _tie(pod: Obj) -> tuple[str, str] | None:
    meta = pod.get("metadata", {})
    labels = meta.get("labels") or {}
    if LABEL_DEPLOYMENT in labels:
        return "label", labels[LABEL_DEPLOYMENT]
    if GRAPH_LABEL in labels:
        return "graph", f"{meta.get('namespace', '')}/{labels[GRAPH_LABEL]}"
    return None


def _kind(api_version: str) -> Kind:
    return "dgd/v1alpha1" if api_version.endswith("v1alpha1") else "dgd/v1beta1"


def _render_key(desired: Mapping[str, Any] | None) -> str:
    return hashlib.sha256(orjson.dumps(desired, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _refusal(e: KubeError) -> str:
    """The condition's reason for an API server's refusal."""
    return {403: "Forbidden", 404: "NotFound"}.get(e.status, "Rejected")


def _text(e: KubeError) -> str:
    return e.message or f"{e.status} {e.reason}"
