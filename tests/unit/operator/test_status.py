"""A deployment's status from its DGD and pods (pure): whole replicas, conditions beside the
phase, and the DGD's own status read with its generation and rolling update."""

from __future__ import annotations

from typing import Any

import pytest

from wingsmith.domain.deployment import ClusterPhase, StatusCondition
from wingsmith.services.operator.status import deployment_status


def graph(*workers: tuple[str, str, int], nodes: int = 1, **status: Any) -> dict[str, Any]:
    components = [{"name": "frontend", "type": "frontend", "replicas": 1}]
    for name, kind, replicas in workers:
        component: dict[str, Any] = {"name": name, "type": kind, "replicas": replicas}
        if nodes > 1:
            component["multinode"] = {"nodeCount": nodes}
        components.append(component)
    return {
        "metadata": {"name": "g", "generation": 1},
        "spec": {"components": components},
        "status": status,
    }


def pod(name: str, component: str, ready: bool = True, **extra: Any) -> dict[str, Any]:
    labels = {"nvidia.com/dynamo-component": component} | extra.pop("labels", {})
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        | extra,
    }


DISAGG = (("prefill", "prefill", 2), ("decode", "decode", 2))


def test_per_component_status_counts_a_prefill_and_decode_pair_once() -> None:
    components = {
        "prefill": {"replicas": 2, "readyReplicas": 2},
        "decode": {"replicas": 2, "readyReplicas": 2},
    }
    status = deployment_status(graph(*DISAGG, state="successful", components=components), [], 2)
    assert (status.ready_replicas, status.phase) == (2, ClusterPhase.READY)
    components["decode"]["readyReplicas"] = 0
    down = deployment_status(graph(*DISAGG, state="successful", components=components), [], 2)
    assert (down.ready_replicas, down.phase) == (0, ClusterPhase.PROGRESSING)


def test_without_per_component_status_pods_are_counted() -> None:
    pods = [pod("p0", "prefill"), pod("p1", "prefill"), pod("d0", "decode"), pod("d1", "decode")]
    status = deployment_status(graph(*DISAGG, state="successful"), pods, 2)
    assert (status.ready_replicas, status.phase) == (2, ClusterPhase.READY)
    pods[3] = pod("d1", "decode", ready=False)
    assert deployment_status(graph(*DISAGG, state="successful"), pods, 2).ready_replicas == 1


def test_a_multinode_replica_is_ready_only_when_all_its_pods_are() -> None:
    index = "leaderworkerset.sigs.k8s.io/group-index"
    pods = [
        pod("w0-0", "worker", labels={index: "0"}),
        pod("w0-1", "worker", labels={index: "0"}),
        pod("w1-0", "worker", labels={index: "1"}),
        pod("w1-1", "worker", ready=False, labels={index: "1"}),
    ]
    dgd = graph(("worker", "worker", 2), nodes=2, state="pending")
    assert deployment_status(dgd, pods, 2).ready_replicas == 1


def test_a_status_older_than_the_spec_or_a_rolling_update_is_progressing() -> None:
    components = {"worker": {"replicas": 1, "readyReplicas": 1}}
    dgd = graph(("worker", "worker", 1), state="successful", components=components)
    assert deployment_status(dgd, [], 1).phase is ClusterPhase.READY
    dgd["metadata"]["generation"] = 2
    dgd["status"]["observedGeneration"] = 1
    stale = deployment_status(dgd, [], 1)
    assert (stale.phase, stale.reason) == (ClusterPhase.PROGRESSING, "StatusNotYetObserved")
    dgd["status"]["observedGeneration"] = 2
    dgd["status"]["rollingUpdate"] = {"phase": "InProgress"}
    rolling = deployment_status(dgd, [], 1)
    assert (rolling.phase, rolling.reason) == (ClusterPhase.PROGRESSING, "RollingUpdate")


def test_a_failed_dgd_is_a_transient_condition_never_the_phase_failed() -> None:
    ready = {"type": "Ready", "status": "False", "reason": "pods_not_ready", "message": "0/1"}
    dgd = graph(("worker", "worker", 1), state="failed", conditions=[ready])
    status = deployment_status(dgd, [], 1)
    assert status.phase is ClusterPhase.PROGRESSING
    assert status.conditions == (
        StatusCondition(reason="pods_not_ready", message="0/1", permanent=False, pods=0),
    )


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (
            {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such tag"}}},
            "ImagePullBackOff",
        ),
        ({"state": {"waiting": {"reason": "ErrImagePull"}}}, "ErrImagePull"),
        (
            {"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}},
            "CrashLoopBackOff",
        ),
        (
            {"state": {"running": {}}, "lastState": {"terminated": {"reason": "OOMKilled"}}},
            "OOMKilled",
        ),
    ],
)
def test_container_trouble_is_a_condition_counting_its_pods(
    state: dict[str, Any], reason: str
) -> None:
    sick = [{"name": "main", **state}]
    pods = [
        pod("w0", "worker"),
        pod("w1", "worker", ready=False, containerStatuses=sick),
        pod("w2", "worker", ready=False, containerStatuses=sick),
    ]
    status = deployment_status(graph(("worker", "worker", 3), state="pending"), pods, 3)
    [condition] = status.conditions
    assert (condition.reason, condition.pods, condition.permanent) == (reason, 2, False)
    assert condition.message is not None and condition.message.startswith("w1: ")
    assert status.ready_replicas == 1 and status.phase is ClusterPhase.PENDING


def test_a_legacy_main_frontend_is_no_worker_to_count() -> None:
    from pathlib import Path

    from wingsmith.services.operator.inspect import load_manifest

    path = Path(__file__).parents[2] / "fixtures/dgd/vllm-legacy-frontend-main-v1alpha1.yaml"
    dgd = load_manifest(path.read_text())
    dgd["status"] = {
        "state": "successful",
        "services": {
            "Frontend": {"replicas": 1, "readyReplicas": 1},
            "VllmWorker": {"replicas": 2, "readyReplicas": 2},
        },
    }
    status = deployment_status(dgd, [], None)
    assert (status.ready_replicas, status.desired_replicas) == (2, 2)
