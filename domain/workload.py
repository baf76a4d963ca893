"""A workload: one model served one way, at a total scale, spread over deployments.

Deleting one keeps its history under its id: a deleted workload refuses every further command,
and its id is never given to another workload. Its name may be declared again: the new workload
is the name's next incarnation, under an id of its own (domain/workload_name.py).
"""

from __future__ import annotations

from enum import StrEnum
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
from wingsmith.domain.placement import Preferences
from wingsmith.domain.values import ServingConfig

MOVES_KEPT = 20  # the last moves the workloads view shows


class MoveReason(StrEnum):
    """Why placement moved replicas of a workload from one cluster to another."""

    PENDING_TOO_LONG = "pending_too_long"  # its share waited there longer than allowed
    CLUSTER_LOST = "cluster_lost"  # the cluster was unreachable past its grace period
    REBALANCE = "rebalance"  # room came back where its preferences point


class PlacementReason(StrEnum):
    """Why placement found nowhere to go."""

    NO_CLUSTER_HAS_DEVICE_CLASS = "no_cluster_has_device_class"  # none it may use reports it
    NO_NODE_HOLDS_A_POD = "no_node_holds_a_pod"  # some do, but their nodes are too small
    NO_CLUSTER_MATCHES_SELECTOR = "no_cluster_matches_selector"  # some do, none with its labels


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
    unplaced_reason: PlacementReason | None  # ... as a reason
    deleted: bool
    preferences: Preferences

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
        preferences: Preferences | None = None,
        name: str | None = None,
        incarnation: int = 1,
    ) -> Workload:
        _check_replicas(replicas)
        if preferences is not None and preferences.given:
            _check_preferences(cluster_pin)
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
            preferences=preferences if preferences is not None and preferences.given else None,
        )

    def set_preferences(self, cause: Cause, preferences: Preferences) -> None:
        """Where placement should rather put the workload's replicas from now on. Nothing
        moves at once: new replicas follow them, and rebalancing moves the rest as room allows."""
        self.check_not_deleted()
        _check_preferences(self.cluster_pin)
        if preferences != self.preferences:
            self._record(PlacementPreferencesChanged, cause, preferences=preferences)

    def record_move(
        self, cause: Cause, from_cluster: str, to_cluster: str, replicas: int, reason: MoveReason
    ) -> None:
        """Placement moved `replicas` of the workload's share on one cluster to another (the
        handler changes the two deployments in the same command)."""
        self.check_not_deleted()
        if self.cluster_pin is not None:
            raise InvalidValue(f"workload {self.key!r} is pinned; it never moves", field="move")
        if from_cluster not in self.deployments:
            raise InvalidValue(f"no deployment on {from_cluster!r} to move from", field="move")
        if replicas <= 0 or from_cluster == to_cluster:
            raise InvalidValue("a move takes at least one replica elsewhere", field="move")
        self._record(
            WorkloadMoved,
            cause,
            from_cluster=from_cluster,
            to_cluster=to_cluster,
            replicas=replicas,
            reason=reason,
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

    def defer_placement(
        self, cause: Cause, message: str, reason: PlacementReason | None = None
    ) -> None:
        """Placement found no cluster to go to; it tries again when one appears."""
        self.check_not_deleted()
        if (message, reason) != (self.unplaced, self.unplaced_reason):
            self._record(PlacementDeferred, cause, message=message, reason=reason)

    def delete(self, cause: Cause) -> None:
        """The workload is gone for good; its deployments are deleted with it (by the
        handler, in the same command)."""
        self.check_not_deleted()
        self._record(WorkloadDeleted, cause)

    def check_not_deleted(self) -> None:
        if self.deleted:
            raise NotFound(f"workload {self.name!r} was deleted", field="workload_id")


def _check_preferences(cluster_pin: str | None) -> None:
    if cluster_pin is not None:
        raise InvalidValue(
            "a pinned workload has no placement preferences: it runs on its pin",
            field="preferred_clusters",
        )


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
    preferences: Preferences | None = None

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
        workload.unplaced_reason = None
        workload.deleted = False
        workload.preferences = self.preferences or Preferences()


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
        workload.unplaced = workload.unplaced_reason = None


class PlacementPreferencesChanged(Event):
    preferences: Preferences

    def apply(self, workload: Any) -> None:
        workload.preferences = self.preferences


class WorkloadMoved(Event):
    """Replicas of the workload moved from one cluster's deployment to another's, and why."""

    from_cluster: str
    to_cluster: str
    replicas: int
    reason: MoveReason

    def apply(self, workload: Any) -> None:
        """The shares' own events change them: this one says why (the workloads view keeps
        the last MOVES_KEPT)."""


class PlacementDeferred(Event):
    message: str
    reason: PlacementReason | None = None  # none in events recorded before reasons were

    def apply(self, workload: Any) -> None:
        workload.unplaced, workload.unplaced_reason = self.message, self.reason


class WorkloadDeleted(Event):
    def apply(self, workload: Any) -> None:
        workload.deleted = True
