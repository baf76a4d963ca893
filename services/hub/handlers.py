"""Command handlers: load aggregates, call their command methods, say what happened.

A handler never does I/O itself; it works through a `Repository`, so the hub can run many
commands against cached aggregates and save them all in one transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar

from wingsmith.domain import commands as c
from wingsmith.domain import engine_flags
from wingsmith.domain.base import (
    Aggregate,
    AlreadyExists,
    Cause,
    DomainError,
    InvalidValue,
    NotFound,
)
from wingsmith.domain.cluster import Cluster
from wingsmith.domain.contracts.reports import ReplicaState, SyncedReplica
from wingsmith.domain.deployment import (
    AdmissionReason,
    Authority,
    Deployment,
)
from wingsmith.domain.device_classes import check_device_class
from wingsmith.domain.discovery import Discovery, Sighting
from wingsmith.domain.project import Project
from wingsmith.domain.replica import Known, Replica, Roster, reconcile
from wingsmith.domain.values import ResourceRef, ServingConfig
from wingsmith.domain.workload import PlacementReason, Workload
from wingsmith.domain.workload_name import WorkloadName, check_free, incarnation_id

A = TypeVar("A", bound=Aggregate)


class Repository(Protocol):
    def get(self, cls: type[A], key: str) -> A | None: ...

    def add(self, aggregate: Aggregate) -> None: ...

    def reported_device_classes(self) -> Collection[str]:
        """The device classes some cluster's latest inventory reports."""
        ...


def _require(repo: Repository, cls: type[A], key: str, field: str) -> A:
    aggregate = repo.get(cls, key)
    if aggregate is None:
        raise NotFound(f"{cls.kind} {key!r} does not exist", field=field)
    return aggregate


def _check_engine_args(serving: ServingConfig, engine_args: Sequence[str]) -> None:
    """Engine arguments that fight what the renderer spells from `serving` are refused. Not
    for an adopted deployment: the operator never renders its graph, and rewrites its worker's
    flags with engine_args whole (services/operator/plan.py), `--model` and all."""
    problems = engine_flags.conflicts(serving, engine_args)
    if problems:
        raise InvalidValue("; ".join(problems), field="engine_args", flags=problems)


def set_quota(repo: Repository, cmd: c.SetQuota, cause: Cause) -> dict[str, Any]:
    project = repo.get(Project, cmd.project)
    if project is None:
        project = Project.register(cause, cmd.project)
        repo.add(project)
    project.set_quota(cause, cmd.device_class, cmd.devices)
    return {"project": project.key, "quota": project.quota}


def register_cluster(repo: Repository, cmd: c.RegisterCluster, cause: Cause) -> dict[str, Any]:
    cluster = repo.get(Cluster, cmd.cluster_id)
    if cluster is None:
        repo.add(Cluster.register(cause, cmd.cluster_id, cmd.region, dict(cmd.labels)))
    elif (cluster.region, cluster.labels) != (cmd.region, cmd.labels):
        raise AlreadyExists(
            f"cluster {cmd.cluster_id!r} is registered with other region or labels",
            field="cluster_id",
        )
    return {"cluster_id": cmd.cluster_id}


def report_inventory(repo: Repository, cmd: c.ReportInventory, cause: Cause) -> dict[str, Any]:
    cluster = _require(repo, Cluster, cmd.cluster_id, "cluster_id")
    cluster.report_inventory(cause, tuple(cmd.nodes))
    return {"cluster_id": cluster.key, "devices": cluster.devices()}


