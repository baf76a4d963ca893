"""A deployment: one workload on one cluster, the unit an operator reconciles.

It is plane-declared (desired_replicas, enabled, serving config, engine_args) and cluster-observed
(status, live_digests, imported_args). Each side has its own methods and its own events, and the
`Cause.writer` guard keeps one from writing the other's fields.

A deleted deployment refuses the plane, but still records what its cluster reports while it
winds down (its pods terminating); none of that moves its admission phase any more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import Field

from wingsmith.domain.base import (
    Aggregate,
    Cause,
    Created,
    DomainError,
    Event,
    IllegalTransition,
    InvalidValue,
    NotFound,
    Writer,
    require_writer,
)
from wingsmith.domain.values import Frozen, ResourceRef, ServingConfig

if TYPE_CHECKING:
    from wingsmith.domain.replica import Replica


class AdmissionPhase(StrEnum):
    PENDING = "pending"
    ADMITTED = "admitted"
    PLACED = "placed"
    RUNNING = "running"
    FAILED = "failed"


class AdmissionReason(StrEnum):
    AWAITING_ADMISSION = "awaiting_admission"
    INSUFFICIENT_QUOTA = "insufficient_quota"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    WAITING_FOR_PREVIOUS_GENERATION = "waiting_for_previous_generation"
    DISABLED = "disabled"
    CLUSTER_FAILURE = "cluster_failure"


# what the part of a grant that does not fit waits for (the rest is admitted)
PARTIAL = frozenset({AdmissionReason.INSUFFICIENT_QUOTA, AdmissionReason.INSUFFICIENT_CAPACITY})
# the phases in which a deployment holds what admission granted it
HOLDS = frozenset({AdmissionPhase.ADMITTED, AdmissionPhase.PLACED, AdmissionPhase.RUNNING})

Limits = tuple[int | None, int | None, bool]


def limits_of(evidence: Mapping[str, Any]) -> Limits:
    """The quota and capacity an admission decision was measured against, and whether the
    nodes held back a replica those would allow."""
    return evidence.get("quota"), evidence.get("capacity"), "pods_needed" in evidence


class Authority(StrEnum):
    MANAGED = "managed"
    OBSERVED = "observed"


class ClusterPhase(StrEnum):
    """What the cluster says it did; distinct from the plane's admission phase."""

    PENDING = "pending"
    PROGRESSING = "progressing"
    READY = "ready"
    FAILED = "failed"
    UNKNOWN = "unknown"


# Which admission phase may follow which. Any phase may fall back to pending (re-admission),
# and anything but a failure may fail.
TRANSITIONS: dict[AdmissionPhase, frozenset[AdmissionPhase]] = {
    AdmissionPhase.PENDING: frozenset({AdmissionPhase.PENDING, AdmissionPhase.ADMITTED}),
    AdmissionPhase.ADMITTED: frozenset({AdmissionPhase.PENDING, AdmissionPhase.PLACED}),
    AdmissionPhase.PLACED: frozenset({AdmissionPhase.PENDING, AdmissionPhase.RUNNING}),
    AdmissionPhase.RUNNING: frozenset({AdmissionPhase.PENDING, AdmissionPhase.PLACED}),
    AdmissionPhase.FAILED: frozenset({AdmissionPhase.PENDING}),
}
for _phase, _next in list(TRANSITIONS.items()):
    if _phase is not AdmissionPhase.FAILED:
        TRANSITIONS[_phase] = _next | {AdmissionPhase.FAILED}


class StatusCondition(Frozen):
    """Something wrong that the cluster shows, under Kubernetes' or Dynamo's own reason:
    `ImagePullBackOff`, `CrashLoopBackOff`, `OOMKilled`, a DGD's `failed` state, or the API
    server's refusal of what the operator wrote.

    A transient condition (the kubelet or the Dynamo operator retries it by itself) is shown and
    changes nothing the plane decides: what serves keeps serving. A permanent one (`permanent`)
    comes with the cluster phase `failed`: the cluster refuses the deployment as rendered.
    """

    reason: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")
    message: str | None = Field(default=None, max_length=1024)
    permanent: bool = False
    pods: int = Field(default=0, ge=0, le=100_000)  # how many pods show it; 0: the graph itself


MAX_CONDITIONS = 16


