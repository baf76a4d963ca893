"""The command API's wire models: what may enter on `wingsmith.cmd.<aggregate>.<verb>`.

Every command is validated strictly (no type coercion, no unknown fields) before it reaches a
handler, and carries a client-chosen `command_id` that makes resending it harmless.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from wingsmith.domain.admission import Decision, Placement
from wingsmith.domain.base import Writer
from wingsmith.domain.cluster import Node, OperatorInfo
from wingsmith.domain.deployment import DeploymentStatus
from wingsmith.domain.discovery import Sighting
from wingsmith.domain.replica import SYNC_MAX_REPLICAS
from wingsmith.domain.values import (
    MAX_DEVICES_PER_NODE,
    DeploymentId,
    DeviceClass,
    DeviceId,
    DiscoveryId,
    EngineArg,
    LabelKey,
    LabelValue,
    Name,
    Namespace,
    NodeName,
    ObjectName,
    PodName,
    ServingConfig,
    Token,
    once_each,
    text,
)

CommandId = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][-_.:A-Za-z0-9]*$", min_length=1, max_length=128)
]

# The command ids the hub gives its own commands; a client's command_id may not start with one,
# or it could take (or be taken for) one of them.
OBSERVATION_PREFIX = "obs:"  # services/ingest.py, from an operator's message id
ADMISSION_PREFIX = "admission-"  # services/scheduler.py
PLACEMENT_PREFIX = "placement-"  # services/scheduler.py
SILENCE_PREFIX = "silence-"  # services/liveness.py
INTERNAL_PREFIXES = (OBSERVATION_PREFIX, ADMISSION_PREFIX, PLACEMENT_PREFIX, SILENCE_PREFIX)


def reserved_prefix(command_id: str) -> str | None:
    """The internal prefix `command_id` starts with, if any."""
    return next((p for p in INTERNAL_PREFIXES if command_id.startswith(p)), None)


class Command(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    subject: ClassVar[str]
    writer: ClassVar[Writer] = Writer.PLANE  # who may say what this command says

    command_id: CommandId = Field(description="Client-chosen; resending it has the effect of once")
    correlation_id: CommandId | None = Field(
        default=None, description="Groups a causal chain; defaults to the command_id"
    )


class SetQuota(Command):
    """Set how many devices of one class a project's deployments may hold."""

    subject = "project.set_quota"
    project: Name
    device_class: DeviceClass
    devices: int = Field(ge=0, le=1_000_000)


class RegisterCluster(Command):
    """Make a cluster known to the plane."""

    subject = "cluster.register"
    cluster_id: Name
    region: LabelValue | None = Field(default=None, min_length=1)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)


MAX_NODES = 10_000  # one report's nodes; a payload holds about 2,000 with 8 device ids each


class ReportInventory(Command):
    """Replace a cluster's inventory: its nodes, their devices and topology domains."""

    subject = "cluster.report_inventory"
    cluster_id: Name
    nodes: list[Node] = Field(max_length=MAX_NODES)

    @field_validator("nodes")
    @classmethod
    def _nodes_once_each(cls, nodes: list[Node]) -> list[Node]:
        once_each([n.node_id for n in nodes])
        return nodes


class CreateWorkload(Command):
    """Declare a workload; with `cluster` set it is pinned there with one deployment."""

    subject = "workload.create"
    workload_id: Name
    project: Name
    device_class: DeviceClass
    serving: ServingConfig
    replicas: int = Field(ge=0, le=10_000)
    cluster: Name | None = Field(default=None, description="Pin the workload to this cluster")
    clusters: list[Name] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Allow-list: placement chooses only among these clusters",
    )
    engine_args: list[EngineArg] = Field(default_factory=list, max_length=256)


class ScaleWorkload(Command):
    """Change a workload's total replicas; its deployments' shares follow."""

    subject = "workload.scale"
    workload_id: Name
    replicas: int = Field(ge=0, le=10_000)


class ChangeServingConfig(Command):
    """Serve the workload differently: a new generation on every deployment."""

    subject = "workload.change_serving_config"
    workload_id: Name
    serving: ServingConfig


class DeleteWorkload(Command):
    """Delete a workload and all its deployments: the operators take down what runs, and its
    devices go to others. The id is not reused."""

    subject = "workload.delete"
    workload_id: Name