def create_workload(repo: Repository, cmd: c.CreateWorkload, cause: Cause) -> dict[str, Any]:
    """A new workload under its name: the name's first incarnation, or the next one when the
    workload that had it was deleted."""
    project = _require(repo, Project, cmd.project, "project")
    if cmd.device_class not in project.quota:  # a class with a quota is known: no look-up
        check_device_class(cmd.device_class, repo.reported_device_classes(), project.quota)
    for cluster in [cmd.cluster] if cmd.cluster is not None else cmd.clusters or ():
        _require(repo, Cluster, cluster, "cluster" if cmd.cluster else "clusters")
    for cluster in cmd.preferred_clusters:
        _require(repo, Cluster, cluster, "preferred_clusters")
    workload_id, incarnation = _claim(repo, cause, cmd.workload_id)
    workload = Workload.create(
        cause,
        workload_id,
        name=cmd.workload_id,
        incarnation=incarnation,
        project=cmd.project,
        device_class=cmd.device_class,
        serving=cmd.serving,
        replicas=cmd.replicas,
        cluster_pin=cmd.cluster,
        allowed_clusters=None if cmd.clusters is None else tuple(dict.fromkeys(cmd.clusters)),
        engine_args=tuple(cmd.engine_args),
        preferences=cmd.preferences(),
    )
    repo.add(workload)
    if cmd.cluster is not None:  # pinned: its one deployment exists from the start
        _add_deployment(repo, cause, workload, cmd.cluster, cmd.replicas, field="workload_id")
    return _workload_result(workload)


def _named(repo: Repository, name: str) -> Workload | None:
    """The current incarnation of the workload called `name`, deleted or not. A name with no
    record of its incarnations was never reused: its workload's id is the name."""
    claimed = repo.get(WorkloadName, name)
    workload = repo.get(Workload, claimed.current if claimed is not None else name)
    return workload if workload is not None and workload.name == name else None


def _current(repo: Repository, name: str) -> Workload:
    """The workload a command addressed by name is for: the name's current incarnation."""
    workload = _named(repo, name)
    if workload is None:
        raise NotFound(f"workload {name!r} does not exist", field="workload_id")
    return workload


def _claim(repo: Repository, cause: Cause, name: str) -> tuple[str, int]:
    """Claim `name` for a new workload: its id and incarnation. Refused while the workload
    that has the name is not deleted. A name's first workload, whose id is the name, needs no
    record (two racing for it both create that workload); once one has another id, the name's
    record says which, and two claims racing for it change the record at one version: the
    store keeps one."""
    current = _named(repo, name)
    if current is not None:
        check_free(name, current.key, deleted=current.deleted)
    claimed = repo.get(WorkloadName, name)
    incarnation = (claimed.incarnation if claimed else int(current is not None)) + 1
    workload_id = incarnation_id(name, incarnation, lambda key: repo.get(Workload, key) is not None)
    if claimed is None and workload_id != name:
        earlier = () if current is None else (current.key,)
        repo.add(WorkloadName.claim_first(cause, name, workload_id, earlier=earlier))
    elif claimed is not None:
        claimed.claim(cause, workload_id, current_deleted=current is None or current.deleted)
    return workload_id, incarnation


def _add_deployment(
    repo: Repository,
    cause: Cause,
    workload: Workload,
    cluster_id: str,
    replicas: int,
    field: str,
    adopted: Sighting | None = None,
) -> Deployment:
    """The workload's deployment on a cluster: managed, or observed when it is adopted from
    what the sighting saw running there."""
    key = Deployment.key_for(workload.key, cluster_id)
    if repo.get(Deployment, key) is not None:  # `a--b` on `c` and `a` on `b--c` meet here
        raise AlreadyExists(f"deployment {key!r} already exists", field=field)
    authority, imported_args, adopted_from = Authority.MANAGED, None, None
    if adopted is not None:
        primary = adopted.primary()
        authority = Authority.OBSERVED
        imported_args = primary.imported_args if primary else ()
        adopted_from = ResourceRef(namespace=adopted.namespace, name=adopted.name)
    deployment = Deployment.create(
        cause,
        workload_id=workload.key,
        cluster_id=cluster_id,
        project=workload.project,
        device_class=workload.device_class,
        serving=workload.serving,
        desired_replicas=replicas,
        authority=authority,
        engine_args=workload.engine_args,
        imported_args=imported_args,
        adopted=adopted_from,
    )
    repo.add(deployment)
    workload.attach_deployment(cause, cluster_id, deployment.key)
    return deployment


