from __future__ import annotations

import pytest

from wingsmith.domain.base import IllegalTransition, InvalidValue, NotFound, WrongWriter
from wingsmith.domain.deployment import (
    AdmissionPhase,
    AdmissionReason,
    Authority,
    AuthorityDrift,
    ClusterPhase,
    Deployment,
    DeploymentStatus,
    StatusCondition,
)
from wingsmith.domain.replica import Replica

from .conftest import cluster, plane, recorded, serving


def managed(**kw: object) -> Deployment:
    args: dict[str, object] = {
        "workload_id": "llama",
        "cluster_id": "east",
        "project": "research",
        "device_class": "H100",
        "serving": serving(),
        "desired_replicas": 2,
    }
    deployment = Deployment.create(plane(), **(args | kw))  # type: ignore[arg-type]
    recorded(deployment)
    return deployment


def adopted(imported: tuple[str, ...] = ("--max-model-len", "8192")) -> Deployment:
    return managed(authority=Authority.OBSERVED, imported_args=imported)


def admit(d: Deployment) -> None:
    d.decide_admission(plane(), admitted=True, reason=None, evidence={"quota": 8, "free": 8})


def test_a_new_deployment_is_pending_with_no_status() -> None:
    d = managed()
    assert (d.admission_phase, d.admission_reason) == (
        AdmissionPhase.PENDING,
        AdmissionReason.AWAITING_ADMISSION,
    )
    assert d.status is None and d.live_digests == {} and d.generation == 1
    assert d.authority is Authority.MANAGED and d.enabled


def test_phases_advance_pending_admitted_placed_running() -> None:
    d = managed()
    admit(d)
    d.mark_placed(cluster())
    d.mark_running(cluster())
    assert recorded(d) == ["AdmissionDecided", "DeploymentPlaced", "DeploymentRunning"]
    assert d.admission_phase is AdmissionPhase.RUNNING


@pytest.mark.parametrize("mark", ["mark_placed", "mark_running"])
def test_a_pending_deployment_cannot_skip_admission(mark: str) -> None:
    d = managed()
    with pytest.raises(IllegalTransition):
        getattr(d, mark)(cluster())
    assert recorded(d) == []


def test_staying_pending_needs_a_reason_and_records_it() -> None:
    d = managed()
    with pytest.raises(InvalidValue):
        d.decide_admission(plane(), admitted=False, reason=None, evidence={})
    d.decide_admission(
        plane(),
        admitted=False,
        reason=AdmissionReason.INSUFFICIENT_QUOTA,
        evidence={"quota": 2, "requested": 8},
    )
    assert d.admission_reason is AdmissionReason.INSUFFICIENT_QUOTA
    d.decide_admission(
        plane(),
        admitted=False,
        reason=AdmissionReason.INSUFFICIENT_QUOTA,
        evidence={"quota": 2, "requested": 8},
    )
    assert recorded(d) == ["AdmissionDecided"]


def test_a_grant_in_part_is_admitted_and_keeps_its_reason_while_it_serves() -> None:
    d = managed()
    quota = AdmissionReason.INSUFFICIENT_QUOTA
    for reason, devices in ((quota, 0), (AdmissionReason.DISABLED, 2)):
        with pytest.raises(InvalidValue) as refused:
            d.decide_admission(plane(), admitted=True, reason=reason, evidence={}, devices=devices)
        assert refused.value.field == "reason"
    d.decide_admission(plane(), admitted=True, reason=quota, evidence={"waiting": 2}, devices=2)
    assert (d.admission_phase, d.admission_reason, d.granted_devices) == ("admitted", quota, 2)
    d.mark_placed(cluster())
    d.mark_running(cluster())
    assert (d.admission_phase, d.admission_reason) == (AdmissionPhase.RUNNING, quota)
    d.decide_admission(plane(), admitted=True, reason=None, evidence={}, devices=4)
    assert (d.admission_phase, d.admission_reason, d.granted_devices) == ("running", None, 4)


def test_a_grant_in_part_is_told_again_when_its_quota_or_capacity_moves() -> None:
    d = managed()
    quota = AdmissionReason.INSUFFICIENT_QUOTA
    for limit in (4, 4, 2):  # the same grant, measured against a quota that shrank
        d.decide_admission(
            plane(), admitted=True, reason=quota, evidence={"quota": limit}, devices=4
        )
    assert recorded(d) == ["AdmissionDecided", "AdmissionDecided"]
    assert d.admission_limits == (2, None, False)


