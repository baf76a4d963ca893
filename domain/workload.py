"""A workload: one model served one way, at a total scale, spread over deployments.

Deleting one keeps its history under its id: a deleted workload refuses every further command,
and its id is never given to another workload. Its name may be declared again: the new workload
is the name's next incarnation, under an id of its own (domain/workload_name.py).
"""

from __future__ import annotations

from typing import Any

from wingsmith.domain.base import (
    Aggregate,
    Cause,
    Created,
    Event,
    InvalidValue,
    NotFound,
    split_id,
)
from wingsmith.domain.values import ServingConfig


class Workload(Aggregate):
    kind = "workload"
    name: str  # what people call it; the id is the name's for its first incarnation only
    incarnation: int  # 1 for the first workload of its name, 2 for the next, …
    project: str
    device_class: str
    serving: ServingConfig
    serving_digest: str
    replicas: int
    cluster_pin: str | None
    allowed_clusters: tuple[str, ...] | None  # placement chooses only among these
    engine_args: tuple[str, ...]  # what the workload's deployments start with
    deployments: dict[str, str]  # cluster id -> deployment key
    unplaced: str | None  # why placement found nowhere to go, until it does
    deleted: bool

    @classmethod
    def create(
        cls,
        cause: Cause,
        workload_id: str,
        *,
        project: str,
        device_class: str,
        serving: ServingConfig,
        replicas: int,
        cluster_pin: str | None,
        allowed_clusters: tuple[str, ...] | None = None,
        engine_args: tuple[str, ...] = (),
        name: str | None = None,
        incarnation: int = 1,
    ) -> Workload:
        _check_replicas(replicas)
        if cluster_pin is not None and allowed_clusters is not None:
            raise InvalidValue(
                "a pinned workload has no allow-list: give cluster or clusters, not both",
                field="clusters",
            )
        if allowed_clusters is not None and not allowed_clusters:
            raise InvalidValue("an allow-list names at least one cluster", field="clusters")
        return cls._start(
            WorkloadCreated,
            workload_id,
            cause,
            name=name or workload_id,
            incarnation=incarnation,
            project=project,
            device_class=device_class,
            serving=serving,
            serving_digest=serving.digest(),
            replicas=replicas,
            cluster_pin=cluster_pin,
            allowed_clusters=allowed_clusters,
            engine_args=engine_args,
        )

    def scale(self, cause: Cause, replicas: int) -> None:
        self.check_not_deleted()
        _check_replicas(replicas)
        if replicas != self.replicas:
            self._record(WorkloadScaled, cause, replicas=replicas)

    def change_serving_config(self, cause: Cause, serving: ServingConfig) -> bool:
        """Record a new serving configuration; False when it equals the current one. One with
        the same digest (only its pods' scheduling or the frontend differ) is an amendment."""
        self.check_not_deleted()
        if serving == self.serving:
            return False
        digest = serving.digest()
        if digest == self.serving_digest:
            self._record(WorkloadServingConfigAmended, cause, serving=serving)
            return True
        self._record(WorkloadServingConfigChanged, cause, serving=serving, serving_digest=digest)
        return True

    def attach_deployment(self, cause: Cause, cluster_id: str, deployment_key: str) -> None:
        self.check_not_deleted()
        if cluster_id in self.deployments:
            raise InvalidValue(f"workload already has a deployment on cluster {cluster_id!r}")
        self._record(
            DeploymentAttached, cause, cluster_id=cluster_id, deployment_key=deployment_key
        )

    def defer_placement(self, cause: Cause, message: str) -> None:
        """Placement found no cluster to go to; it tries again when one appears."""
        self.check_not_deleted()
        if message != self.unplaced:
            self._record(PlacementDeferred, cause, message=message)

    def delete(self, cause: Cause) -> None:
        """The workload is gone for good; its deployments are deleted with it (by the
        handler, in the same command)."""
        self.check_not_deleted()
        self._record(WorkloadDeleted, cause)

    def check_not_deleted(self) -> None:
        if self.deleted:
            raise NotFound(f"workload {self.name!r} was deleted", field="workload_id")


def _check_replicas(replicas: int) -> None:
    if replicas < 0:
        raise InvalidValue("replicas cannot be negative", field="replicas")


class WorkloadCreated(Created):
    aggregate_class = Workload
    # Recorded before names were reused, it has neither: its name is its id, its first.
    name: str | None = None
    incarnation: int = 1
    project: str
    device_class: str
    serving: ServingConfig
    serving_digest: str
    replicas: int
    cluster_pin: str | None
    allowed_clusters: tuple[str, ...] | None = None
    engine_args: tuple[str, ...] = ()

    def apply(self, workload: Any) -> None:
        workload.name = self.name or split_id(self.originator_id)[1]
        workload.incarnation = self.incarnation
        workload.project = self.project
        workload.device_class = self.device_class
        workload.serving = self.serving
        workload.serving_digest = self.serving_digest
        workload.replicas = self.replicas
        workload.cluster_pin = self.cluster_pin
        workload.allowed_clusters = self.allowed_clusters
        workload.engine_args = self.engine_args
        workload.deployments = {}
        workload.unplaced = None
        workload.deleted = False


class WorkloadScaled(Event):
    replicas: int

    def apply(self, workload: Any) -> None:
        workload.replicas = self.replicas


class WorkloadServingConfigChanged(Event):
    serving: ServingConfig
    serving_digest: str

    def apply(self, workload: Any) -> None:
        workload.serving = self.serving
        workload.serving_digest = self.serving_digest


class WorkloadServingConfigAmended(Event):
    """The serving config changed where its digest does not look: no new generation."""

    serving: ServingConfig

    def apply(self, workload: Any) -> None:
        workload.serving = self.serving


class DeploymentAttached(Event):
    cluster_id: str
    deployment_key: str

    def apply(self, workload: Any) -> None:
        workload.deployments = {**workload.deployments, self.cluster_id: self.deployment_key}
        workload.unplaced = None


class PlacementDeferred(Event):
    message: str

    def apply(self, workload: Any) -> None:
        workload.unplaced = self.message


class WorkloadDeleted(Event):
    def apply(self, workload: Any) -> None:
        workload.deleted = True