class EnableDeployment(Command):
    """Let the operator reconcile this deployment again."""

    subject = "deployment.enable"
    deployment_id: DeploymentId


class DisableDeployment(Command):
    """Stop reconciling: the operator scales the deployment to zero."""

    subject = "deployment.disable"
    deployment_id: DeploymentId


class SetEngineArgs(Command):
    """Set the engine arguments the deployment should run with (desired state)."""

    subject = "deployment.set_engine_args"
    deployment_id: DeploymentId
    engine_args: list[EngineArg] = Field(max_length=256)


class PromoteAuthority(Command):
    """Hand an observed deployment to the operator: observed -> managed."""

    subject = "deployment.promote_authority"
    deployment_id: DeploymentId
    authority: Literal["managed"]
    force: bool = Field(default=False, description="Promote even if engine_args differ")


class DecideAdmission(Command):
    """Internal: the admission process's decision. Not accepted on NATS."""

    subject = "deployment.decide_admission"
    deployment_id: str
    admitted: bool
    devices: int = Field(ge=0)
    reason: str | None
    evidence: dict[str, int]

    @classmethod
    def of(cls, d: Decision, command_id: str, correlation_id: str | None) -> DecideAdmission:
        fields = {k: v for k, v in dataclasses.asdict(d).items() if k != "phase"}
        return cls(command_id=command_id, correlation_id=correlation_id, **fields)


class PlaceWorkload(Command):
    """Internal: placement's new shares for a workload, valid only while the workload still
    has `replicas` and `serving_digest` and its deployments the `previous` shares. No shares:
    nowhere to go, for the reason in `message`."""

    subject = "workload.place"
    workload_id: str
    replicas: int
    serving_digest: str
    shares: dict[str, int]
    previous: dict[str, int]
    message: str | None = None

    @classmethod
    def of(cls, p: Placement, command_id: str, correlation_id: str | None) -> PlaceWorkload:
        fields = dataclasses.asdict(p)
        return cls(command_id=command_id, correlation_id=correlation_id, **fields)


class SetClusterReachability(Command):
    """Internal: the hub heard from a cluster lately, or has not."""

    subject = "cluster.set_reachability"
    cluster_id: str
    reachable: bool


DeploymentRef = DeploymentId
MAX_VERSION = 2**63 - 1  # a resourceVersion or sequence number: what a signed 64-bit holds
VERSION_HELP = "The cluster's ordering (a resourceVersion); 0: none"


class ObserveReplica(Command):
    """Internal: what a cluster saw of one replica (a pod). Each observation carries the whole
    replica, so one that arrives before the others it follows still makes sense."""

    subject = "replica.observe"
    writer = Writer.CLUSTER
    cluster_id: Name
    deployment_id: DeploymentRef
    pod: PodName
    node_id: NodeName
    device_ids: list[DeviceId] = Field(max_length=MAX_DEVICES_PER_NODE)
    serving_digest: Token
    # the serving configuration's, which a client wrote: any text (it is never a token)
    engine_version: Annotated[str, *text(64, min_length=1)]
    state: Literal["started", "ready", "not_ready", "terminated"]
    version: int = Field(default=0, ge=0, le=MAX_VERSION, description=VERSION_HELP)

    @field_validator("device_ids")
    @classmethod
    def _devices_once_each(cls, device_ids: list[str]) -> list[str]:
        once_each(device_ids)
        return device_ids


class ObserveDeployment(Command):
    """Internal: what a cluster says of a deployment: its status, the digests its replicas
    run."""

    subject = "deployment.observe"
    writer = Writer.CLUSTER
    cluster_id: Name
    deployment_id: DeploymentRef
    status: DeploymentStatus | None = None
    live_digests: dict[Token, Annotated[int, Field(ge=0, le=10_000)]] | None = Field(
        default=None, max_length=64
    )
    version: int = Field(default=0, ge=0, le=MAX_VERSION, description=VERSION_HELP)