class DeploymentStatus(Frozen):
    """What the cluster says of a deployment. `failed` is permanent: the cluster refuses it as
    rendered. Transient trouble is a condition beside a phase that stays what it is."""

    phase: ClusterPhase
    reason: str | None = Field(default=None, max_length=256)
    message: str | None = Field(default=None, max_length=4096)
    ready_replicas: int = Field(ge=0, le=100_000)
    desired_replicas: int = Field(ge=0, le=100_000)
    conditions: tuple[StatusCondition, ...] = Field(default=(), max_length=MAX_CONDITIONS)


class AuthorityDrift(DomainError):
    """Promoting would change what the running engine was started with."""

    code = "authority_drift"


class Deployment(Aggregate):
    kind = "deployment"
    workload_id: str
    cluster_id: str
    project: str
    device_class: str
    desired_replicas: int
    admission_phase: AdmissionPhase
    admission_reason: AdmissionReason | None
    granted_devices: int  # what the last admission granted
    admission_limits: Limits = (None, None, False)  # what it was measured against
    generation: int
    authority: Authority
    enabled: bool
    serving: ServingConfig
    serving_digest: str
    engine_args: tuple[str, ...]
    imported_args: tuple[str, ...] | None
    status: DeploymentStatus | None
    # the cluster's ordering of the status and of the live digests last recorded: apart, for
    # they are ordered by different objects (the DGD's resourceVersion; the pods' lists)
    status_version: int
    live_digests: dict[str, int]
    live_version: int
    adopted: ResourceRef | None  # the DynamoGraphDeployment it was adopted from, if it was
    deleted: bool

    @staticmethod
    def key_for(workload_id: str, cluster_id: str) -> str:
        return f"{workload_id}--{cluster_id}"

    @classmethod
    def create(
        cls,
        cause: Cause,
        *,
        workload_id: str,
        cluster_id: str,
        project: str,
        device_class: str,
        serving: ServingConfig,
        desired_replicas: int,
        authority: Authority = Authority.MANAGED,
        engine_args: tuple[str, ...] = (),
        imported_args: tuple[str, ...] | None = None,
        adopted: ResourceRef | None = None,
    ) -> Deployment:
        _check_replicas(desired_replicas)
        if adopted is not None and authority is Authority.MANAGED:
            raise InvalidValue(
                "an adopted deployment starts observed; promote it to manage it",
                field="authority",
            )
        if authority is Authority.MANAGED and imported_args is not None:
            raise InvalidValue(
                "a managed deployment is declared by the plane and has no imported_args",
                field="imported_args",
            )
        return cls._start(
            DeploymentCreated,
            cls.key_for(workload_id, cluster_id),
            cause,
            workload_id=workload_id,
            cluster_id=cluster_id,
            project=project,
            device_class=device_class,
            serving=serving,
            serving_digest=serving.digest(),
            desired_replicas=desired_replicas,
            authority=authority,
            engine_args=engine_args,
            imported_args=imported_args,
            adopted=adopted,
        )

    # -- plane-declared ---------------------------------------------------------------------

    def scale(self, cause: Cause, desired_replicas: int) -> None:
        self._check_plane(cause, "desired_replicas")
        _check_replicas(desired_replicas)
        if desired_replicas != self.desired_replicas:
            self._record(DeploymentScaled, cause, desired_replicas=desired_replicas)

    def enable(self, cause: Cause) -> None:
        """Enabling a failed deployment, even one enabled already, asks for admission again."""
        self._check_plane(cause, "enabled")
        if not self.enabled or self.admission_phase is AdmissionPhase.FAILED:
            self._record(DeploymentEnabled, cause)

    def disable(self, cause: Cause) -> None:
        self._check_plane(cause, "enabled")
        if self.enabled:
            self._record(DeploymentDisabled, cause)

    def set_engine_args(self, cause: Cause, engine_args: tuple[str, ...]) -> None:
        self._check_plane(cause, "engine_args")
        if engine_args != self.engine_args:
            self._record(EngineArgsSet, cause, engine_args=engine_args)

    def change_serving_config(self, cause: Cause, serving: ServingConfig) -> bool:
        """A new serving configuration is a new generation; an equal one changes nothing. One
        that differs only where the engine does not see it (its digest equal: where pods are
        scheduled, the frontend) is amended in place, in the same generation: it still reaches
        the cluster, but no rollout keeps an old generation up beside it."""
        self._check_plane(cause, "serving config")
        if serving == self.serving:
            return False
        digest = serving.digest()
        if digest == self.serving_digest:
            self._record(ServingConfigAmended, cause, serving=serving)
            return True
        self._record(
            ServingConfigChanged,
            cause,
            generation=self.generation + 1,
            serving=serving,
            serving_digest=digest,
        )
        return True

    def promote_authority(self, cause: Cause, *, force: bool = False) -> None:
        """observed -> managed, the one way authority ever changes."""
        self._check_plane(cause, "authority")
        if self.authority is Authority.MANAGED:
            return
        if self.imported_args is not None and self.imported_args != self.engine_args and not force:
            raise AuthorityDrift(
                "engine_args differ from the imported_args the engine runs with; promoting would "
                "restart it (review engine_args, or pass force)",
                field="engine_args",
                engine_args=list(self.engine_args),
                imported_args=list(self.imported_args),
            )
        self._record(AuthorityPromoted, cause, authority=Authority.MANAGED, forced=force)

    def decide_admission(
        self,
        cause: Cause,
        *,
        admitted: bool,
        reason: AdmissionReason | None,
        evidence: dict[str, int],
        devices: int = 0,
        blocker: str | None = None,
    ) -> None:
        """Admit with `devices` granted, or leave pending with a reason (`blocker`: the older
        deployment it waits behind, when it does). Admitted with a reason:
        granted in part, the rest waits for quota or capacity. Admitting a deployment that is
        placed or running changes only its grant (it scaled): its phase stays. A new
        generation waiting for the previous one keeps the grant the previous one had: the new
        one's replicas start inside it as the old ones release their devices."""
        self._check_plane(cause, "admission")
        if not admitted and reason is None:
            raise InvalidValue("a deployment left pending needs a reason", field="reason")
        if admitted and reason is not None and (reason not in PARTIAL or not devices):
            raise InvalidValue(
                "an admission with a reason grants part of what is wanted: some devices, the "
                "rest waiting for insufficient_quota or insufficient_capacity",
                field="reason",
            )
        keeps = reason is AdmissionReason.WAITING_FOR_PREVIOUS_GENERATION
        if devices < 0 or (devices and not (admitted or keeps)):
            raise InvalidValue(
                "only an admission, or a rollout waiting for its previous generation, holds "
                "devices; never fewer than 0",
                field="devices",
            )
        if keeps and devices > self.granted_devices:
            raise InvalidValue(
                "a rollout waiting for its previous generation keeps its grant; it cannot grow it",
                field="devices",
            )
        phase = AdmissionPhase.ADMITTED if admitted else AdmissionPhase.PENDING
        serving = {AdmissionPhase.PLACED, AdmissionPhase.RUNNING}
        if admitted and self.admission_phase in serving:
            phase = self.admission_phase
        if (phase, reason, devices) == (
            self.admission_phase,
            self.admission_reason,
            self.granted_devices,
        ) and (reason not in PARTIAL or limits_of(evidence) == self.admission_limits):
            return  # nothing new: one waiting in part or whole is told again when its limits moved
        if phase is not self.admission_phase:
            self._check_transition(phase)
        self._record(
            AdmissionDecided,
            cause,
            phase=phase,
            reason=reason,
            evidence=evidence,
            devices=devices,
            blocker=blocker,
        )

    def delete(self, cause: Cause) -> None:
        """Gone for good: its grant is released, and the operator takes down what runs."""
        self._check_plane(cause, "deletion")
        self._record(DeploymentDeleted, cause)

    def _check_plane(self, cause: Cause, what: str) -> None:
        """The plane says what a deployment should be, as long as it exists."""
        require_writer(cause, Writer.PLANE, what)
        if self.deleted:
            raise NotFound(f"deployment {self.key!r} was deleted", field="deployment_id")

    # -- cluster-observed -------------------------------------------------------------------

    def mark_placed(self, cause: Cause) -> None:
        self._observe_phase(cause, AdmissionPhase.PLACED, DeploymentPlaced)

    def mark_running(self, cause: Cause) -> None:
        self._observe_phase(cause, AdmissionPhase.RUNNING, DeploymentRunning)

    def mark_failed(self, cause: Cause, reason: str, message: str) -> None:
        require_writer(cause, Writer.CLUSTER, "failure")
        if self.deleted or self.admission_phase is AdmissionPhase.FAILED:
            return  # deleted: nothing is admitted that could fail
        self._check_transition(AdmissionPhase.FAILED)
        self._record(DeploymentFailed, cause, reason=reason, message=message)

    def follow_replicas(self, cause: Cause, replicas: Iterable[Replica]) -> None:
        """The phase follows the replicas: placed once a live one holds devices, running once
        one is ready."""
        live = [r for r in replicas if not r.terminated]
        if any(r.device_ids for r in live):
            self._advance(cause, AdmissionPhase.PLACED)
        if any(r.ready for r in live):
            self._advance(cause, AdmissionPhase.RUNNING)

    def record_status(self, cause: Cause, status: DeploymentStatus, *, version: int) -> None:
        """The cluster's status, recorded as it is (`observe_status`); a permanent failure, the
        end of one, or no ready replica left, moves the admission phase. Transient conditions
        move nothing: what serves keeps serving while the cluster retries."""
        if not self.observe_status(cause, status, version=version):
            return
        if status.phase is ClusterPhase.FAILED:
            reason = status.reason or "Failed"
            self.mark_failed(cause, reason, status.message or reason)
        elif self.admission_phase is AdmissionPhase.FAILED and not self.deleted:
            self._record(FailureCleared, cause)  # the cluster took it after all: admit again
        elif status.ready_replicas == 0 and self.admission_phase is AdmissionPhase.RUNNING:
            self.mark_placed(cause)  # allocated, but nothing serves now
        elif status.ready_replicas:
            self._advance(cause, AdmissionPhase.RUNNING)

    def _advance(self, cause: Cause, phase: AdmissionPhase) -> None:
        """admitted -> placed -> running, as far as `phase`; a deployment that is not admitted
        (pending, failed) does not move on what its replicas do."""
        if self.admission_phase is AdmissionPhase.ADMITTED:
            self.mark_placed(cause)
        if phase is AdmissionPhase.RUNNING and self.admission_phase is AdmissionPhase.PLACED:
            self.mark_running(cause)

    def observe_status(self, cause: Cause, status: DeploymentStatus, *, version: int = 0) -> bool:
        """Record the cluster's status. `version` is the cluster's own ordering (0: none): a
        report older than the one recorded changes nothing and returns False, and a newer one
        is recorded even when it says the same, so that no older report can undo it."""
        require_writer(cause, Writer.CLUSTER, "status")
        if 0 < version < self.status_version:
            return False
        if status != self.status or version > self.status_version:
            self._record(StatusObserved, cause, status=status, version=version)
        return True

    def observe_live_digests(
        self, cause: Cause, live_digests: dict[str, int], *, version: int = 0
    ) -> bool:
        """Record the digests the cluster's replicas run, ordered by `version` as the status
        is, but apart from it: pods order them, and a sync stamped with the pods' version must
        not make the next status, stamped with the DGD's, look older than it is."""
        require_writer(cause, Writer.CLUSTER, "live_digests")
        if any(count < 0 for count in live_digests.values()):
            raise InvalidValue("replica counts cannot be negative", field="live_digests")
        if 0 < version < self.live_version:
            return False
        live = {digest: count for digest, count in live_digests.items() if count}
        if live != self.live_digests or version > self.live_version:
            self._record(LiveDigestsObserved, cause, live_digests=live, version=version)
        return True

    def record_operator_action(
        self, cause: Cause, *, verb: str, target: str, performed: bool, reason: str
    ) -> None:
        """What the operator wrote to the cluster for it, or would have (`performed` false)."""
        require_writer(cause, Writer.CLUSTER, "an operator action")
        self._record(
            OperatorActed, cause, verb=verb, target=target, performed=performed, reason=reason
        )

    def observe_imported_args(self, cause: Cause, imported_args: tuple[str, ...]) -> None:
        require_writer(cause, Writer.CLUSTER, "imported_args")
        if imported_args != self.imported_args:
            self._record(ImportedArgsObserved, cause, imported_args=imported_args)

    def _observe_phase(self, cause: Cause, phase: AdmissionPhase, event: type[Event]) -> None:
        """A deleted deployment's phase stays where it was: its pods may still report while
        they go, but it is admitted to nothing any more."""
        require_writer(cause, Writer.CLUSTER, f"the {phase.value} phase")
        if not self.deleted and phase is not self.admission_phase:
            self._check_transition(phase)
            self._record(event, cause)

    def _check_transition(self, phase: AdmissionPhase) -> None:
        if phase not in TRANSITIONS[self.admission_phase]:
            raise IllegalTransition(
                f"admission phase cannot go from {self.admission_phase.value} to {phase.value}",
                field="admission_phase",
            )


