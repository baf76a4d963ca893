"""Explain: why a deployment waits, in numbers, and what change would unblock it (pure).

Admission records its evidence with every decision (domain/admission.py): what the deployment
wanted, the quota and capacity with what the others held, per node when its pods did not fit,
and its place in the queue when it waits behind an older one. This module reads that evidence
from the deployment's view and turns it into the binding constraint and a list of concrete
changes, each with the number that would do: "raise project p's quota for H100 to at least
12", "free 4 H100 devices on cluster east". The API composes the views it needs
(services/api/resources.py); docs/scheduling.md, "Explain", has the rules.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from wingsmith.domain.contracts import views as v
from wingsmith.domain.deployment import HOLDS, AdmissionPhase, AdmissionReason, Authority
from wingsmith.domain.device_classes import did_you_mean
from wingsmith.domain.workload import PlacementReason

QUOTA = AdmissionReason.INSUFFICIENT_QUOTA
CAPACITY = AdmissionReason.INSUFFICIENT_CAPACITY


@dataclass(frozen=True, slots=True)
class Around:
    """What the fleet says around a deployment: free devices per node of its cluster and
    class, the classes its cluster and the fleet report, and the blocker's own explanation
    when it waits behind one."""

    nodes_free: Mapping[str, int] = field(default_factory=dict)
    cluster_classes: Collection[str] = ()
    reported: Collection[str] = ()
    blocker: v.Explanation | None = None


def explain(health: v.DeploymentHealthView, around: Around | None = None) -> v.Explanation:
    """The explanation of one deployment, from its view."""
    around = Around() if around is None else around
    per = max(health["devices_per_replica"], 1)
    admission = health["admission"]
    wants = health["desired_replicas"] if health["enabled"] else 0
    held = health["granted_devices"]
    waiting = health["waiting_replicas"]
    constraint, unblock, summary = _why(health, around)
    explanation: v.Explanation = {
        "deployment_id": health["deployment_id"],
        "workload_id": health["workload_id"],
        "cluster_id": health["cluster_id"],
        "project": health["project"],
        "device_class": health["device_class"],
        "phase": admission["phase"],
        "wants": {"replicas": wants, "devices": wants * per},
        "holds": {"replicas": held // per, "devices": held},
        "waiting": {"replicas": waiting, "devices": waiting * per},
        "constraint": constraint,
        "unblock": unblock,
        "summary": summary,
    }
    if around.blocker is not None and around.blocker["constraint"] is not None:
        explanation["blocked_by"] = around.blocker["constraint"]
    return explanation


def explain_unplaced(workload: v.WorkloadView, reported: Collection[str]) -> v.Explanation:
    """A workload placement found nowhere to go: it has no deployment to explain, and all its
    replicas wait."""
    per = max(int(workload["serving"].get("devices_per_replica", 1)), 1)
    replicas, device_class = workload["replicas"], workload["device_class"]
    reason = workload["unplaced_reason"] or PlacementReason.NO_CLUSTER_HAS_DEVICE_CLASS
    message = workload["unplaced"] or f"no cluster to place it on reports {device_class}"
    constraint: v.Constraint = {"reason": reason, "message": message, "numbers": {}}
    if reason == PlacementReason.NO_NODE_HOLDS_A_POD:
        unblock = [
            f"join or free a cluster whose {device_class} nodes can hold one of its pods",
            "or give it a smaller worker (less tensor or pipeline parallelism)",
        ]
    elif reason == PlacementReason.NO_CLUSTER_MATCHES_SELECTOR:
        unblock = [
            f"register a cluster with {device_class} devices and the labels its selector asks for",
            f"or change its selector (`wingsmith workloads prefer {workload['name']} --selector "
            "…`)",
        ]
    else:
        constraint, unblock = _no_class(constraint, device_class, reported)
    return {
        "deployment_id": None,
        "workload_id": workload["workload_id"],
        "cluster_id": None,
        "project": workload["project"],
        "device_class": device_class,
        "phase": AdmissionPhase.PENDING,
        "wants": {"replicas": replicas, "devices": replicas * per},
        "holds": {"replicas": 0, "devices": 0},
        "waiting": {"replicas": replicas, "devices": replicas * per},
        "constraint": constraint,
        "unblock": unblock,
        "summary": f"not placed: {message}",
    }


def _no_class(
    constraint: v.Constraint, device_class: str, reported: Collection[str]
) -> tuple[v.Constraint, list[str]]:
    close = did_you_mean(device_class, reported)
    constraint = {**constraint, "reported": sorted(reported), "did_you_mean": close}
    unblock = [f"join a cluster whose inventory reports {device_class} devices"]
    if close:
        unblock.append(
            f"or declare the workload again with device class {close[0]!r} (did you mean it?)"
        )
    return constraint, unblock


Why = tuple[v.Constraint | None, list[str], str]


def _why(h: v.DeploymentHealthView, around: Around) -> Why:
    """The binding constraint, the changes that would unblock it, and a one-line summary."""
    admission = h["admission"]
    reason, phase = admission["reason"], admission["phase"]
    name = h["deployment_id"]
    if h["authority"] != Authority.MANAGED:
        return None, [], "observed: it runs as found; admission does not decide for it"
    if phase == AdmissionPhase.FAILED:
        message = admission.get("message") or "the cluster refused it"
        said: v.Constraint = {"reason": reason or "failed", "message": message, "numbers": {}}
        fix = f"fix what the cluster reports, then `wingsmith deployments enable {name}`"
        return said, [fix], f"failed: {message}"
    if not h["enabled"]:
        said = {"reason": AdmissionReason.DISABLED, "message": "it is disabled", "numbers": {}}
        return said, [f"enable it: `wingsmith deployments enable {name}`"], "disabled"
    if phase in HOLDS and h["waiting_replicas"] == 0:
        return None, [], f"nothing waits: it holds all it wants ({phase})"
    evidence = admission.get("evidence", {})
    if "blocker" in admission or "queue_position" in evidence:
        return _behind(h, evidence, admission.get("blocker"), around)
    if reason == QUOTA:
        return _quota(h, evidence)
    if reason == CAPACITY:
        return _capacity(h, evidence, around)
    if reason == AdmissionReason.WAITING_FOR_PREVIOUS_GENERATION:
        said = {
            "reason": reason,
            "message": "its new serving configuration starts as the previous one's replicas end",
            "numbers": _pick(evidence, "previous_generation", "wanted", "granted"),
        }
        return said, ["nothing to change: the rollout goes on by itself"], "rolling out"
    said = {
        "reason": reason or AdmissionReason.AWAITING_ADMISSION,
        "message": "admission has not decided for it yet",
        "numbers": {},
    }
    return said, ["nothing to change: admission decides for it shortly"], "not decided yet"


def _pick(evidence: Mapping[str, int], *names: str) -> dict[str, int]:
    return {n: evidence[n] for n in names if n in evidence}


def _replicas(devices: int, per: int) -> int:
    return devices // max(per, 1)


def _quota(h: v.DeploymentHealthView, e: Mapping[str, int]) -> Why:
    project, device_class = h["project"], h["device_class"]
    quota, others = e.get("quota", 0), e.get("held_by_project", 0)
    wanted, granted = e.get("wanted", 0), e.get("granted", h["granted_devices"])
    free, needed = quota - others, others + wanted
    numbers = {"quota": quota, "held_by_others": others, "free": free}
    numbers |= {"wanted": wanted, "granted": granted, "quota_needed": needed}
    message = (
        f"project {project}'s quota for {device_class} is {quota}; its other deployments hold "
        f"{others}, so {free} are free; it wants {wanted} and is granted {granted}"
    )
    said: v.Constraint = {"reason": QUOTA, "message": message, "numbers": numbers}
    unblock = [
        f"raise project {project}'s quota for {device_class} to at least {needed} "
        f"(`wingsmith projects quota {project} {device_class} {needed}`)",
        f"or free {wanted - max(free, 0)} {device_class} devices of project {project}'s other "
        "deployments (scale them down)",
    ]
    unblock += _scale_to(h, granted)
    return said, unblock, f"waits for quota: {h['waiting_replicas']} replicas"


def _scale_to(h: v.DeploymentHealthView, granted: int) -> list[str]:
    fits = _replicas(granted, h["devices_per_replica"])
    # by its id: a later incarnation's id is not its name, and the view does not carry the name
    return [
        f"or scale its workload (id {h['workload_id']}) so this deployment wants {fits} replicas"
    ]


def _capacity(h: v.DeploymentHealthView, e: Mapping[str, int], around: Around) -> Why:
    cluster, device_class = h["cluster_id"], h["device_class"]
    capacity, others = e.get("capacity", 0), e.get("held_in_cluster", 0)
    wanted, granted = e.get("wanted", 0), e.get("granted", h["granted_devices"])
    free = capacity - others
    numbers = {"capacity": capacity, "held_by_others": others, "free": free}
    numbers |= {"wanted": wanted, "granted": granted}
    said: v.Constraint = {"reason": CAPACITY, "message": "", "numbers": numbers}
    if around.nodes_free:
        said["nodes_free"] = dict(around.nodes_free)
    if "worker_devices" in e:  # a worker fits no node there at all
        numbers |= _pick(e, "worker_devices", "pod_devices", "node_devices")
        said["message"] = (
            f"a worker of {e['worker_devices']} devices needs pods of {e.get('pod_devices')} "
            f"devices on one node; cluster {cluster}'s largest {device_class} node has "
            f"{e.get('node_devices')}"
        )
        unblock = [
            f"add {device_class} nodes of at least {e.get('pod_devices')} devices to cluster "
            f"{cluster}",
            "or give it a smaller worker (less tensor or pipeline parallelism)",
        ]
    elif "pods_needed" in e:  # the sums fit, its pods do not fit the nodes
        numbers |= _pick(e, "pod_devices", "pods_needed", "pods_fitting", "largest_node_free")
        size, short = e["pod_devices"], e["pods_needed"] - e.get("pods_fitting", 0)
        said["message"] = (
            f"{free} {device_class} devices are free on cluster {cluster} in all, but its "
            f"{e['pods_needed']} new pods of {size} devices each need one node apiece and only "
            f"{e.get('pods_fitting', 0)} fit (the largest free node has "
            f"{e.get('largest_node_free', 0)})"
        )
        unblock = [f"free {size} devices on one node of cluster {cluster} for each of {short} pods"]
    else:
        short = wanted - free
        said["message"] = (
            f"cluster {cluster} has {capacity} {device_class} devices; the others hold "
            f"{others}, so {free} are free; it wants {wanted} and is granted {granted}"
        )
        unblock = [f"free {short} {device_class} devices on cluster {cluster}, or add nodes"]
        if capacity == 0 and device_class not in around.cluster_classes:
            said["message"] = f"cluster {cluster} reports no {device_class} devices"
            said["reported"] = sorted(around.cluster_classes)
            close = did_you_mean(device_class, around.cluster_classes)
            if close:
                said["did_you_mean"] = close
    unblock += _scale_to(h, granted)
    return said, unblock, f"waits for capacity: {h['waiting_replicas']} replicas"


def _behind(
    h: v.DeploymentHealthView, e: Mapping[str, int], blocker: str | None, around: Around
) -> Why:
    reason = h["admission"]["reason"] or CAPACITY
    place = e.get("queue_position", 0)
    where = (
        f"project {h['project']}'s {h['device_class']} quota"
        if reason == QUOTA
        else f"{h['device_class']} devices on cluster {h['cluster_id']}"
    )
    ahead = blocker or "an older deployment"
    numbers = {"queue_position": place} | _pick(e, "wanted", "granted")
    said: v.Constraint = {
        "reason": reason,
        "message": (
            f"it is number {place} in the queue for {where}: {ahead}, older, waits ahead of it "
            f"for {reason}, and keeps its place (it is not starved by later, smaller ones)"
        ),
        "numbers": numbers,
    }
    if blocker is not None:
        said["blocker"] = blocker
    unblock = [f"wait for {ahead} ahead in the queue (`wingsmith deployments explain {ahead}`)"]
    if around.blocker is not None:
        unblock += [f"for {ahead}: {change}" for change in around.blocker["unblock"]]
    return said, unblock, f"waits behind {ahead} (number {place} in the queue)"