def set_placement_preferences(
    repo: Repository, cmd: c.SetPlacementPreferences, cause: Cause
) -> dict[str, Any]:
    """Where the name's current incarnation should rather go."""
    workload = _current(repo, cmd.workload_id)
    for cluster in cmd.preferred_clusters:
        _require(repo, Cluster, cluster, "preferred_clusters")
    workload.set_preferences(cause, cmd.preferences())
    return _workload_result(workload) | {
        "preferences": workload.preferences.model_dump(mode="json")
    }


def scale_workload(repo: Repository, cmd: c.ScaleWorkload, cause: Cause) -> dict[str, Any]:
    """A pinned workload's one deployment scales with it; otherwise placement re-divides."""
    workload = _current(repo, cmd.workload_id)
    workload.scale(cause, cmd.replicas)
    key = workload.deployments.get(workload.cluster_pin or "")
    if workload.cluster_pin is not None and key is not None:
        _require(repo, Deployment, key, "workload_id").scale(cause, workload.replicas)
    return _workload_result(workload)


def delete_workload(repo: Repository, cmd: c.DeleteWorkload, cause: Cause) -> dict[str, Any]:
    """The workload and every deployment of it, in one command: either all are deleted or
    none is. Its name is free again for a new workload from then on."""
    workload = _current(repo, cmd.workload_id)
    workload.delete(cause)
    for key in workload.deployments.values():
        _require(repo, Deployment, key, "workload_id").delete(cause)
    return _workload_result(workload) | {"deleted": True}


class StalePlacement(DomainError):
    code = "stale_placement"


def place_workload(repo: Repository, cmd: c.PlaceWorkload, cause: Cause) -> dict[str, Any]:
    workload = _require(repo, Workload, cmd.workload_id, "workload_id")
    workload.check_not_deleted()
    if (workload.replicas, workload.serving_digest) != (cmd.replicas, cmd.serving_digest):
        raise StalePlacement("the workload changed since placement looked", field="replicas")
    if not cmd.shares:
        reason = None if cmd.reason is None else PlacementReason(cmd.reason)
        workload.defer_placement(cause, cmd.message or "no cluster to place it on", reason)
    for cluster_id, share in cmd.shares.items():
        key = workload.deployments.get(cluster_id)
        if key is None:
            if cluster_id in cmd.previous:
                raise StalePlacement(f"no deployment on {cluster_id!r} any more", field="shares")
            _require(repo, Cluster, cluster_id, "shares")
            _add_deployment(repo, cause, workload, cluster_id, share, field="shares")
            continue
        deployment = _require(repo, Deployment, key, "shares")
        if deployment.desired_replicas != cmd.previous.get(cluster_id):
            raise StalePlacement(f"{key!r} was scaled since placement looked", field="shares")
        deployment.scale(cause, share)
    if cmd.move is not None:
        _move(repo, workload, cmd.move, cmd, cause)
    return _workload_result(workload) | {"shares": cmd.shares}


def _move(
    repo: Repository, workload: Workload, move: c.MoveSpec, cmd: c.PlaceWorkload, cause: Cause
) -> None:
    """A placement that moves replicas says so, and why; a lost cluster's deployment whose
    whole share left is disabled (kept: its operator takes it down when the cluster returns),
    and a disabled one taking replicas again is enabled."""
    workload.record_move(cause, move.from_cluster, move.to_cluster, move.replicas, move.reason)
    for cluster, enabled in ((cmd.disable, False), (cmd.enable, True)):
        if cluster is None:
            continue
        key = workload.deployments.get(cluster)
        if key is None:
            raise StalePlacement(f"no deployment on {cluster!r} any more", field="move")
        deployment = _require(repo, Deployment, key, "move")
        if deployment.enabled == enabled:
            raise StalePlacement(f"{key!r} was enabled or disabled meanwhile", field="move")
        (deployment.enable if enabled else deployment.disable)(cause)