def _check_replicas(replicas: int) -> None:
    if replicas < 0:
        raise InvalidValue("desired_replicas cannot be negative", field="desired_replicas")


class DeploymentCreated(Created):
    aggregate_class = Deployment
    workload_id: str
    cluster_id: str
    project: str
    device_class: str
    serving: ServingConfig
    serving_digest: str
    desired_replicas: int
    authority: Authority
    engine_args: tuple[str, ...]
    imported_args: tuple[str, ...] | None
    adopted: ResourceRef | None = None

    def apply(self, d: Any) -> None:
        d.workload_id, d.cluster_id, d.project = self.workload_id, self.cluster_id, self.project
        d.device_class, d.desired_replicas = self.device_class, self.desired_replicas
        d.serving, d.serving_digest, d.generation = self.serving, self.serving_digest, 1
        d.authority, d.enabled = self.authority, True
        d.engine_args, d.imported_args = self.engine_args, self.imported_args
        d.adopted = self.adopted
        if self.authority is Authority.MANAGED:
            d.admission_phase = AdmissionPhase.PENDING
            d.admission_reason = AdmissionReason.AWAITING_ADMISSION
        else:  # it runs already: the plane does not admit what it only observes
            d.admission_phase, d.admission_reason = AdmissionPhase.ADMITTED, None
        d.granted_devices = 0
        d.status, d.status_version, d.live_digests, d.live_version = None, 0, {}, 0
        d.deleted = False


