"""Observation reports: what an operator tells the hub on `wingsmith.obs.<cluster>.<kind>`.

One model per kind. The operator builds its reports with them (unvalidated: it sends what its
cluster says, and the hub is the judge) and the hub parses each report against the same model,
strictly: JSON types only, no unknown field, every name and range checked, lists bounded. The
hub's observation commands (`domain/commands.py`) are these models plus a command id.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from wingsmith.domain.cluster import Node, OperatorInfo
from wingsmith.domain.deployment import DeploymentStatus
from wingsmith.domain.discovery import Sighting
from wingsmith.domain.replica import SYNC_MAX_REPLICAS
from wingsmith.domain.values import (
    MAX_DEVICES_PER_NODE,
    DeploymentId,
    DeviceId,
    Name,
    Namespace,
    NodeName,
    ObjectName,
    PodName,
    Token,
    once_each,
    text,
)

MAX_VERSION = 2**63 - 1  # a resourceVersion or sequence number: what a signed 64-bit holds
VERSION_HELP = "The cluster's ordering (a resourceVersion); 0: none"
MAX_NODES = 10_000  # one report's nodes; a payload holds about 2,000 with 8 device ids each
MAX_PODS_PER_NODE = 1_000  # Kubernetes' own limit is 110 by default, and a few hundred at most

Version = Annotated[int, Field(ge=0, le=MAX_VERSION, description=VERSION_HELP)]
# An extended resource's name, as a device plugin registers it: `nvidia.com/gpu`
ResourceName = Annotated[
    str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-_.A-Za-z0-9]{1,63}$", max_length=253)
]
EngineVersion = Annotated[str, *text(64, min_length=1)]  # a client wrote it: any text


class ReplicaState(StrEnum):
    """What a cluster says of a replica (a pod holding devices)."""

    STARTED = "started"
    READY = "ready"
    NOT_READY = "not_ready"
    TERMINATED = "terminated"


LiveState = Literal[ReplicaState.STARTED, ReplicaState.READY, ReplicaState.NOT_READY]


class Report(BaseModel):
    """What every report carries: the cluster it is from (its subject's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[str]  # the subject's last token

    cluster_id: Name

    def wire(self) -> dict[str, Any]:
        """The JSON object sent: the fields given, in the model's order. The operator builds
        its reports with `model_construct`, unvalidated: a value its cluster gave that the hub
        refuses is set aside there with the reason, not lost on the way."""
        return self.model_dump(mode="json", exclude_unset=True, warnings=False)


class ReplicaReport(Report):
    """What a cluster saw of one replica (a pod). Each report carries the whole replica, so one
    that arrives before the others it follows still makes sense."""

    kind = "replica"
    deployment_id: DeploymentId
    pod: PodName
    node_id: NodeName
    device_ids: list[DeviceId] = Field(max_length=MAX_DEVICES_PER_NODE)
    serving_digest: Token
    engine_version: EngineVersion
    state: ReplicaState
    version: Version = 0

    @field_validator("device_ids")
    @classmethod
    def _devices_once_each(cls, device_ids: list[str]) -> list[str]:
        once_each(device_ids)
        return device_ids


class DeploymentReport(Report):
    """What a cluster says of a deployment: its status, the digests its replicas run."""

    kind = "deployment"
    deployment_id: DeploymentId
    status: DeploymentStatus | None = None
    live_digests: dict[Token, Annotated[int, Field(ge=0, le=10_000)]] | None = Field(
        default=None, max_length=64
    )
    version: Version = 0


class SyncedReplica(BaseModel):
    """One pod a cluster has for a deployment, in a sync: the fields of a replica report."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pod: PodName
    node_id: NodeName
    device_ids: list[DeviceId] = Field(max_length=MAX_DEVICES_PER_NODE)
    serving_digest: Token
    engine_version: EngineVersion
    state: LiveState  # one that is gone is not listed

    @field_validator("device_ids")
    @classmethod
    def _devices_once_each(cls, device_ids: list[str]) -> list[str]:
        once_each(device_ids)
        return device_ids


class SyncReport(Report):
    """Everything a cluster has of one deployment, as of the cluster's `version`: all its
    replicas (pods holding devices) and its status."""

    kind = "sync"
    deployment_id: DeploymentId
    replicas: list[SyncedReplica] = Field(max_length=SYNC_MAX_REPLICAS)
    status: DeploymentStatus | None = None
    version: int = Field(ge=0, le=MAX_VERSION, description="The cluster's ordering; 0: none")

    @field_validator("replicas")
    @classmethod
    def _each_pod_and_device_once(cls, replicas: list[SyncedReplica]) -> list[SyncedReplica]:
        once_each([r.pod for r in replicas])
        once_each([f"{r.node_id}/{d}" for r in replicas for d in r.device_ids])  # a device: once
        return replicas


class InventoryReport(Report):
    """A cluster's whole inventory: its nodes, their devices and topology domains."""

    kind = "inventory"
    nodes: list[Node] = Field(max_length=MAX_NODES)

    @field_validator("nodes")
    @classmethod
    def _nodes_once_each(cls, nodes: list[Node]) -> list[Node]:
        once_each([n.node_id for n in nodes])
        return nodes


class ActionReport(Report):
    """What an operator wrote to its cluster for a deployment, or would have written
    (`performed` false: the deployment is observed, the operator is read-only, or the API
    server refused it, which `reason` then says)."""

    kind = "action"
    deployment_id: DeploymentId
    verb: Literal["create", "apply", "patch", "replace", "delete"]
    namespace: Namespace
    name: ObjectName
    performed: bool
    reason: Annotated[str, *text(256)]


class HeartbeatReport(Report):
    """An operator says it is alive, and which one it is."""

    kind = "heartbeat"
    operator: OperatorInfo


class DiscoveryReport(Report):
    """A DynamoGraphDeployment the plane did not render, as the operator read it; no sighting
    means it was deleted."""

    kind = "discovery"
    namespace: Namespace
    name: ObjectName
    sighting: Sighting | None = None

    @model_validator(mode="after")
    def _names_match(self) -> Self:
        if self.sighting and (self.sighting.namespace, self.sighting.name) != (
            self.namespace,
            self.name,
        ):
            raise ValueError("sighting names another object than namespace and name")
        return self


class PodDevices(BaseModel):
    """The devices one pod holds, as its node's kubelet names them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    namespace: Namespace
    name: PodName
    device_ids: list[DeviceId] = Field(min_length=1, max_length=MAX_DEVICES_PER_NODE)

    @field_validator("device_ids")
    @classmethod
    def _each_device_once(cls, ids: list[str]) -> list[str]:
        once_each(ids)
        return ids


class NodeDevicesReport(Report):
    """What a node agent read from its node's kubelet (`wingsmith node-agent`): the devices
    the node can allocate (null: the kubelet does not say) and those each pod holds, of the
    resources it watches. Published on `wingsmith.obs.<cluster>.devices.<node>` for the
    cluster's operator, which joins it with the pods it reports; not a kind the hub takes.
    Sent when it changes and at least every `refresh` seconds, so that an operator that
    started since, or that stops hearing it, knows."""

    kind = "devices"
    node_id: NodeName
    resources: list[ResourceName] = Field(min_length=1, max_length=16)  # what it watches
    allocatable: list[DeviceId] | None = Field(max_length=MAX_DEVICES_PER_NODE)
    pods: list[PodDevices] = Field(max_length=MAX_PODS_PER_NODE)
    refresh: float = Field(gt=0, le=3600)

    @field_validator("pods")
    @classmethod
    def _pods_and_devices_once(cls, pods: list[PodDevices]) -> list[PodDevices]:
        once_each([f"{p.namespace}/{p.name}" for p in pods])
        once_each([d for p in pods for d in p.device_ids])
        return pods


KINDS: tuple[type[Report], ...] = (
    ReplicaReport,
    DeploymentReport,
    InventoryReport,
    DiscoveryReport,
    HeartbeatReport,
    ActionReport,
    SyncReport,
)
