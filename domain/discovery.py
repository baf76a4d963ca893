"""A discovery: a model found running on a cluster that nobody declared.

It is observed first; a person then tracks it (inventory only), ignores it (hidden from the
default list) or promotes it (a workload pinned to the cluster with one observed deployment).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, ValidationError

from wingsmith.domain.base import (
    Aggregate,
    AlreadyExists,
    Cause,
    Created,
    Event,
    IllegalTransition,
    InvalidValue,
    Writer,
    require_writer,
)
from wingsmith.domain.values import (
    MAX_DEVICES_PER_NODE,
    Backend,
    EngineArg,
    Frozen,
    Namespace,
    ObjectName,
    Parallelism,
    ServingConfig,
    ServingMode,
    is_name,
    text,
)


class DiscoveryState(StrEnum):
    SIGHTED = "sighted"
    TRACKED = "tracked"
    IGNORED = "ignored"
    PROMOTED = "promoted"


WORKER_ROLES = ("worker", "decode", "prefill", "main")  # main: a legacy single worker


MAX_COMPONENTS = 64  # a graph has a frontend, a few worker kinds and planners: a handful
MAX_IMPORTED_ARGS = 512  # one engine's command line, argument by argument


class DiscoveredComponent(Frozen):
    name: str = Field(pattern=r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$", max_length=63)
    role: str = Field(pattern=r"^[A-Za-z0-9]([-_A-Za-z0-9]*[A-Za-z0-9])?$", max_length=32)
    replicas: int = Field(ge=0, le=10_000)
    gpus_per_replica: int = Field(ge=0, le=MAX_DEVICES_PER_NODE)
    imported_args: tuple[EngineArg, ...] = Field(default=(), max_length=MAX_IMPORTED_ARGS)


class Sighting(Frozen):
    """What the operator saw: a DynamoGraphDeployment it did not render."""

    namespace: Namespace
    name: ObjectName
    api_version: str = Field(pattern=r"^[a-z0-9][-.a-z0-9]*(/[a-z0-9]+)?$", max_length=253)
    backend: Backend | None
    components: tuple[DiscoveredComponent, ...] = Field(max_length=MAX_COMPONENTS)
    # what a promotion needs to declare the workload, when the manifest says it
    model: Annotated[str, *text(256)] | None = None
    image: Annotated[str, *text(512)] | None = None
    engine_version: Annotated[str, *text(64)] | None = None
    tensor_parallel: int | None = Field(default=None, ge=1, le=64)

    def workers(self) -> tuple[DiscoveredComponent, ...]:
        """The components that hold devices and run the engine."""
        return tuple(c for c in self.components if c.role in WORKER_ROLES)

    def primary(self) -> DiscoveredComponent | None:
        """The worker whose arguments stand for the deployment's: the aggregated worker, else
        decode (it serves the tokens), else prefill."""
        by_role = {c.role: c for c in reversed(self.workers())}
        return next((by_role[r] for r in WORKER_ROLES if r in by_role), None)

    def devices_per_replica(self) -> int:
        """All workers' devices per replica of the primary worker: in a disaggregated graph the
        prefill workers' count with the decode workers'. 0 when they do not divide evenly."""
        primary = self.primary()
        if primary is None:
            return 0
        workers = self.workers()
        if not primary.replicas:
            return sum(c.gpus_per_replica for c in workers)
        total = sum(c.gpus_per_replica * c.replicas for c in workers)
        return total // primary.replicas if total % primary.replicas == 0 else 0

    def implied_serving(self) -> ServingConfig:
        """The serving configuration the manifest implies; what it leaves out must be given."""
        for field, value in (("backend", self.backend), ("model", self.model)):
            if value is None:
                raise InvalidValue(
                    f"the manifest does not say the {field}: give serving", field=field
                )
        # a decode worker alone serves whole requests: only a prefill worker splits them
        disaggregated = any(c.role == "prefill" for c in self.workers())
        try:
            return ServingConfig(
                model=self.model,
                backend=self.backend,
                engine_version=self.engine_version or "unknown",
                image=self.image,
                mode=ServingMode.DISAGGREGATED if disaggregated else ServingMode.AGGREGATED,
                devices_per_replica=self.devices_per_replica(),
                parallelism=Parallelism(tensor=self.tensor_parallel or 1),
            )
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "serving"
            raise InvalidValue(
                f"the manifest implies an invalid serving config ({where}: {first['msg']}): "
                "give serving",
                field=f"serving.{where}",
            ) from None


class Discovery(Aggregate):
    kind = "discovery"
    cluster_id: str
    sighting: Sighting
    state: DiscoveryState
    workload_id: str | None
    present: bool  # the DynamoGraphDeployment still exists on the cluster

    @staticmethod
    def key_for(cluster_id: str, namespace: str, name: str) -> str:
        return f"{cluster_id}--{namespace}--{name.replace('.', '-')}"

    def adoption(self, workload_id: str | None) -> tuple[str, DiscoveredComponent]:
        """The workload a promotion declares (the one given, else the manifest's name) and the
        worker it adopts, or why the discovery cannot be promoted."""
        if self.state is DiscoveryState.PROMOTED:
            raise AlreadyExists(
                f"discovery {self.key!r} was promoted to workload {self.workload_id!r}",
                field="discovery_id",
            )
        if not self.present:
            raise InvalidValue(
                "the model is no longer running on its cluster", field="discovery_id"
            )
        primary = self.sighting.primary()
        if primary is None:
            raise InvalidValue("the sighting has no worker to adopt", field="discovery_id")
        workload_id = workload_id or self.sighting.name
        if not is_name(workload_id):
            raise InvalidValue(
                f"{workload_id!r} is not a valid workload id: give workload_id",
                field="workload_id",
            )
        return workload_id, primary

    @classmethod
    def sight(cls, cause: Cause, cluster_id: str, sighting: Sighting) -> Discovery:
        require_writer(cause, Writer.CLUSTER, "a sighting")
        key = cls.key_for(cluster_id, sighting.namespace, sighting.name)
        return cls._start(DiscoverySighted, key, cause, cluster_id=cluster_id, sighting=sighting)

    def resight(self, cause: Cause, sighting: Sighting) -> bool:
        """True when the sighting changed something."""
        require_writer(cause, Writer.CLUSTER, "a sighting")
        if sighting == self.sighting and self.present:
            return False
        self._record(DiscoveryResighted, cause, sighting=sighting)
        return True

    def vanish(self, cause: Cause) -> None:
        """The DynamoGraphDeployment was deleted from the cluster."""
        require_writer(cause, Writer.CLUSTER, "a sighting")
        if self.present:
            self._record(DiscoveryVanished, cause)

    def track(self, cause: Cause) -> None:
        self._decide(cause, DiscoveryState.TRACKED, DiscoveryTracked)

    def ignore(self, cause: Cause) -> None:
        self._decide(cause, DiscoveryState.IGNORED, DiscoveryIgnored)

    def promote(self, cause: Cause, workload_id: str) -> None:
        require_writer(cause, Writer.PLANE, "promotion")
        self._check_open()
        self._record(DiscoveryPromoted, cause, workload_id=workload_id)

    def _decide(self, cause: Cause, state: DiscoveryState, event: type[Event]) -> None:
        require_writer(cause, Writer.PLANE, f"{state.value}")
        self._check_open()
        if self.state is not state:
            self._record(event, cause)

    def _check_open(self) -> None:
        if self.state is DiscoveryState.PROMOTED:
            raise IllegalTransition(
                f"discovery was promoted to workload {self.workload_id!r}", field="state"
            )


class DiscoverySighted(Created):
    aggregate_class = Discovery
    cluster_id: str
    sighting: Sighting

    def apply(self, d: Any) -> None:
        d.cluster_id, d.sighting = self.cluster_id, self.sighting
        d.state, d.workload_id, d.present = DiscoveryState.SIGHTED, None, True


class DiscoveryResighted(Event):
    sighting: Sighting

    def apply(self, d: Any) -> None:
        d.sighting, d.present = self.sighting, True


class DiscoveryVanished(Event):
    def apply(self, d: Any) -> None:
        d.present = False


class DiscoveryTracked(Event):
    def apply(self, d: Any) -> None:
        d.state = DiscoveryState.TRACKED


class DiscoveryIgnored(Event):
    def apply(self, d: Any) -> None:
        d.state = DiscoveryState.IGNORED


class DiscoveryPromoted(Event):
    workload_id: str

    def apply(self, d: Any) -> None:
        d.state, d.workload_id = DiscoveryState.PROMOTED, self.workload_id
