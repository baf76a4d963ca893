"""A replica: one observed running instance of a deployment, on named devices."""

from __future__ import annotations

from typing import Any

from domain.base import (
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
