"""A deployment's status from its DynamoGraphDeployment and its pods. Pure.

Replicas are counted whole: a disaggregated replica is a prefill and a decode worker, a multinode
worker all of its pods, so a replica is ready only when all of it is. Dynamo (0.8 on) reports per
component how many whole replicas are ready (`status.components`, or `status.services` on
v1alpha1); older operators report none, and the pods are counted instead.

Transient trouble is a condition beside the phase, never the phase `failed`: a container that
cannot pull its image, crash-loops or was OOM-killed, and a DGD in state `failed` (the Dynamo
operator keeps retrying it). The kubelet and the Dynamo operator retry these by themselves, so the
condition goes when its cause does.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from wingsmith.domain.deployment import MAX_CONDITIONS, ClusterPhase, DeploymentStatus
from wingsmith.domain.deployment import StatusCondition as Condition
from wingsmith.domain.discovery import WORKER_ROLES
from wingsmith.services.operator.inspect import engine_component_names
from wingsmith.services.operator.plan import components, role

Obj = dict[str, Any]

COMPONENT_LABEL = "nvidia.com/dynamo-component"
# the index of a multinode replica's pod group, as Grove and LeaderWorkerSet label pods
GROUP_LABELS = (
    "grove.io/podcliquescalinggroup-replica-index",
    "leaderworkerset.sigs.k8s.io/group-index",
)
WAITING = {"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError"}
OOM = "OOMKilled"
ROLLING = {"Pending", "InProgress"}
_REASON = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def deployment_status(
    dgd: Obj, pods: Iterable[Obj], desired_replicas: int | None, extra: Iterable[Condition] = ()
) -> DeploymentStatus:
    """The status of the deployment `dgd` runs, with `pods` its pods; `extra`: conditions the
    operator adds (an API server it could not reach, say)."""
    status, meta = dgd.get("status") or {}, dgd.get("metadata") or {}
    pods = list(pods)
    engines = engine_component_names(dgd)  # a legacy `main` frontend runs no engine
    workers = {
        name: c
        for name, c in components(dgd.get("spec") or {}).items()
        if (name in engines if engines is not None else role(c) in WORKER_ROLES)
    }
    ready = ready_replicas(workers, status, pods)
    wanted = desired_replicas if desired_replicas is not None else _spec_replicas(workers)
    ready_condition: Obj = next(
        (c for c in status.get("conditions") or () if c.get("type") == "Ready"), {}
    )
    conditions = [*pod_conditions(pods), *_dgd_conditions(status, ready_condition), *extra]
    phase, reason = _phase(status, meta, ready, wanted)
    return DeploymentStatus.model_construct(
        phase=phase,
        reason=reason or ready_condition.get("reason") or None,
        message=str(ready_condition.get("message") or "")[:4096] or None,
        ready_replicas=ready,
        desired_replicas=wanted,
        conditions=tuple(conditions[:MAX_CONDITIONS]),
    )


def _phase(status: Obj, meta: Obj, ready: int, wanted: int) -> tuple[ClusterPhase, str | None]:
    """Ready only when the status is about the current spec, no rolling update is under way,
    and every wanted replica is ready; a DGD in state `failed` is progressing (it is retried)."""
    if not status:
        return ClusterPhase.UNKNOWN, None
    observed, generation = status.get("observedGeneration"), meta.get("generation")
    if observed is not None and generation is not None and int(observed) < int(generation):
        return ClusterPhase.PROGRESSING, "StatusNotYetObserved"
    if ((status.get("rollingUpdate") or {}).get("phase")) in ROLLING:
        return ClusterPhase.PROGRESSING, "RollingUpdate"
    state = str(status.get("state") or "")
    if state == "pending":
        return ClusterPhase.PENDING, None
    if state == "successful" and ready >= wanted:
        return ClusterPhase.READY, None
    return ClusterPhase.PROGRESSING, None


def ready_replicas(workers: Mapping[str, Obj], status: Obj, pods: list[Obj]) -> int:
    """Whole ready replicas: each worker component's ready replicas, in proportion to its
    share of the graph (a prefill and a decode worker make one replica), the least of them."""
    if not workers:
        return 0
    reported = status.get("components") or status.get("services") or {}
    base = min(_replicas(c) for c in workers.values()) or 1
    counts = []
    for name, component in workers.items():
        entry = reported.get(name) if isinstance(reported, dict) else None
        if isinstance(entry, dict) and entry.get("readyReplicas") is not None:
            ready = int(entry.get("readyReplicas") or 0)  # Dynamo counts whole replicas
        else:
            ready = _ready_from_pods(name, component, pods)
        share = max(_replicas(component) // base, 1)
        counts.append(ready // share)
    return min(counts)


def _ready_from_pods(name: str, component: Obj, pods: list[Obj]) -> int:
    """Ready replicas of one component counted from its pods (operators before 0.8): a
    multinode replica counts when all of its nodes' pods are ready."""
    nodes = int((component.get("multinode") or {}).get("nodeCount") or 1)
    mine = [p for p in pods if _labels(p).get(COMPONENT_LABEL) == name and _alive(p)]
    if nodes <= 1:
        return sum(1 for p in mine if _ready(p))
    groups: dict[str, list[Obj]] = {}
    for pod in mine:
        index = next((_labels(pod)[k] for k in GROUP_LABELS if k in _labels(pod)), None)
        if index is None:  # no group label: as many whole replicas as ready pods fill
            return sum(1 for p in mine if _ready(p)) // nodes
        groups.setdefault(index, []).append(pod)
    return sum(1 for g in groups.values() if len(g) >= nodes and all(_ready(p) for p in g))