def change_serving_config(
    repo: Repository, cmd: c.ChangeServingConfig, cause: Cause
) -> dict[str, Any]:
    workload = _current(repo, cmd.workload_id)
    found = (repo.get(Deployment, key) for key in workload.deployments.values())
    rendered = [d for d in found if d is not None and d.adopted is None]
    for args in (workload.engine_args, *(d.engine_args for d in rendered)):
        _check_engine_args(cmd.serving, args)  # the new config may render what they set
    if workload.change_serving_config(cause, cmd.serving):
        for key in workload.deployments.values():
            _require(repo, Deployment, key, "workload_id").change_serving_config(cause, cmd.serving)
    return _workload_result(workload)


def set_cluster_reachability(
    repo: Repository, cmd: c.SetClusterReachability, cause: Cause
) -> dict[str, Any]:
    cluster = _require(repo, Cluster, cmd.cluster_id, "cluster_id")
    cluster.set_reachable(cause, cmd.reachable)
    return {"cluster_id": cluster.key, "reachable": cluster.reachable}


def enable_deployment(repo: Repository, cmd: c.EnableDeployment, cause: Cause) -> dict[str, Any]:
    deployment = _require(repo, Deployment, cmd.deployment_id, "deployment_id")
    deployment.enable(cause)
    return _deployment_result(deployment)


def disable_deployment(repo: Repository, cmd: c.DisableDeployment, cause: Cause) -> dict[str, Any]:
    deployment = _require(repo, Deployment, cmd.deployment_id, "deployment_id")
    deployment.disable(cause)
    return _deployment_result(deployment)


def set_engine_args(repo: Repository, cmd: c.SetEngineArgs, cause: Cause) -> dict[str, Any]:
    deployment = _require(repo, Deployment, cmd.deployment_id, "deployment_id")
    if deployment.adopted is None:  # an adopted graph's engine_args are its worker's whole argv
        _check_engine_args(deployment.serving, cmd.engine_args)
    deployment.set_engine_args(cause, tuple(cmd.engine_args))
    return _deployment_result(deployment)


def promote_authority(repo: Repository, cmd: c.PromoteAuthority, cause: Cause) -> dict[str, Any]:
    deployment = _require(repo, Deployment, cmd.deployment_id, "deployment_id")
    deployment.promote_authority(cause, force=cmd.force)
    return _deployment_result(deployment)


def decide_admission(repo: Repository, cmd: c.DecideAdmission, cause: Cause) -> dict[str, Any]:
    deployment = _require(repo, Deployment, cmd.deployment_id, "deployment_id")
    deployment.decide_admission(
        cause,
        admitted=cmd.admitted,
        reason=None if cmd.reason is None else AdmissionReason(cmd.reason),
        evidence=dict(cmd.evidence),
        devices=cmd.devices,
        blocker=cmd.blocker,
    )
    return _deployment_result(deployment) | {
        "admission_phase": deployment.admission_phase.value,
        "granted_devices": deployment.granted_devices,
    }


def observe_replica(repo: Repository, cmd: c.ObserveReplica, cause: Cause) -> dict[str, Any]:
    """A replica as its cluster saw it; the deployment's phase follows: placed once a replica
    holds devices, running once one is ready. Seen again, or late, it changes nothing."""
    deployment = _observed(repo, cmd.cluster_id, cmd.deployment_id)
    key = Replica.key_for(deployment.key, cmd.pod)
    replica = repo.get(Replica, key)
    if replica is None:
        _require(repo, Cluster, cmd.cluster_id, "cluster_id").check_devices(
            cmd.node_id, cmd.device_ids
        )
        replica = Replica.start(
            cause,
            deployment_id=deployment.key,
            name=cmd.pod,
            node_id=cmd.node_id,
            device_ids=tuple(cmd.device_ids),
            serving_digest=cmd.serving_digest,
            engine_version=cmd.engine_version,
            version=cmd.version,
        )
        repo.add(replica)
        _roster(repo, deployment.key, cause).join(cause, cmd.pod)
    if not replica.terminated:  # a terminated replica stays terminated: later news is older
        if cmd.state == ReplicaState.READY:
            replica.mark_ready(cause, version=cmd.version)
        elif cmd.state == ReplicaState.NOT_READY:
            replica.mark_not_ready(cause, version=cmd.version)
        elif cmd.state == ReplicaState.TERMINATED:
            _terminate(repo, deployment.key, replica, cause)
    deployment.follow_replicas(cause, [replica])
    return {"replica_id": key, "admission_phase": deployment.admission_phase.value}