class DeploymentScaled(Event):
    desired_replicas: int

    def apply(self, d: Any) -> None:
        d.desired_replicas = self.desired_replicas


class DeploymentEnabled(Event):
    def apply(self, d: Any) -> None:
        d.enabled = True


class DeploymentDisabled(Event):
    def apply(self, d: Any) -> None:
        d.enabled = False


class EngineArgsSet(Event):
    engine_args: tuple[str, ...]

    def apply(self, d: Any) -> None:
        d.engine_args = self.engine_args


class ServingConfigChanged(Event):
    generation: int
    serving: ServingConfig
    serving_digest: str

    def apply(self, d: Any) -> None:
        d.generation, d.serving, d.serving_digest = (
            self.generation,
            self.serving,
            self.serving_digest,
        )


class ServingConfigAmended(Event):
    """The serving config changed where its digest does not look: same generation."""

    serving: ServingConfig

    def apply(self, d: Any) -> None:
        d.serving = self.serving


class AuthorityPromoted(Event):
    authority: Authority
    forced: bool = False

    def apply(self, d: Any) -> None:
        d.authority = self.authority


class AdmissionDecided(Event):
    phase: AdmissionPhase
    reason: AdmissionReason | None
    evidence: dict[str, int]
    devices: int = 0  # granted by this admission
    blocker: str | None = None  # the older deployment it waits behind, if it does

    def apply(self, d: Any) -> None:
        d.admission_phase, d.admission_reason = self.phase, self.reason
        d.granted_devices, d.admission_limits = self.devices, limits_of(self.evidence)