def pod_conditions(pods: Iterable[Obj]) -> list[Condition]:
    """The containers' trouble, one condition per reason, with how many pods show it and the
    first one's message."""
    counts: Counter[str] = Counter()
    messages: dict[str, str] = {}
    for pod in pods:
        for reason, message in sorted(_pod_troubles(pod).items()):
            counts[reason] += 1
            messages.setdefault(reason, f"{pod['metadata'].get('name')}: {message}"[:1024])
    return [
        Condition.model_construct(reason=r, message=messages[r], permanent=False, pods=n)
        for r, n in sorted(counts.items())
    ]


def _pod_troubles(pod: Obj) -> dict[str, str]:
    if not _alive(pod):
        return {}
    status = pod.get("status") or {}
    troubles: dict[str, str] = {}
    for c in [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in WAITING:
            troubles[waiting["reason"]] = str(waiting.get("message") or waiting["reason"])
        for when in ("state", "lastState"):
            terminated = (c.get(when) or {}).get("terminated") or {}
            if terminated.get("reason") == OOM:
                troubles[OOM] = f"container {c.get('name')} was killed for using too much memory"
    return troubles


def _dgd_conditions(status: Obj, ready_condition: Obj) -> list[Condition]:
    """A DGD in state `failed`: transient, for the Dynamo operator retries it."""
    if status.get("state") != "failed":
        return []
    reason = str(ready_condition.get("reason") or "")
    return [
        Condition.model_construct(
            reason=reason if _REASON.match(reason) else "Failed",
            message=str(ready_condition.get("message") or "the DynamoGraphDeployment failed")[
                :1024
            ],
            permanent=False,
            pods=0,
        )
    ]


def _spec_replicas(workers: Mapping[str, Obj]) -> int:
    return min((_replicas(c) for c in workers.values()), default=0)


def _replicas(component: Obj) -> int:
    return int(component.get("replicas", 1) or 0)


def _labels(pod: Obj) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _alive(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in {"Succeeded", "Failed"} and not (
        pod.get("metadata") or {}
    ).get("deletionTimestamp")


def _ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )
