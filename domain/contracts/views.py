"""The view documents: what each projection publishes, and what the REST API composes of them.

The projector writes these (projections/fleet.py), the API mirrors and serves them
(services/api), and the command line prints them (services/cli/client.py); all three name the
same types here, so a field renamed on one side is a type error on the others. They are
TypedDicts: a view is built and changed inside the projector's fold, where a model would cost
every event a validation, while the API still derives its OpenAPI schemas from them.

Phases, states and authorities are typed `str`: a `StrEnum` member is one, and JSON carries
its value. Timestamps are ISO 8601 strings, as the events carry them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, NotRequired, TypeVar

from typing_extensions import TypedDict

# Projection views: one per key, published on wingsmith.proj.<projection>.<key>


class WorkloadPhaseView(TypedDict):
    """`workload_phase`, by workload name: the phase of the name's current incarnation, and
    each of its deployments' beside it."""

    workload_id: str  # the incarnation's id: the name for the first, `<name>--<n>` later
    name: str
    incarnation: int  # 1 for the first workload of the name, 2 for the next after a delete, …
    phase: str
    deployments: dict[str, str]  # deployment id -> admission phase


class CapacityRow(TypedDict):
    """`capacity`, by `<cluster>.<device class>`: the devices its nodes report (`total`), of
    them those on unschedulable nodes (cordoned or not Ready) and those held by pods Wingsmith
    does not manage on the other nodes (`held_outside`), then what live replicas hold
    (`allocated`) and what admission granted to replicas still to start (`reserved`). `free`
    is what is left: total - unschedulable - held_outside - allocated - reserved, as admission
    counts it. It is negative when more is held than the nodes can take (a node cordoned or
    lost under its replicas): an over-commitment, shown as it is."""

    cluster_id: str
    device_class: str
    total: int
    unschedulable: int
    held_outside: int
    allocated: int
    reserved: int
    free: int


class NodeCapacityView(TypedDict):
    """`capacity_nodes`, by `<cluster>.<device class>.<node>`: one node of a capacity row. Its
    `free` is what it can take (none when unschedulable, else its devices less those held
    outside Wingsmith) less what live replicas hold on it; negative when over-committed. Grants
    not started yet are not placed on nodes: they count in the row only. A node no longer
    reported while replicas still hold devices on it stays, with no devices, unschedulable."""

    cluster_id: str
    device_class: str
    node_id: str
    devices: int
    unschedulable: bool
    held_outside: int
    allocated: int
    free: int


class QuotaUseRow(TypedDict):
    """`quota_use`, by `<project>.<device class>`: the quota, what the project's deployments
    hold as admission counts it (`used`: each deployment's grant, or what its live replicas
    hold when that is more), split into `allocated` (held by live replicas) and `reserved`
    (granted, not started yet), and what is left (negative when a quota is lowered below
    use)."""

    project: str
    device_class: str
    quota: int
    used: int
    allocated: int
    reserved: int
    available: int


class Admission(TypedDict):
    """Where admission has a deployment, why, and since when; `evidence`: the numbers its last
    decision was made on, in that phase and every phase the cluster moves it to after (placed,
    running, failed); `message` after a failure; `blocker`: the older deployment it waits
    behind in its queue, when it does (`evidence.queue_position` is its place there)."""

    phase: str
    reason: str | None
    since: str
    evidence: NotRequired[dict[str, int]]
    message: NotRequired[str]
    blocker: NotRequired[str]


class StatusCondition(TypedDict):
    """Trouble the cluster shows (`ImagePullBackOff`, `CrashLoopBackOff`, `OOMKilled`, ...)."""

    reason: str
    message: str | None
    permanent: bool
    pods: int


class ClusterStatus(TypedDict):
    """What the cluster last said of a deployment."""

    phase: str
    reason: str | None
    message: str | None
    ready_replicas: int
    desired_replicas: int
    conditions: NotRequired[list[StatusCondition]]


class Drift(TypedDict):
    """An observed deployment whose engine runs with other arguments than declared."""

    engine_args: list[str]
    imported_args: list[str] | None  # never null here; typed so to match the view's field