def test_a_failed_deployment_only_goes_back_to_pending() -> None:
    d = managed()
    admit(d)
    d.mark_failed(cluster(), "ImagePullBackOff", "image not found")
    d.mark_failed(cluster(), "ImagePullBackOff", "image not found")
    assert recorded(d) == ["AdmissionDecided", "DeploymentFailed"]
    with pytest.raises(IllegalTransition):
        d.mark_running(cluster())
    with pytest.raises(IllegalTransition):
        admit(d)
    d.decide_admission(
        plane(), admitted=False, reason=AdmissionReason.INSUFFICIENT_CAPACITY, evidence={}
    )
    assert d.admission_phase is AdmissionPhase.PENDING


def test_generation_moves_only_when_the_serving_config_changes() -> None:
    d = managed()
    assert not d.change_serving_config(plane(), serving())
    assert d.change_serving_config(plane(), serving(engine_version="0.10.0"))
    assert not d.change_serving_config(plane(), serving(engine_version="0.10.0"))
    d.scale(plane(), 5)
    d.set_engine_args(plane(), ("--enforce-eager",))
    assert d.generation == 2
    assert d.serving_digest == serving(engine_version="0.10.0").digest()
    assert recorded(d) == ["ServingConfigChanged", "DeploymentScaled", "EngineArgsSet"]


def test_plane_and_cluster_write_only_their_own_fields() -> None:
    d = managed()
    status = DeploymentStatus(phase=ClusterPhase.READY, ready_replicas=2, desired_replicas=2)
    with pytest.raises(WrongWriter):
        d.observe_status(plane(), status)
    with pytest.raises(WrongWriter):
        d.scale(cluster(), 3)
    with pytest.raises(WrongWriter):
        d.set_engine_args(cluster(), ("--x",))
    with pytest.raises(WrongWriter):
        d.observe_imported_args(plane(), ("--x",))
    d.observe_status(cluster(), status)
    assert d.status == status and d.desired_replicas == 2


def test_live_digests_drop_empty_entries_and_repeat_observations_record_nothing() -> None:
    d = managed()
    d.observe_live_digests(cluster(), {"svg_old": 2, "svg_new": 2})
    d.observe_live_digests(cluster(), {"svg_old": 0, "svg_new": 4})
    d.observe_live_digests(cluster(), {"svg_new": 4})
    assert d.live_digests == {"svg_new": 4}
    assert recorded(d) == ["LiveDigestsObserved", "LiveDigestsObserved"]


def test_a_managed_deployment_cannot_carry_imported_args() -> None:
    with pytest.raises(InvalidValue) as refused:
        managed(imported_args=("--x",))
    assert refused.value.field == "imported_args"


def test_engine_and_imported_args_stay_separate() -> None:
    d = adopted()
    d.set_engine_args(plane(), ("--max-model-len", "4096"))
    d.observe_imported_args(cluster(), ("--max-model-len", "16384"))
    assert d.engine_args == ("--max-model-len", "4096")
    assert d.imported_args == ("--max-model-len", "16384")


def test_promotion_refuses_drift_unless_forced() -> None:
    d = adopted()
    with pytest.raises(AuthorityDrift) as refused:
        d.promote_authority(plane())
    assert refused.value.details["imported_args"] == ["--max-model-len", "8192"]
    assert d.authority is Authority.OBSERVED
    d.promote_authority(plane(), force=True)
    assert d.authority is Authority.MANAGED


def test_promotion_with_matching_args_is_one_event_and_then_a_no_op() -> None:
    d = adopted()
    d.set_engine_args(plane(), ("--max-model-len", "8192"))
    d.promote_authority(plane())
    d.promote_authority(plane())
    assert recorded(d) == ["EngineArgsSet", "AuthorityPromoted"]
    assert d.generation == 1  # promotion alone is no new generation: nothing restarts


def test_disable_and_enable() -> None:
    d = managed()
    d.disable(plane())
    d.disable(plane())
    d.enable(plane())
    assert recorded(d) == ["DeploymentDisabled", "DeploymentEnabled"]


