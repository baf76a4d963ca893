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
    ValidationInfo,
    field_validator,
)

from wingsmith.domain import engine_flags, names
from wingsmith.domain.admission import Decision, Placement
from wingsmith.domain.base import Writer
from wingsmith.domain.contracts import reports as r
from wingsmith.domain.placement import Preferences, Strategy
from wingsmith.domain.values import (
    DeploymentId,
    DeviceClass,
    DiscoveryId,
    EngineArg,
    LabelKey,
    LabelValue,
    Name,
    ServingConfig,
)
from wingsmith.domain.workload import MoveReason

CommandId = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][-_.:A-Za-z0-9]*$", min_length=1, max_length=128)
]

# The command ids the hub gives its own commands; a client's command_id may not start with one,
# or it could take (or be taken for) one of them.
OBSERVATION_PREFIX = "obs:"  # services/hub/ingest.py, from an operator's message id
ADMISSION_PREFIX = "admission-"  # services/hub/scheduler.py
PLACEMENT_PREFIX = "placement-"  # services/hub/scheduler.py
SILENCE_PREFIX = "silence-"  # services/hub/liveness.py
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


class ReportInventory(r.InventoryReport, Command):
    """Replace a cluster's inventory: its nodes, their devices and topology domains."""

    subject = "cluster.report_inventory"


class CreateWorkload(Command):
    """Declare a workload; with `cluster` set it is pinned there with one deployment. A name
    whose workload was deleted is declared again as its next incarnation."""

    subject = "workload.create"
    workload_id: Name = Field(description="The workload's name")
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
    preferred_clusters: list[Name] = Field(
        default_factory=list, max_length=64, description="Clusters placement tries first, in order"
    )
    cluster_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Only clusters with all these labels are candidates",
    )
    strategy: Strategy = Field(
        default=Strategy.PACK, description="pack: fill one cluster, then the next; spread: even"
    )

    def preferences(self) -> Preferences:
        return _preferences(self.preferred_clusters, self.cluster_selector, self.strategy)

    @field_validator("engine_args")
    @classmethod
    def _engine_args_fit_the_serving_config(cls, args: list[str], info: ValidationInfo) -> Any:
        """A flag the renderer spells from the serving config may not be set again
        (domain/engine_flags.py); SetEngineArgs and ChangeServingConfig are checked by their
        handlers, which know the deployment's serving config."""
        serving = info.data.get("serving")
        problems = engine_flags.conflicts(serving, args) if serving is not None else []
        if problems:
            raise ValueError("; ".join(problems))
        return args


class SetPlacementPreferences(Command):
    """Where the workload's replicas should rather run: new replicas follow at once, the
    others move as rebalancing finds room. All empty (and `pack`): placement's default."""

    subject = "workload.set_preferences"
    workload_id: Name
    preferred_clusters: list[Name] = Field(default_factory=list, max_length=64)
    cluster_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    strategy: Strategy = Strategy.PACK

    def preferences(self) -> Preferences:
        return _preferences(self.preferred_clusters, self.cluster_selector, self.strategy)


def _preferences(preferred: list[str], selector: dict[str, str], strategy: Strategy) -> Preferences:
    return Preferences(
        preferred_clusters=tuple(dict.fromkeys(preferred)),
        cluster_selector=dict(selector),
        strategy=strategy,
    )


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
    devices go to others. Its id is not reused; its name may be declared again, as a new
    incarnation."""

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
    """Set the engine arguments the deployment should run with (part of its render object)."""

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
    blocker: str | None = None

    @classmethod
    def of(cls, d: Decision, command_id: str, correlation_id: str | None) -> DecideAdmission:
        fields = {k: v for k, v in dataclasses.asdict(d).items() if k != "phase"}
        return cls(command_id=command_id, correlation_id=correlation_id, **fields)


class MoveSpec(BaseModel):
    """A placement that is a move: replicas of one cluster's share given to another."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    from_cluster: str
    to_cluster: str
    replicas: int = Field(ge=1)
    reason: MoveReason


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
    reason: str | None = None
    move: MoveSpec | None = None
    disable: str | None = None
    enable: str | None = None

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


class ObserveReplica(r.ReplicaReport, Command):
    """Internal: a replica report (`domain/contracts/reports.py`) as the hub runs it."""

    subject = "replica.observe"
    writer = Writer.CLUSTER


class ObserveDeployment(r.DeploymentReport, Command):
    """Internal: a deployment report, as the hub runs it."""

    subject = "deployment.observe"
    writer = Writer.CLUSTER


class ObserveSync(r.SyncReport, Command):
    """Internal: a sync, as the hub runs it. Sent on every operator start and periodically, so
    that a report lost or overtaken on the way heals: the hub terminates the replicas the
    cluster no longer has and records the ones it missed."""

    subject = "deployment.sync"
    writer = Writer.CLUSTER


class ObserveAction(r.ActionReport, Command):
    """Internal: an action report, as the hub runs it."""

    subject = "deployment.observe_action"
    writer = Writer.CLUSTER


class ObserveHeartbeat(r.HeartbeatReport, Command):
    """Internal: an operator says it is alive. A cluster the hub has not heard of is
    registered by its first heartbeat: only its own operator may publish for it."""

    subject = "cluster.heartbeat"
    writer = Writer.CLUSTER


class ObserveDiscovery(r.DiscoveryReport, Command):
    """Internal: a discovery report, as the hub runs it."""

    subject = "discovery.observe"
    writer = Writer.CLUSTER


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
        SetPlacementPreferences,
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
    return {names.command_subject(s): cls.model_json_schema() for s, cls in COMMANDS.items()}