class DeploymentHealthView(TypedDict):
    """`deployment_health`, by deployment id: the plane's declaration beside the cluster's
    answer; `stale` while the cluster is unreachable."""

    deployment_id: str
    workload_id: str
    cluster_id: str
    project: str
    device_class: str
    desired_replicas: int
    ready_replicas: int
    enabled: bool
    degraded: bool
    status: ClusterStatus | None
    live_digests: dict[str, int]  # serving digest -> replicas running it, ready or not
    authority: str
    generation: int
    serving_digest: str
    engine_args: list[str]
    imported_args: list[str] | None
    drift: Drift | None
    stale: bool
    admission: Admission
    devices_per_replica: int
    granted_devices: int  # what admission granted it
    waiting_replicas: int  # replicas it wants that admission has not granted yet


class DiscoveredComponent(TypedDict):
    name: str
    role: str
    replicas: int
    gpus_per_replica: int
    imported_args: list[str]


class Sighting(TypedDict):
    """What an operator saw of a DynamoGraphDeployment (domain/discovery.py `Sighting`)."""

    namespace: str
    name: str
    api_version: str
    backend: str | None
    components: list[DiscoveredComponent]
    model: NotRequired[str | None]
    image: NotRequired[str | None]
    engine_version: NotRequired[str | None]
    tensor_parallel: NotRequired[int | None]


class DiscoveredView(Sighting):
    """`discovered`, by discovery id: the sighting as last reported, what was decided about
    it, and whether it still exists on the cluster."""

    discovery_id: str
    cluster_id: str
    state: str
    workload_id: str | None  # once promoted
    present: bool


class AllocationView(TypedDict):
    """`allocations`, by replica id: a live replica, the devices it holds and where.
    `stand_in`: its device ids are the operator's stand-ins (`<node>/<pod>/gpu<i>`), not the
    devices' own ids, which the cluster did not tell."""

    replica_id: str
    deployment_id: str
    cluster_id: str
    name: str
    node_id: str
    device_ids: list[str]
    stand_in: bool
    topology_domain: str | None
    ready: bool
    serving_digest: str
    engine_version: str


class PreferencesDocument(TypedDict):
    """Where a workload's replicas should rather run (domain/placement.py `Preferences`)."""

    preferred_clusters: list[str]  # tried first, in this order
    cluster_selector: dict[str, str]  # only clusters with all these labels
    strategy: str  # pack | spread


class MoveDocument(TypedDict):
    """Replicas placement moved from one cluster to another, and why."""

    from_cluster: str
    to_cluster: str
    replicas: int
    reason: str  # pending_too_long | cluster_lost | rebalance
    at: str


class WorkloadView(TypedDict):
    """`workloads`, by workload name: the name's current incarnation as declared, its
    deployment on each cluster, why placement found nowhere to go (null once it did), its
    placement preferences and its last 20 moves, oldest first."""

    workload_id: str  # the incarnation's id: the name for the first, `<name>--<n>` later
    name: str
    incarnation: int
    project: str
    device_class: str
    replicas: int
    serving: dict[str, Any]  # a ServingConfig (domain/values.py), every field given
    serving_digest: str
    cluster: str | None  # pinned to
    clusters: list[str] | None  # allowed
    engine_args: list[str]
    deployments: dict[str, str]  # cluster id -> deployment id
    unplaced: str | None
    unplaced_reason: str | None  # a PlacementReason: no_cluster_has_device_class, …
    preferences: PreferencesDocument
    moves: list[MoveDocument]
    created_at: str
    updated_at: str


class OperatorDocument(TypedDict):
    """The operator a cluster last heard from."""

    instance: str
    version: str
    read_only: bool
    simulated: bool


class ClusterView(TypedDict):
    """`clusters`, by cluster id: the cluster as registered, whether it is reachable, its
    operator, and its inventory in sum."""

    cluster_id: str
    region: str | None
    labels: dict[str, str]
    reachable: bool
    operator: OperatorDocument | None
    nodes: int
    devices: dict[str, int]  # device class -> devices
    registered_at: str


D = TypeVar("D")


@dataclass(frozen=True, slots=True)
class Kind(Generic[D]):
    """A projection's name, typed by the document its views are."""

    name: str


WORKLOAD_PHASE: Kind[WorkloadPhaseView] = Kind("workload_phase")
CAPACITY: Kind[CapacityRow] = Kind("capacity")
CAPACITY_NODES: Kind[NodeCapacityView] = Kind("capacity_nodes")
QUOTA_USE: Kind[QuotaUseRow] = Kind("quota_use")
DEPLOYMENT_HEALTH: Kind[DeploymentHealthView] = Kind("deployment_health")
DISCOVERED: Kind[DiscoveredView] = Kind("discovered")
ALLOCATIONS: Kind[AllocationView] = Kind("allocations")
WORKLOADS: Kind[WorkloadView] = Kind("workloads")
CLUSTERS: Kind[ClusterView] = Kind("clusters")