def test_admission_decisions_name_a_reason_only_when_pending() -> None:
    d = managed()
    with pytest.raises(InvalidValue):
        d.decide_admission(
            plane(), admitted=True, reason=AdmissionReason.INSUFFICIENT_QUOTA, evidence={}
        )
    admit(d)
    admit(d)  # deciding the same again is no transition and no event
    assert recorded(d) == ["AdmissionDecided"]


def deleted() -> Deployment:
    d = managed()
    d.decide_admission(plane(), admitted=True, reason=None, evidence={}, devices=8)
    d.mark_placed(cluster())
    d.delete(plane())
    assert recorded(d)[-1] == "DeploymentDeleted"
    return d


def test_deleting_releases_the_grant_and_keeps_the_phase() -> None:
    d = deleted()
    assert d.deleted and d.granted_devices == 0
    assert d.admission_phase is AdmissionPhase.PLACED


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        ("scale", (2,), {}),  # even what would change nothing
        ("enable", (), {}),
        ("disable", (), {}),
        ("set_engine_args", (("--x",),), {}),
        ("change_serving_config", (serving(engine_version="0.10.0"),), {}),
        ("promote_authority", (), {}),
        ("decide_admission", (), {"admitted": True, "reason": None, "evidence": {}}),
        ("delete", (), {}),
    ],
)
def test_a_deleted_deployment_refuses_the_plane(
    method: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    d = deleted()
    with pytest.raises(NotFound) as refused:
        getattr(d, method)(plane(), *args, **kwargs)
    assert (refused.value.field, refused.value.message) == (
        "deployment_id",
        "deployment 'llama--east' was deleted",
    )
    assert recorded(d) == []


def test_a_deleted_deployment_records_what_its_cluster_reports_without_moving_its_phase() -> None:
    d = deleted()
    d.mark_running(cluster())
    d.mark_failed(cluster(), "Evicted", "node drained")
    going = DeploymentStatus(phase=ClusterPhase.PROGRESSING, ready_replicas=0, desired_replicas=0)
    d.observe_status(cluster(), going)
    d.observe_live_digests(cluster(), {"svg_a": 1})
    d.record_operator_action(
        cluster(), verb="delete", target="ns/llama", performed=True, reason="removed"
    )
    assert recorded(d) == ["StatusObserved", "LiveDigestsObserved", "OperatorActed"]
    assert d.admission_phase is AdmissionPhase.PLACED and d.status == going


def test_only_the_plane_deletes() -> None:
    d = managed()
    with pytest.raises(WrongWriter):
        d.delete(cluster())


def replica(*, devices: tuple[str, ...] = ("GPU-0",), ready: bool = False) -> Replica:
    r = Replica.start(
        cluster(),
        deployment_id="llama--east",
        name="llama-worker-0",
        node_id="n1",
        device_ids=devices,
        serving_digest="d",
        engine_version="0.9.2",
    )
    if ready:
        r.mark_ready(cluster())
    return r


def test_the_phase_follows_live_replicas_only_once_admitted() -> None:
    d = managed()
    d.follow_replicas(cluster(), [replica(ready=True)])
    assert d.admission_phase is AdmissionPhase.PENDING  # not admitted: replicas move nothing
    admit(d)
    gone = replica(ready=True)
    gone.terminate(cluster())
    d.follow_replicas(cluster(), [gone, replica(devices=())])
    assert d.admission_phase is AdmissionPhase.ADMITTED  # neither live nor holding devices
    d.follow_replicas(cluster(), [replica()])
    assert d.admission_phase is AdmissionPhase.PLACED
    d.follow_replicas(cluster(), [replica(ready=True)])
    assert recorded(d) == ["AdmissionDecided", "DeploymentPlaced", "DeploymentRunning"]


def status(phase: ClusterPhase, ready: int, **kw: object) -> DeploymentStatus:
    return DeploymentStatus(phase=phase, ready_replicas=ready, desired_replicas=2, **kw)


def test_a_status_moves_the_phase_only_when_it_is_news() -> None:
    d = managed()
    admit(d)
    d.record_status(cluster(), status(ClusterPhase.READY, 2), version=5)
    assert d.admission_phase is AdmissionPhase.RUNNING
    d.record_status(cluster(), status(ClusterPhase.PROGRESSING, 0), version=4)  # older
    assert d.admission_phase is AdmissionPhase.RUNNING
    d.record_status(cluster(), status(ClusterPhase.PROGRESSING, 0), version=6)
    assert d.admission_phase is AdmissionPhase.PLACED  # allocated, nothing serves
    d.record_status(cluster(), status(ClusterPhase.FAILED, 0, message="OOM"), version=7)
    assert (d.admission_phase, d.admission_reason) == (
        AdmissionPhase.FAILED,
        AdmissionReason.CLUSTER_FAILURE,
    )


def test_transient_conditions_keep_a_serving_deployment_serving() -> None:
    d = managed()
    d.decide_admission(plane(), admitted=True, reason=None, evidence={}, devices=2)
    d.record_status(cluster(), status(ClusterPhase.READY, 2), version=1)
    pulling = StatusCondition(reason="ImagePullBackOff", message="pull access denied", pods=1)
    d.record_status(
        cluster(), status(ClusterPhase.PROGRESSING, 1, conditions=(pulling,)), version=2
    )
    assert d.admission_phase is AdmissionPhase.RUNNING and d.granted_devices == 2
    assert d.status is not None and d.status.conditions == (pulling,)
    d.record_status(cluster(), status(ClusterPhase.READY, 2), version=3)
    assert d.status is not None and d.status.conditions == ()
    assert "DeploymentFailed" not in recorded(d)


def test_live_digests_stamped_with_the_pods_version_leave_the_status_its_own_order() -> None:
    """A DGD's status is ordered by the DGD's resourceVersion, a sync's live digests by the pods'
    lists; on a real API server both come from one etcd revision counter, so the pods' is
    usually ahead. A sync must not make the next status of the same DGD look old."""
    d = managed()
    admit(d)
    d.record_status(cluster(), status(ClusterPhase.PROGRESSING, 0), version=5)
    assert d.observe_live_digests(cluster(), {"svg_a": 2}, version=9)  # a sync: pods at 9
    pulling = StatusCondition(reason="ImagePullBackOff", message="back-off", pods=1)
    news = status(ClusterPhase.PROGRESSING, 1, conditions=(pulling,))
    assert d.observe_status(cluster(), news, version=5)  # the same DGD, its pods changed
    assert d.status == news
    assert not d.observe_status(cluster(), status(ClusterPhase.UNKNOWN, 0), version=4)  # older
    assert not d.observe_live_digests(cluster(), {}, version=8)  # an older list of pods
    assert (d.status, d.live_digests) == (news, {"svg_a": 2})


def test_a_permanent_failure_clears_when_the_cluster_takes_the_deployment() -> None:
    d = managed()
    admit(d)
    refused = StatusCondition(
        reason="Rejected", message="spec.components: immutable", permanent=True
    )
    d.record_status(cluster(), status(ClusterPhase.FAILED, 0, conditions=(refused,)), version=1)
    assert d.admission_phase is AdmissionPhase.FAILED and d.granted_devices == 0
    d.record_status(cluster(), status(ClusterPhase.FAILED, 0), version=2)  # still refused
    assert recorded(d).count("FailureCleared") == 0
    d.record_status(cluster(), status(ClusterPhase.PROGRESSING, 0), version=3)
    assert recorded(d)[-1] == "FailureCleared"
    assert (d.admission_phase, d.admission_reason) == (
        AdmissionPhase.PENDING,
        AdmissionReason.AWAITING_ADMISSION,
    )


def test_enabling_a_failed_deployment_asks_for_admission_again() -> None:
    d = managed()
    admit(d)
    d.record_status(cluster(), status(ClusterPhase.FAILED, 0), version=1)
    recorded(d)
    d.enable(plane())
    assert recorded(d) == ["DeploymentEnabled"]
    d.enable(plane())  # enabled, and no longer failed once admission decides: nothing more
    d.decide_admission(
        plane(), admitted=False, reason=AdmissionReason.AWAITING_ADMISSION, evidence={}
    )
    d.enable(plane())
    assert recorded(d) == ["DeploymentEnabled", "AdmissionDecided"]


def test_a_status_has_bounded_conditions_with_kubernetes_reasons() -> None:
    with pytest.raises(ValueError, match="reason"):
        StatusCondition(reason="image pull; rm -rf")
    with pytest.raises(ValueError, match="conditions"):
        status(ClusterPhase.READY, 1, conditions=[StatusCondition(reason="X")] * 17)