def _check_devices(
    repo: Repository, cluster_id: str, pod: c.ObserveReplica | SyncedReplica
) -> None:
    if pod.device_ids:  # a replica that holds none needs no inventory
        _require(repo, Cluster, cluster_id, "cluster_id").check_devices(pod.node_id, pod.device_ids)


def _roster(repo: Repository, deployment_id: str, cause: Cause) -> Roster:
    roster = repo.get(Roster, deployment_id)
    if roster is None:
        roster = Roster.open(cause, deployment_id)
        repo.add(roster)
    return roster


def _terminate(repo: Repository, deployment_id: str, replica: Replica, cause: Cause) -> None:
    replica.terminate(cause)
    roster = repo.get(Roster, deployment_id)
    if roster is not None:
        roster.leave(cause, replica.name)


def observe_sync(repo: Repository, cmd: c.ObserveSync, cause: Cause) -> dict[str, Any]:
    """Everything the cluster has of a deployment, against what the plane holds: replicas the
    cluster no longer has are terminated, ones the plane missed are recorded, readiness is set
    right; then the status and live digests are recorded as any report's. A sync that agrees
    records nothing, and one older than the news the plane has undoes none of it."""
    deployment = _observed(repo, cmd.cluster_id, cmd.deployment_id)
    roster = repo.get(Roster, deployment.key)
    reported = {r.pod: r for r in cmd.replicas}
    replicas: dict[str, Replica] = {}
    for name in (roster.names if roster else set()) | reported.keys():
        replica = repo.get(Replica, Replica.key_for(deployment.key, name))
        if replica is not None:
            replicas[name] = replica
    known = {n: Known(r.ready, r.terminated, r.observed_version) for n, r in replicas.items()}
    plan = reconcile(
        known, {n: r.state == ReplicaState.READY for n, r in reported.items()}, cmd.version
    )
    skipped = _unrecordable(repo, cmd.cluster_id, [reported[name] for name in plan.record])
    for name in plan.terminate:
        _terminate(repo, deployment.key, replicas[name], cause)
    for name in plan.record:
        if name not in skipped:
            replicas[name] = _record_replica(
                repo, deployment.key, reported[name], cmd.version, cause
            )
    for name in plan.ready:
        replicas[name].mark_ready(cause, version=cmd.version)
    for name in plan.not_ready:
        replicas[name].mark_not_ready(cause, version=cmd.version)
    for name in reported.keys() - (roster.names if roster else set()) - set(plan.record):
        if not replicas[name].terminated:  # live, yet recorded before rosters were kept
            _roster(repo, deployment.key, cause).join(cause, name)
    deployment.follow_replicas(cause, replicas.values())
    # recorded only when they say something new: a sync that agrees records nothing
    if cmd.status is not None and cmd.status != deployment.status:
        deployment.record_status(cause, cmd.status, version=cmd.version)
    digests = dict(Counter(r.serving_digest for r in cmd.replicas))
    if digests != deployment.live_digests:
        deployment.observe_live_digests(cause, digests, version=cmd.version)
    return {
        "deployment_id": deployment.key,
        "terminated": list(plan.terminate),
        "recorded": [name for name in plan.record if name not in skipped],
        "skipped": skipped,
        "admission_phase": deployment.admission_phase.value,
    }