# REST resources: the API composes these from the views above


class Placement(TypedDict):
    """One of a workload's deployments, as the workload shows it (nulls until its views have
    it)."""

    deployment_id: str
    cluster_id: str | None
    admission_phase: str | None
    admission_reason: str | None
    desired_replicas: int | None
    ready_replicas: int | None
    waiting_replicas: int | None  # not granted by admission yet: `admission_reason` says why
    live_digests: dict[str, int]


class Workload(TypedDict):
    """`/v1/workloads/{ref}`: the workload as declared, its phase, and its deployments."""

    workload_id: str
    name: str
    incarnation: int
    project: str
    device_class: str
    replicas: int
    serving: dict[str, Any]
    serving_digest: str
    cluster: str | None
    clusters: list[str] | None
    engine_args: list[str]
    deployments: list[Placement]
    unplaced: str | None
    unplaced_reason: str | None
    preferences: PreferencesDocument
    moves: list[MoveDocument]  # the last 20, oldest first
    created_at: str
    updated_at: str
    phase: str


class Deployment(DeploymentHealthView):
    """`/v1/deployments/{ref}`: the deployment's health, its admission phase and reason at the
    top, and its live replicas."""

    admission_phase: str
    admission_reason: str | None
    replicas: list[AllocationView]


class Cluster(ClusterView):
    """`/v1/clusters/{ref}`: the cluster with its capacity per device class."""

    capacity: list[CapacityRow]


class Project(TypedDict):
    """`/v1/projects/{project}`: quota and use per device class."""

    project: str
    quotas: list[QuotaUseRow]


class WorkloadList(TypedDict):
    workloads: list[Workload]


class DeploymentList(TypedDict):
    deployments: list[Deployment]


class Amount(TypedDict):
    """Replicas, and the devices they take."""

    replicas: int
    devices: int


class Constraint(TypedDict):
    """What binds: a reason, a sentence with its numbers, and the numbers. `blocker`: the older
    deployment ahead in the queue; `nodes_free`: free devices per node of its cluster and
    class; `reported` and `did_you_mean`: the classes the fleet reports, and those close to
    the one asked for."""

    reason: str
    message: str
    numbers: dict[str, int]
    blocker: NotRequired[str]
    nodes_free: NotRequired[dict[str, int]]
    reported: NotRequired[list[str]]
    did_you_mean: NotRequired[list[str]]


class Explanation(TypedDict):
    """`/v1/deployments/{ref}/explain` (domain/explain.py): what a deployment wants, holds and
    waits for, what binds it, and what change would unblock it (empty when nothing waits). A
    workload that placement found nowhere to go is explained without a deployment."""

    deployment_id: str | None
    workload_id: str
    cluster_id: str | None
    project: str
    device_class: str
    phase: str
    wants: Amount
    holds: Amount
    waiting: Amount
    constraint: Constraint | None
    blocked_by: NotRequired[Constraint]  # what the blocker waits for
    unblock: list[str]
    summary: str


class DiscoveredList(TypedDict):
    discovered: list[DiscoveredView]


class ProjectList(TypedDict):
    projects: list[Project]


class ClusterList(TypedDict):
    clusters: list[Cluster]


class CapacityList(TypedDict):
    capacity: list[CapacityRow]


class NodeList(TypedDict):
    """`/v1/clusters/{ref}/nodes`: the cluster's nodes, by device class and name."""

    nodes: list[NodeCapacityView]


class Change(TypedDict):
    before: Any
    after: Any


class TimelineEntry(TypedDict):
    """One event of an audit timeline (projections/audit.py): the fields it changed (nested
    ones by dotted name), and the command that caused it."""

    position: int
    timestamp: str
    aggregate: str
    aggregate_id: str
    version: int
    type: str
    changes: dict[str, Change]
    command_id: str
    correlation_id: str


class AuditEntry(TimelineEntry):
    """One event of `/v1/events`, with its stream sequence; a workload's, audited by a name
    that was reused, with the incarnation it belongs to."""

    seq: int
    incarnation: NotRequired[int]


class AuditPage(TypedDict):
    """`/v1/events`: entries oldest first; `next` is the `since` of the next page (null:
    none)."""

    events: list[AuditEntry]
    next: int | None