class DeploymentPlaced(Event):
    """It holds devices: what part of it waits for (admitted in part) still waits."""

    def apply(self, d: Any) -> None:
        d.admission_phase = AdmissionPhase.PLACED


class DeploymentRunning(Event):
    def apply(self, d: Any) -> None:
        d.admission_phase = AdmissionPhase.RUNNING


class DeploymentFailed(Event):
    reason: str
    message: str

    def apply(self, d: Any) -> None:
        d.admission_phase = AdmissionPhase.FAILED
        d.admission_reason = AdmissionReason.CLUSTER_FAILURE
        d.granted_devices = 0  # a failure releases the grant; admission starts over


class FailureCleared(Event):
    """The cluster no longer refuses the deployment: admission starts over."""

    def apply(self, d: Any) -> None:
        d.admission_phase = AdmissionPhase.PENDING
        d.admission_reason = AdmissionReason.AWAITING_ADMISSION


class DeploymentDeleted(Event):
    def apply(self, d: Any) -> None:
        d.deleted = True
        d.granted_devices = 0  # released for other deployments' admission


class StatusObserved(Event):
    status: DeploymentStatus
    version: int = 0

    def apply(self, d: Any) -> None:
        d.status, d.status_version = self.status, max(d.status_version, self.version)


class LiveDigestsObserved(Event):
    live_digests: dict[str, int]
    version: int = 0

    def apply(self, d: Any) -> None:
        d.live_digests = dict(self.live_digests)
        d.live_version = max(d.live_version, self.version)


class ImportedArgsObserved(Event):
    imported_args: tuple[str, ...]

    def apply(self, d: Any) -> None:
        d.imported_args = self.imported_args


class OperatorActed(Event):
    verb: str  # create, patch, delete
    target: str  # <namespace>/<name> of the DynamoGraphDeployment
    performed: bool  # false: only would have (observed, or a read-only operator)
    reason: str

    def apply(self, d: Any) -> None:
        return None  # a record for the audit trail; it changes nothing the plane decides