def _unrecordable(repo: Repository, cluster_id: str, pods: list[SyncedReplica]) -> dict[str, str]:
    """The missed pods a replica report would be refused for (devices on a node the cluster has
    not reported, say), with why: they are left out, and the rest of the sync still holds."""
    skipped: dict[str, str] = {}
    for pod in pods:
        try:
            _require(repo, Cluster, cluster_id, "cluster_id").check_devices(
                pod.node_id, pod.device_ids
            )
        except InvalidValue as e:
            skipped[pod.pod] = str(e)
    return skipped


def _record_replica(
    repo: Repository, deployment_id: str, pod: SyncedReplica, version: int, cause: Cause
) -> Replica:
    replica = Replica.start(
        cause,
        deployment_id=deployment_id,
        name=pod.pod,
        node_id=pod.node_id,
        device_ids=tuple(pod.device_ids),
        serving_digest=pod.serving_digest,
        engine_version=pod.engine_version,
        version=version,
    )
    repo.add(replica)
    _roster(repo, deployment_id, cause).join(cause, pod.pod)
    if pod.state == ReplicaState.READY:
        replica.mark_ready(cause, version=version)
    return replica


def observe_deployment(repo: Repository, cmd: c.ObserveDeployment, cause: Cause) -> dict[str, Any]:
    """The cluster's status of a deployment: recorded as it is, and a failure or a deployment
    with no ready replica left moves the admission phase. A report older than the last one
    recorded (by the cluster's `version`) changes nothing."""
    deployment = _observed(repo, cmd.cluster_id, cmd.deployment_id)
    if cmd.status is not None:
        deployment.record_status(cause, cmd.status, version=cmd.version)
    if cmd.live_digests is not None:
        deployment.observe_live_digests(cause, dict(cmd.live_digests), version=cmd.version)
    return {"deployment_id": deployment.key, "admission_phase": deployment.admission_phase.value}


def observe_action(repo: Repository, cmd: c.ObserveAction, cause: Cause) -> dict[str, Any]:
    deployment = _observed(repo, cmd.cluster_id, cmd.deployment_id)
    deployment.record_operator_action(
        cause,
        verb=cmd.verb,
        target=f"{cmd.namespace}/{cmd.name}",
        performed=cmd.performed,
        reason=cmd.reason,
    )
    return {"deployment_id": deployment.key}


def observe_heartbeat(repo: Repository, cmd: c.ObserveHeartbeat, cause: Cause) -> dict[str, Any]:
    cluster = repo.get(Cluster, cmd.cluster_id)
    if cluster is None:
        cluster = Cluster.register(cause, cmd.cluster_id, None, {})
        repo.add(cluster)
    cluster.hear_operator(cause, cmd.operator)
    return {"cluster_id": cluster.key, "reachable": cluster.reachable}


def observe_discovery(repo: Repository, cmd: c.ObserveDiscovery, cause: Cause) -> dict[str, Any]:
    """A model found running that the plane did not render; once promoted, what the engine
    runs with is recorded on its deployment as imported_args."""
    key = Discovery.key_for(cmd.cluster_id, cmd.namespace, cmd.name)
    discovery = repo.get(Discovery, key)
    if cmd.sighting is None:
        if discovery is not None:
            discovery.vanish(cause)
        return {"discovery_id": key}
    if discovery is None:
        discovery = Discovery.sight(cause, cmd.cluster_id, cmd.sighting)
        repo.add(discovery)
    elif discovery.resight(cause, cmd.sighting) and discovery.workload_id is not None:
        deployment_key = Deployment.key_for(discovery.workload_id, cmd.cluster_id)
        deployment = repo.get(Deployment, deployment_key)
        primary = cmd.sighting.primary()
        if deployment is not None and primary is not None:
            deployment.observe_imported_args(cause, primary.imported_args)
    return {"discovery_id": key, "state": discovery.state.value}


def track_discovery(repo: Repository, cmd: c.TrackDiscovery, cause: Cause) -> dict[str, Any]:
    discovery = _require(repo, Discovery, cmd.discovery_id, "discovery_id")
    discovery.track(cause)
    return {"discovery_id": discovery.key, "state": discovery.state.value}


