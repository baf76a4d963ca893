"""REST resources composed from projection views, and `{ref}`: an id or a readable name.

Pure functions over a `Views` (the mirror the gateway keeps), so they are tested without a
server. A reference that names nothing is a 404 problem; one that names several things is a 409
listing them, so the caller can use an id instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from wingsmith.domain.deployment import AdmissionPhase
from wingsmith.domain.discovery import DiscoveryState
from wingsmith.domain.values import is_name
from wingsmith.projections.base import View
from wingsmith.services.api.problems import Problem


class Views(Protocol):
    def get(self, projection: str, key: str) -> View | None: ...

    def all(self, projection: str) -> Iterable[View]: ...


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
    """A workload's id is its name. One the views do not have yet (another API process has
    just created it) is still tried: the hub has the last word."""
    return _one("workload", ref, [ref] if views.get("workloads", ref) or is_name(ref) else [])


def deployment_id(views: Views, ref: str) -> str:
    """`<workload>--<cluster>` (the id), `<workload>/<cluster>` or `<workload>@<cluster>`, or a
    workload's name when it has one deployment."""
    if views.get("deployment_health", ref):
        return ref
    for separator in ("/", "@"):
        workload, found, cluster = ref.partition(separator)
        key = f"{workload}--{cluster}"
        if found and views.get("deployment_health", key):
            return key
    parent = views.get("workloads", ref)
    return _one("deployment", ref, sorted(parent["deployments"].values()) if parent else [])


def discovery_id(views: Views, ref: str) -> str:
    """The id (`<cluster>--<namespace>--<name>`), or the DynamoGraphDeployment's name, as
    `<name>`, `<namespace>/<name>` or `<cluster>/<namespace>/<name>`."""
    if views.get("discovered", ref):
        return ref
    matches = [v["discovery_id"] for v in views.all("discovered") if ref in _names(v)]
    return _one("discovered model", ref, matches)


def sighting(views: Views, key: str) -> View:
    view = views.get("discovered", key)
    if view is None:
        raise Problem("not_found", f"no discovered model {key!r}", field="ref")
    return view


def _names(v: View) -> tuple[str, ...]:
    name, namespace = v["name"], v["namespace"]
    return (name, f"{namespace}/{name}", f"{v['cluster_id']}/{namespace}/{name}")


def cluster(views: Views, ref: str) -> dict[str, Any]:
    """A cluster with its capacity per device class."""
    view = views.get("clusters", ref)
    if view is None:
        raise Problem("not_found", f"no cluster {ref!r}", field="ref")
    return view | {"capacity": capacity(views, cluster=ref)}


def capacity(
    views: Views, *, cluster: str | None = None, device_class: str | None = None
) -> list[View]:
    """Devices per cluster and class: total, allocated, reserved by admission, free."""
    rows = [
        row
        for row in views.all("capacity")
        if cluster in (None, row["cluster_id"]) and device_class in (None, row["device_class"])
    ]
    return sorted(rows, key=lambda row: (row["cluster_id"], row["device_class"]))


def clusters(views: Views) -> list[dict[str, Any]]:
    """Every cluster with its capacity (one pass over the capacity rows)."""
    rows = _grouped(views.all("capacity"), "cluster_id", "device_class")
    return [
        v | {"capacity": rows.get(v["cluster_id"], [])}
        for v in _sorted(views.all("clusters"), "cluster_id")
    ]


def project(views: Views, name: str) -> dict[str, Any]:
    """A project's quota and use per device class."""
    found = [p for p in projects(views) if p["project"] == name]
    if not found:
        raise Problem(
            "not_found", f"no project {name!r} (a project exists once a quota is set)", field="ref"
        )
    return found[0]


def projects(views: Views) -> list[dict[str, Any]]:
    rows = _grouped(views.all("quota_use"), "project", "device_class")
    return [{"project": name, "quotas": quotas} for name, quotas in sorted(rows.items())]


def replicas_by_deployment(views: Views) -> dict[str, list[View]]:
    return _grouped(views.all("allocations"), "deployment_id", "replica_id")


def _grouped(rows: Iterable[View], by: str, order: str) -> dict[str, list[View]]:
    """Rows by the value of `by`, each group in `order`."""
    grouped: dict[str, list[View]] = {}
    for row in _sorted(rows, order):
        grouped.setdefault(row[by], []).append(row)
    return grouped


def deployment(views: Views, key: str, replicas: list[View] | None = None) -> dict[str, Any]:
    """The plane's declaration and the cluster's answer for one deployment, with its replicas
    (found by scanning unless the caller grouped them already)."""
    view = views.get("deployment_health", key)
    if view is None:
        raise Problem("not_found", f"no deployment {key!r}", field="ref")
    if replicas is None:
        replicas = replicas_by_deployment(views).get(key, [])
    admission = view["admission"]
    return view | {
        "admission_phase": admission["phase"],
        "admission_reason": admission["reason"],
        "replicas": replicas,
    }


def deployments(
    views: Views, *, workload: str | None = None, cluster: str | None = None
) -> list[dict[str, Any]]:
    grouped = replicas_by_deployment(views)
    return [
        deployment(views, v["deployment_id"], grouped.get(v["deployment_id"], []))
        for v in _sorted(views.all("deployment_health"), "deployment_id")
        if workload in (None, v["workload_id"]) and cluster in (None, v["cluster_id"])
    ]


def workload(views: Views, key: str) -> dict[str, Any]:
    """The declared workload, its phase, and each deployment's place in it."""
    view = views.get("workloads", key)
    if view is None:
        raise Problem("not_found", f"no workload {key!r}", field="ref")
    phases = views.get("workload_phase", key) or {"phase": AdmissionPhase.PENDING}
    return view | {
        "phase": phases["phase"],
        "deployments": [_placement(views, d) for d in sorted(view["deployments"].values())],
    }


def _placement(views: Views, key: str) -> dict[str, Any]:
    health = views.get("deployment_health", key) or {}
    admission = health.get("admission", {})
    return {
        "deployment_id": key,
        "cluster_id": health.get("cluster_id"),
        "admission_phase": admission.get("phase"),
        "admission_reason": admission.get("reason"),
        "desired_replicas": health.get("desired_replicas"),
        "ready_replicas": health.get("ready_replicas"),
        "live_digests": health.get("live_digests", {}),
    }


def workloads(
    views: Views, *, project: str | None = None, phase: str | None = None
) -> list[dict[str, Any]]:
    found = [
        workload(views, v["workload_id"])
        for v in _sorted(views.all("workloads"), "workload_id")
        if project in (None, v["project"])
    ]
    return [w for w in found if phase in (None, w["phase"])]


def discovered(
    views: Views, *, include_ignored: bool = False, cluster: str | None = None
) -> list[View]:
    return [
        v
        for v in _sorted(views.all("discovered"), "discovery_id")
        if (include_ignored or v["state"] != DiscoveryState.IGNORED)
        and cluster in (None, v["cluster_id"])
    ]


def _sorted(views: Iterable[View], key: str) -> list[View]:
    return sorted(views, key=lambda v: str(v[key]))
