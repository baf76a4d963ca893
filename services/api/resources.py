"""REST resources composed from projection views, and `{ref}`: an id or a readable name.

Pure functions over a `Views` (the mirror the gateway keeps), so they are tested without a
server. A reference that names nothing is a 404 problem; one that names several things is a 409
listing them, so the caller can use an id instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar, cast

from wingsmith.domain.contracts import views as v
from wingsmith.domain.deployment import AdmissionPhase
from wingsmith.domain.discovery import DiscoveryState
from wingsmith.domain.explain import Around, explain, explain_unplaced
from wingsmith.domain.values import is_name
from wingsmith.services.api.problems import Problem

D = TypeVar("D", bound=Mapping[str, Any])  # a view document


class Views(Protocol):
    def get(self, projection: str, key: str) -> Mapping[str, Any] | None: ...

    def all(self, projection: str) -> Iterable[Mapping[str, Any]]: ...


def _get(views: Views, kind: v.Kind[D], key: str) -> D | None:
    """One view, as the document its projection publishes (the mirror holds them as read)."""
    return cast("D | None", views.get(kind.name, key))


def _all(views: Views, kind: v.Kind[D]) -> Iterable[D]:
    return cast("Iterable[D]", views.all(kind.name))


def _one(kind: str, ref: str, matches: list[str]) -> str:
    if not matches:
        raise Problem("not_found", f"no {kind} {ref!r}", field="ref")
    if len(matches) > 1:
        raise Problem(
            "ambiguous_reference",
            f"{ref!r} names {len(matches)} {kind}s: use one of their ids",
            field="ref",
            details={"candidates": sorted(matches)},
        )
    return matches[0]


def workload_id(views: Views, ref: str) -> str:
    """A workload is addressed by its name (its views' key, and what commands take): the name's
    current incarnation. One the views do not have yet (another API process has just created
    it) is still tried: the hub has the last word."""
    return _one("workload", ref, [ref] if _get(views, v.WORKLOADS, ref) or is_name(ref) else [])


def _incarnation(views: Views, name: str) -> str:
    """The id of the current incarnation of the workload called `name` (the name itself when
    the views have no such workload: the first incarnation's id is its name)."""
    view = _get(views, v.WORKLOADS, name)
    return name if view is None else view["workload_id"]


def deployment_id(views: Views, ref: str) -> str:
    """`<workload id>--<cluster>` (the id), `<workload>/<cluster>` or `<workload>@<cluster>` (of
    the workload's current incarnation), or a workload's name when it has one deployment."""
    if _get(views, v.DEPLOYMENT_HEALTH, ref):
        return ref
    for separator in ("/", "@"):
        workload, found, cluster = ref.partition(separator)
        key = f"{_incarnation(views, workload)}--{cluster}"
        if found and _get(views, v.DEPLOYMENT_HEALTH, key):
            return key
    parent = _get(views, v.WORKLOADS, ref)
    return _one("deployment", ref, sorted(parent["deployments"].values()) if parent else [])


def discovery_id(views: Views, ref: str) -> str:
    """The id (`<cluster>--<namespace>--<name>`), or the DynamoGraphDeployment's name, as
    `<name>`, `<namespace>/<name>` or `<cluster>/<namespace>/<name>`."""
    if _get(views, v.DISCOVERED, ref):
        return ref
    matches = [d["discovery_id"] for d in _all(views, v.DISCOVERED) if ref in _names(d)]
    return _one("discovered model", ref, matches)


def sighting(views: Views, key: str) -> v.DiscoveredView:
    view = _get(views, v.DISCOVERED, key)
    if view is None:
        raise Problem("not_found", f"no discovered model {key!r}", field="ref")
    return view


def _names(d: v.DiscoveredView) -> tuple[str, ...]:
    name, namespace = d["name"], d["namespace"]
    return (name, f"{namespace}/{name}", f"{d['cluster_id']}/{namespace}/{name}")


def cluster(views: Views, ref: str) -> v.Cluster:
    """A cluster with its capacity per device class."""
    view = _get(views, v.CLUSTERS, ref)
    if view is None:
        raise Problem("not_found", f"no cluster {ref!r}", field="ref")
    return {**view, "capacity": capacity(views, cluster=ref)}


def nodes(views: Views, ref: str, *, device_class: str | None = None) -> list[v.NodeCapacityView]:
    """A cluster's nodes, each with what it can take and what live replicas hold on it."""
    if _get(views, v.CLUSTERS, ref) is None:
        raise Problem("not_found", f"no cluster {ref!r}", field="ref")
    found = [
        node
        for node in _all(views, v.CAPACITY_NODES)
        if node["cluster_id"] == ref and device_class in (None, node["device_class"])
    ]
    return sorted(found, key=lambda node: (node["device_class"], node["node_id"]))


def capacity(
    views: Views, *, cluster: str | None = None, device_class: str | None = None
) -> list[v.CapacityRow]:
    """Devices per cluster and class: total, on unschedulable nodes, held outside Wingsmith,
    allocated, reserved by admission, and free (negative when over-committed)."""
    rows = [
        row
        for row in _all(views, v.CAPACITY)
        if cluster in (None, row["cluster_id"]) and device_class in (None, row["device_class"])
    ]
    return sorted(rows, key=lambda row: (row["cluster_id"], row["device_class"]))


def clusters(views: Views) -> list[v.Cluster]:
    """Every cluster with its capacity (one pass over the capacity rows)."""
    rows = _grouped(_all(views, v.CAPACITY), "cluster_id", "device_class")
    return [
        {**c, "capacity": rows.get(c["cluster_id"], [])}
        for c in _sorted(_all(views, v.CLUSTERS), "cluster_id")
    ]


def project(views: Views, name: str) -> v.Project:
    """A project's quota and use per device class."""
    found = [p for p in projects(views) if p["project"] == name]
    if not found:
        raise Problem(
            "not_found", f"no project {name!r} (a project exists once a quota is set)", field="ref"
        )
    return found[0]


def projects(views: Views) -> list[v.Project]:
    rows = _grouped(_all(views, v.QUOTA_USE), "project", "device_class")
    return [{"project": name, "quotas": quotas} for name, quotas in sorted(rows.items())]


def replicas_by_deployment(views: Views) -> dict[str, list[v.AllocationView]]:
    return _grouped(_all(views, v.ALLOCATIONS), "deployment_id", "replica_id")


def _grouped(rows: Iterable[D], by: str, order: str) -> dict[str, list[D]]:
    """Rows by the value of `by`, each group in `order`."""
    grouped: dict[str, list[D]] = {}
    for row in _sorted(rows, order):
        grouped.setdefault(row[by], []).append(row)
    return grouped


def deployment(
    views: Views, key: str, replicas: list[v.AllocationView] | None = None
) -> v.Deployment:
    """The plane's declaration and the cluster's answer for one deployment, with its replicas
    (found by scanning unless the caller grouped them already)."""
    view = _get(views, v.DEPLOYMENT_HEALTH, key)
    if view is None:
        raise Problem("not_found", f"no deployment {key!r}", field="ref")
    if replicas is None:
        replicas = replicas_by_deployment(views).get(key, [])
    admission = view["admission"]
    return {
        **view,
        "admission_phase": admission["phase"],
        "admission_reason": admission["reason"],
        "replicas": replicas,
    }


def deployments(
    views: Views, *, workload: str | None = None, cluster: str | None = None
) -> list[v.Deployment]:
    """Each deployment, or those of the current incarnation of the workload named `workload`,
    or on `cluster`."""
    grouped = replicas_by_deployment(views)
    workload = None if workload is None else _incarnation(views, workload)
    return [
        deployment(views, d["deployment_id"], grouped.get(d["deployment_id"], []))
        for d in _sorted(_all(views, v.DEPLOYMENT_HEALTH), "deployment_id")
        if workload in (None, d["workload_id"]) and cluster in (None, d["cluster_id"])
    ]


def explanation(views: Views, ref: str) -> v.Explanation:
    """Why a deployment waits and what would unblock it (domain/explain.py); `ref` as for a
    deployment, or a workload placement found nowhere to go (it has no deployment)."""
    parent = _get(views, v.WORKLOADS, ref)
    if parent is not None and not parent["deployments"] and parent["unplaced"]:
        return explain_unplaced(parent, reported_classes(views))
    return _explained(views, deployment_id(views, ref), blockers=1)


def _explained(views: Views, key: str, blockers: int) -> v.Explanation:
    """One deployment explained, with its blocker's explanation (`blockers` deep) inside."""
    health = _get(views, v.DEPLOYMENT_HEALTH, key)
    if health is None:
        raise Problem("not_found", f"no deployment {key!r}", field="ref")
    blocker = health["admission"].get("blocker")
    ahead = None
    if blocker is not None and blockers and _get(views, v.DEPLOYMENT_HEALTH, blocker):
        ahead = _explained(views, blocker, blockers - 1)
    cluster_id, device_class = health["cluster_id"], health["device_class"]
    nodes_free = {
        node["node_id"]: node["free"]
        for node in _all(views, v.CAPACITY_NODES)
        if (node["cluster_id"], node["device_class"]) == (cluster_id, device_class)
    }
    found = _get(views, v.CLUSTERS, cluster_id)
    around = Around(
        nodes_free=dict(sorted(nodes_free.items())),
        cluster_classes=[c for c, n in (found["devices"] if found else {}).items() if n > 0],
        reported=reported_classes(views),
        blocker=ahead,
    )
    return explain(health, around)


def reported_classes(views: Views) -> list[str]:
    """The device classes some cluster's inventory reports."""
    return sorted(
        {c for found in _all(views, v.CLUSTERS) for c, n in found["devices"].items() if n}
    )


def workload(views: Views, key: str) -> v.Workload:
    """The declared workload (the current incarnation of the name `key`), its phase, and each
    deployment's place in it."""
    view = _get(views, v.WORKLOADS, key)
    if view is None:
        raise Problem("not_found", f"no workload {key!r}", field="ref")
    phases = _get(views, v.WORKLOAD_PHASE, key)
    if phases is not None and phases["workload_id"] != view["workload_id"]:
        phases = None  # the views have not caught up with a new incarnation yet
    placements = [_placement(views, d) for d in sorted(view["deployments"].values())]
    return {  # the declared deployments (by cluster) give way to their placements
        **view,
        "phase": AdmissionPhase.PENDING if phases is None else phases["phase"],
        "deployments": placements,
    }


def _placement(views: Views, key: str) -> v.Placement:
    health = _get(views, v.DEPLOYMENT_HEALTH, key)
    if health is None:  # the views do not show this deployment yet
        return {
            "deployment_id": key,
            "cluster_id": None,
            "admission_phase": None,
            "admission_reason": None,
            "desired_replicas": None,
            "ready_replicas": None,
            "waiting_replicas": None,
            "live_digests": {},
        }
    admission = health["admission"]
    return {
        "deployment_id": key,
        "cluster_id": health["cluster_id"],
        "admission_phase": admission["phase"],
        "admission_reason": admission["reason"],
        "desired_replicas": health["desired_replicas"],
        "ready_replicas": health["ready_replicas"],
        "waiting_replicas": health["waiting_replicas"],
        "live_digests": health["live_digests"],
    }


def workloads(
    views: Views, *, project: str | None = None, phase: str | None = None
) -> list[v.Workload]:
    found = [
        workload(views, w["name"])
        for w in _sorted(_all(views, v.WORKLOADS), "name")
        if project in (None, w["project"])
    ]
    return [w for w in found if phase in (None, w["phase"])]


def discovered(
    views: Views, *, include_ignored: bool = False, cluster: str | None = None
) -> list[v.DiscoveredView]:
    return [
        d
        for d in _sorted(_all(views, v.DISCOVERED), "discovery_id")
        if (include_ignored or d["state"] != DiscoveryState.IGNORED)
        and cluster in (None, d["cluster_id"])
    ]


def _sorted(views: Iterable[D], key: str) -> list[D]:
    return sorted(views, key=lambda d: str(d[key]))