def ignore_discovery(repo: Repository, cmd: c.IgnoreDiscovery, cause: Cause) -> dict[str, Any]:
    discovery = _require(repo, Discovery, cmd.discovery_id, "discovery_id")
    discovery.ignore(cause)
    return {"discovery_id": discovery.key, "state": discovery.state.value}


def promote_discovery(repo: Repository, cmd: c.PromoteDiscovery, cause: Cause) -> dict[str, Any]:
    """Adopt what runs: a workload pinned to the cluster, with one observed deployment that
    records the engine's arguments as imported_args. Nothing on the cluster changes."""
    discovery = _require(repo, Discovery, cmd.discovery_id, "discovery_id")
    name, primary = discovery.adoption(cmd.workload_id)
    sighting = discovery.sighting
    _require(repo, Project, cmd.project, "project")
    cluster = _require(repo, Cluster, discovery.cluster_id, "discovery_id")
    serving = cmd.serving or sighting.implied_serving()
    workload_id, incarnation = _claim(repo, cause, name)
    workload = Workload.create(
        cause,
        workload_id,
        name=name,
        incarnation=incarnation,
        project=cmd.project,
        device_class=cmd.device_class or cluster.only_device_class(),
        serving=serving,
        replicas=primary.replicas,
        cluster_pin=cluster.key,
    )
    repo.add(workload)
    _add_deployment(repo, cause, workload, cluster.key, primary.replicas, "discovery_id", sighting)
    discovery.promote(cause, workload.key)
    return _workload_result(workload) | {"discovery_id": discovery.key}


def _observed(repo: Repository, cluster_id: str, deployment_id: str) -> Deployment:
    deployment = _require(repo, Deployment, deployment_id, "deployment_id")
    if deployment.cluster_id != cluster_id:
        raise InvalidValue(
            f"deployment {deployment_id!r} runs on {deployment.cluster_id!r}, not {cluster_id!r}",
            field="cluster_id",
        )
    return deployment


def _workload_result(workload: Workload) -> dict[str, Any]:
    """`name` keys the workload's views; `workload_id` is this incarnation's id."""
    return {
        "workload_id": workload.key,
        "name": workload.name,
        "incarnation": workload.incarnation,
        "replicas": workload.replicas,
        "serving_digest": workload.serving_digest,
        "deployments": sorted(workload.deployments.values()),
    }


def _deployment_result(d: Deployment) -> dict[str, Any]:
    return {
        "deployment_id": d.key,
        "desired_replicas": d.desired_replicas,
        "enabled": d.enabled,
        "authority": d.authority.value,
        "generation": d.generation,
        "serving_digest": d.serving_digest,
        "engine_args": list(d.engine_args),
    }


Handler = Callable[[Repository, Any, Cause], dict[str, Any]]

HANDLERS: dict[type[c.Command], Handler] = {
    c.SetQuota: set_quota,
    c.RegisterCluster: register_cluster,
    c.ReportInventory: report_inventory,
    c.CreateWorkload: create_workload,
    c.SetPlacementPreferences: set_placement_preferences,
    c.ScaleWorkload: scale_workload,
    c.ChangeServingConfig: change_serving_config,
    c.DeleteWorkload: delete_workload,
    c.EnableDeployment: enable_deployment,
    c.DisableDeployment: disable_deployment,
    c.SetEngineArgs: set_engine_args,
    c.PromoteAuthority: promote_authority,
    c.DecideAdmission: decide_admission,
    c.PlaceWorkload: place_workload,
    c.SetClusterReachability: set_cluster_reachability,
    c.ObserveReplica: observe_replica,
    c.ObserveDeployment: observe_deployment,
    c.ObserveSync: observe_sync,
    c.ObserveHeartbeat: observe_heartbeat,
    c.ObserveAction: observe_action,
    c.ObserveDiscovery: observe_discovery,
    c.TrackDiscovery: track_discovery,
    c.IgnoreDiscovery: ignore_discovery,
    c.PromoteDiscovery: promote_discovery,
}