class SyncedReplica(BaseModel):
    """One pod a cluster has for a deployment, in a sync: the fields of a replica report."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pod: PodName
    node_id: NodeName
    device_ids: list[DeviceId] = Field(max_length=MAX_DEVICES_PER_NODE)
    serving_digest: Token
    engine_version: Annotated[str, *text(64, min_length=1)]
    state: Literal["started", "ready", "not_ready"]  # one that is gone is not listed

    @field_validator("device_ids")
    @classmethod
    def _devices_once_each(cls, device_ids: list[str]) -> list[str]:
        once_each(device_ids)
        return device_ids


class ObserveSync(Command):
    """Internal: everything a cluster has of one deployment, as of the cluster's `version`: all
    its replicas (pods holding devices) and its status. Sent on every operator start and
    periodically, so that a report lost or overtaken on the way heals: the hub terminates the
    replicas the cluster no longer has and records the ones it missed."""

    subject = "deployment.sync"
    writer = Writer.CLUSTER
    cluster_id: Name
    deployment_id: DeploymentRef
    replicas: list[SyncedReplica] = Field(max_length=SYNC_MAX_REPLICAS)
    status: DeploymentStatus | None = None
    version: int = Field(ge=0, le=MAX_VERSION, description="The cluster's ordering; 0: none")

    @field_validator("replicas")
    @classmethod
    def _each_pod_and_device_once(cls, replicas: list[SyncedReplica]) -> list[SyncedReplica]:
        once_each([r.pod for r in replicas])
        once_each([f"{r.node_id}/{d}" for r in replicas for d in r.device_ids])  # a device: once
        return replicas


class ObserveAction(Command):
    """Internal: what an operator wrote to its cluster for a deployment, or would have
    written (`performed` false: the deployment is observed, or the operator is read-only)."""

    subject = "deployment.observe_action"
    writer = Writer.CLUSTER
    cluster_id: Name
    deployment_id: DeploymentRef
    verb: Literal["create", "patch", "delete"]
    namespace: Namespace
    name: ObjectName
    performed: bool
    reason: Annotated[str, *text(256)]


class ObserveHeartbeat(Command):
    """Internal: an operator says it is alive. A cluster the hub has not heard of is
    registered by its first heartbeat: only its own operator may publish for it."""

    subject = "cluster.heartbeat"
    writer = Writer.CLUSTER
    cluster_id: Name
    operator: OperatorInfo


class ObserveDiscovery(Command):
    """Internal: a DynamoGraphDeployment the plane did not render, as the operator read it;
    no sighting means it was deleted."""

    subject = "discovery.observe"
    writer = Writer.CLUSTER
    cluster_id: Name
    namespace: Namespace
    name: ObjectName
    sighting: Sighting | None = None

    @model_validator(mode="after")
    def _names_match(self) -> ObserveDiscovery:
        if self.sighting and (self.sighting.namespace, self.sighting.name) != (
            self.namespace,
            self.name,
        ):
            raise ValueError("sighting names another object than namespace and name")
        return self


DiscoveryRef = DiscoveryId


class TrackDiscovery(Command):
    """Keep a discovered model in the inventory, observed only; no deployment is created."""

    subject = "discovery.track"
    discovery_id: DiscoveryRef


class IgnoreDiscovery(Command):
    """Mark a discovered model as not interesting: it leaves the default list."""

    subject = "discovery.ignore"
    discovery_id: DiscoveryRef


class PromoteDiscovery(Command):
    """Adopt a discovered model: a workload pinned to its cluster with one observed
    deployment. What the manifest does not say is taken from `serving` and `device_class`."""

    subject = "discovery.promote"
    discovery_id: DiscoveryRef
    project: Name
    workload_id: Name | None = Field(
        default=None, description="Defaults to the DynamoGraphDeployment's name"
    )
    device_class: DeviceClass | None = Field(
        default=None, description="Defaults to the cluster's one device class"
    )
    serving: ServingConfig | None = Field(
        default=None, description="Defaults to what the manifest says"
    )


COMMANDS: dict[str, type[Command]] = {
    cls.subject: cls
    for cls in (
        SetQuota,
        RegisterCluster,
        ReportInventory,
        CreateWorkload,
        ScaleWorkload,
        ChangeServingConfig,
        DeleteWorkload,
        EnableDeployment,
        DisableDeployment,
        SetEngineArgs,
        PromoteAuthority,
        TrackDiscovery,
        IgnoreDiscovery,
        PromoteDiscovery,
    )
}


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of every command, keyed by its full subject."""
    return {f"wingsmith.cmd.{s}": cls.model_json_schema() for s, cls in COMMANDS.items()}
