"""A replica: one observed running instance of a deployment, on named devices; the roster of a
deployment's live replicas; and the pure decision of what a full report from the cluster (a sync)
changes in them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wingsmith.domain.base import (
    Aggregate,
    Cause,
    Created,
    Event,
    IllegalTransition,
    InvalidValue,
    Writer,
    require_writer,
)


class Replica(Aggregate):
    kind = "replica"
    deployment_id: str
    name: str
    node_id: str
    device_ids: tuple[str, ...]
    ready: bool
    serving_digest: str
    engine_version: str
    terminated: bool
    observed_version: int  # the cluster's ordering of the last observation applied (0: none)

    @classmethod
    def start(
        cls,
        cause: Cause,
        *,
        deployment_id: str,
        name: str,
        node_id: str,
        device_ids: tuple[str, ...],
        serving_digest: str,
        engine_version: str,
        version: int = 0,
    ) -> Replica:
        require_writer(cause, Writer.CLUSTER, "a replica")
        if len(set(device_ids)) != len(device_ids):
            raise InvalidValue("a device cannot be allocated twice", field="device_ids")
        return cls._start(
            ReplicaStarted,
            cls.key_for(deployment_id, name),
            cause,
            deployment_id=deployment_id,
            name=name,
            node_id=node_id,
            device_ids=device_ids,
            serving_digest=serving_digest,
            engine_version=engine_version,
            version=version,
        )

    @staticmethod
    def key_for(deployment_id: str, pod_name: str) -> str:
        """Pod names may hold dots, which a NATS subject token cannot."""
        return f"{deployment_id}--{pod_name.replace('.', '-')}"

    def mark_ready(self, cause: Cause, *, version: int = 0) -> None:
        self._check_live(cause)
        if self._news(self.ready is False, version):
            self._record(ReplicaReady, cause, version=version)

    def mark_not_ready(self, cause: Cause, *, version: int = 0) -> None:
        self._check_live(cause)
        if self._news(self.ready is True, version):
            self._record(ReplicaNotReady, cause, version=version)

    def _news(self, changes: bool, version: int) -> bool:
        """Whether a report is worth an event: not older than the last one applied (late news
        is ignored), and either a change or newer (so that no older report can undo it)."""
        if 0 < version < self.observed_version:
            return False
        return changes or version > self.observed_version

    def terminate(self, cause: Cause) -> None:
        require_writer(cause, Writer.CLUSTER, "a replica")
        if not self.terminated:
            self._record(ReplicaTerminated, cause)

    def _check_live(self, cause: Cause) -> None:
        require_writer(cause, Writer.CLUSTER, "a replica")
        if self.terminated:
            raise IllegalTransition(f"replica {self.name} has terminated", field="ready")


class ReplicaStarted(Created):
    aggregate_class = Replica
    deployment_id: str
    name: str
    node_id: str
    device_ids: tuple[str, ...]
    serving_digest: str
    engine_version: str
    version: int = 0

    def apply(self, r: Any) -> None:
        r.deployment_id, r.name, r.node_id = self.deployment_id, self.name, self.node_id
        r.device_ids, r.serving_digest = self.device_ids, self.serving_digest
        r.engine_version, r.ready, r.terminated = self.engine_version, False, False
        r.observed_version = self.version


class ReplicaReady(Event):
    version: int = 0

    def apply(self, r: Any) -> None:
        r.ready, r.observed_version = True, max(r.observed_version, self.version)


class ReplicaNotReady(Event):
    version: int = 0

    def apply(self, r: Any) -> None:
        r.ready, r.observed_version = False, max(r.observed_version, self.version)


class ReplicaTerminated(Event):
    def apply(self, r: Any) -> None:
        r.ready, r.terminated = False, True


class Roster(Aggregate):
    """The names of a deployment's live replicas, as the plane knows them: what an operator's
    full report (a sync) is compared with, so that replicas the cluster no longer has can be
    found without reading every replica the deployment ever had."""

    kind = "roster"
    deployment_id: str
    names: set[str]

    @classmethod
    def open(cls, cause: Cause, deployment_id: str) -> Roster:
        require_writer(cause, Writer.CLUSTER, "a roster")
        return cls._start(RosterOpened, deployment_id, cause, deployment_id=deployment_id)

    def join(self, cause: Cause, name: str) -> None:
        require_writer(cause, Writer.CLUSTER, "a roster")
        if name not in self.names:
            self._record(RosterJoined, cause, name=name)

    def leave(self, cause: Cause, name: str) -> None:
        require_writer(cause, Writer.CLUSTER, "a roster")
        if name in self.names:
            self._record(RosterLeft, cause, name=name)


class RosterOpened(Created):
    aggregate_class = Roster
    deployment_id: str

    def apply(self, r: Any) -> None:
        r.deployment_id, r.names = self.deployment_id, set()


class RosterJoined(Event):
    name: str

    def apply(self, r: Any) -> None:
        r.names.add(self.name)


class RosterLeft(Event):
    name: str

    def apply(self, r: Any) -> None:
        r.names.discard(self.name)


# -- anti-entropy: a full report of a deployment's replicas against what the plane holds ------

# The most replicas one sync may list: one deployment's pods on one cluster, in one report
# within the reports' size limit (512 KiB at about 400 bytes a pod).
SYNC_MAX_REPLICAS = 1024


@dataclass(frozen=True, slots=True)
class Known:
    """A replica as the plane holds it."""

    ready: bool
    terminated: bool
    version: int  # the cluster's ordering of the last report applied to it (0: none)


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What a sync changes: each tuple holds pod names, sorted."""

    terminate: tuple[str, ...] = ()  # the plane holds them; the cluster no longer has them
    record: tuple[str, ...] = ()  # the cluster has them; the plane missed them
    ready: tuple[str, ...] = ()
    not_ready: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.terminate or self.record or self.ready or self.not_ready)


def reconcile(known: Mapping[str, Known], reported: Mapping[str, bool], version: int) -> SyncPlan:
    """Compare the plane's replicas of a deployment (`known`, by pod name: its live ones and any
    other the report names) with every pod the cluster reports for it (`reported`: pod name ->
    ready), as of the cluster's `version` (0: the cluster does not order its reports, and the
    sync is taken as it is).

    A sync never undoes newer news: a replica whose last report is newer than the sync was seen
    after the sync was taken, so it is neither terminated for being absent nor changed. A
    terminated replica stays terminated (a pod name is not used twice)."""

    def newer(k: Known) -> bool:
        return 0 < version < k.version

    terminate = [
        name
        for name, k in known.items()
        if name not in reported and not k.terminated and not newer(k)
    ]
    record = [name for name in reported if name not in known]
    flips = [
        name
        for name, ready in reported.items()
        if (k := known.get(name)) is not None
        and not k.terminated
        and not newer(k)
        and k.ready != ready
    ]
    return SyncPlan(
        terminate=tuple(sorted(terminate)),
        record=tuple(sorted(record)),
        ready=tuple(sorted(n for n in flips if reported[n])),
        not_ready=tuple(sorted(n for n in flips if not reported[n])),
    )
