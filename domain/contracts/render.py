"""The render object: what should run of one deployment on its cluster.

The hub's render projection (`projections/render.py`) writes it as a `RenderDocument` and
publishes it on `wingsmith.render.<cluster>.<deployment>`; the operator reads it back, and
renders it into a DynamoGraphDeployment through `RenderObject`, which checks every field the
manifest depends on. The document is a plain dict because the projection builds one for each
change it folds, rebuilds included; the model is what an operator trusts.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from wingsmith.domain.deployment import Authority
from wingsmith.domain.values import DeviceClass, EngineArg, Name, ServingConfig

LABEL_VALUE_MAX = 63  # a Kubernetes label value's length

# Values that end up in the manifest's names, labels and annotations.
_LABEL_VALUE = r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LabelValue = Annotated[str, StringConstraints(pattern=_LABEL_VALUE, max_length=LABEL_VALUE_MAX)]
DeploymentId = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=253)
]
DnsSubdomain = Annotated[str, StringConstraints(pattern=_DNS_SUBDOMAIN, max_length=253)]


class AdoptedRef(TypedDict):
    """The DynamoGraphDeployment an observed deployment was adopted from."""

    namespace: str
    name: str


class RenderDocument(TypedDict):
    """The render object as published, keys in the order they go on the wire."""

    deployment_id: str
    workload_id: str
    cluster_id: str
    project: str
    device_class: str
    generation: int
    serving: dict[str, Any]  # a ServingConfig, as JSON
    serving_digest: str
    engine_args: list[str]
    replicas: int
    enabled: bool
    authority: Authority
    adopted: AdoptedRef | None
    nodes_per_worker: int  # one engine worker spans this many nodes (multinode when > 1)


class Adopted(BaseModel):
    """Where the DGD a deployment was adopted from lives: rendering targets that object."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    namespace: Name
    name: DnsSubdomain


class RenderObject(BaseModel):
    """A render object as the operator reads it: each field checked, unknown ones ignored (a
    newer hub may add some)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    deployment_id: DeploymentId
    workload_id: Name
    cluster_id: Name
    project: Name
    device_class: DeviceClass
    generation: int = Field(ge=0)
    serving: ServingConfig
    serving_digest: LabelValue
    engine_args: tuple[EngineArg, ...] = ()
    replicas: int = Field(ge=0, le=2**31 - 1)  # the CRD's replicas are int32
    enabled: bool = True
    authority: Authority
    adopted: Adopted | None = None
    # One engine worker (a replica, or each of its prefill and decode halves) runs on this many
    # nodes of the cluster, its devices split evenly between them: what admission counted.
    nodes_per_worker: int = Field(default=1, ge=1, le=64)
