"""Explain, rule by rule: given a deployment's view as admission left it, then the binding
constraint with its numbers and the change that would unblock it."""

from __future__ import annotations

from typing import Any

from wingsmith.domain.contracts import views as v
from wingsmith.domain.device_classes import did_you_mean
from wingsmith.domain.explain import Around, explain, explain_unplaced


def health(
    *,
    phase: str = "pending",
    reason: str | None = None,
    evidence: dict[str, int] | None = None,
    desired: int = 4,
    per: int = 2,
    granted: int = 0,
    **more: Any,
) -> v.DeploymentHealthView:
    admission: dict[str, Any] = {"phase": phase, "reason": reason, "since": "t"}
    if evidence is not None:
        admission["evidence"] = evidence
    if "blocker" in more:
        admission["blocker"] = more.pop("blocker")
    waiting = max(desired - granted // per, 0)
    view = {
        "deployment_id": "chat--east",
        "workload_id": "chat",
        "cluster_id": "east",
        "project": "p",
        "device_class": "H100",
        "desired_replicas": desired,
        "ready_replicas": 0,
        "enabled": True,
        "authority": "managed",
        "admission": admission,
        "devices_per_replica": per,
        "granted_devices": granted,
        "waiting_replicas": waiting,
    } | more
    return view  # type: ignore[return-value]  # the fields explain reads


def test_past_its_quota_it_says_the_quota_and_what_to_raise_it_to() -> None:
    # given 4 replicas of 2 devices wanted, a quota of 6 of which others hold 2: 2 granted
    evidence = {"wanted": 8, "quota": 6, "held_by_project": 2, "capacity": 32, "granted": 4}
    h = health(phase="admitted", reason="insufficient_quota", evidence=evidence, granted=4)
    # when
    e = explain(h)
    # then
    assert (e["wants"], e["holds"], e["waiting"]) == (
        {"replicas": 4, "devices": 8},
        {"replicas": 2, "devices": 4},
        {"replicas": 2, "devices": 4},
    )
    assert e["constraint"] is not None
    assert e["constraint"]["reason"] == "insufficient_quota"
    assert e["constraint"]["numbers"] == {
        "quota": 6,
        "held_by_others": 2,
        "free": 4,
        "wanted": 8,
        "granted": 4,
        "quota_needed": 10,
    }
    assert e["unblock"][0].startswith("raise project p's quota for H100 to at least 10")
    assert "wants 2 replicas" in e["unblock"][-1]


def test_short_of_capacity_in_sum_it_says_how_many_devices_to_free() -> None:
    evidence = {"wanted": 8, "capacity": 8, "held_in_cluster": 6, "quota": 100, "granted": 2}
    h = health(phase="running", reason="insufficient_capacity", evidence=evidence, granted=2)
    e = explain(h, Around(nodes_free={"n1": 0, "n2": 2}, cluster_classes=["H100"]))
    assert e["constraint"] is not None
    assert e["constraint"]["numbers"]["free"] == 2
    assert e["constraint"]["nodes_free"] == {"n1": 0, "n2": 2}
    assert e["unblock"][0] == "free 6 H100 devices on cluster east, or add nodes"


def test_short_of_room_per_node_it_says_how_many_pods_find_no_node() -> None:
    # given 8 free in sum, but pods of 4 devices: only 1 of the 2 new pods fits a node
    evidence = {
        "wanted": 8,
        "capacity": 16,
        "held_in_cluster": 8,
        "granted": 4,
        "pod_devices": 4,
        "pods_needed": 2,
        "pods_fitting": 1,
        "largest_node_free": 4,
    }
    h = health(reason="insufficient_capacity", evidence=evidence, per=4, desired=2, granted=4)
    e = explain(h)
    assert e["constraint"] is not None
    assert e["constraint"]["numbers"]["pods_needed"] == 2
    assert "only 1 fit" in e["constraint"]["message"]
    assert e["unblock"][0] == "free 4 devices on one node of cluster east for each of 1 pods"


def test_a_worker_wider_than_any_node_asks_for_larger_nodes() -> None:
    evidence = {"wanted": 16, "capacity": 16, "held_in_cluster": 0, "granted": 0}
    evidence |= {"worker_devices": 16, "pod_devices": 16, "node_devices": 8}
    e = explain(health(reason="insufficient_capacity", evidence=evidence, per=16, desired=1))
    assert e["unblock"][0] == "add H100 nodes of at least 16 devices to cluster east"


def test_behind_an_older_blocker_it_names_it_its_place_and_what_frees_the_blocker() -> None:
    # given the blocker waits for quota; this one would fit but is second in the queue
    blocked = explain(
        health(
            reason="insufficient_quota",
            evidence={"wanted": 8, "quota": 4, "held_by_project": 0, "granted": 0},
        )
    )
    evidence = {"wanted": 2, "quota": 4, "held_by_project": 0, "queue_position": 2, "granted": 0}
    h = health(
        reason="insufficient_quota",
        evidence=evidence,
        desired=1,
        deployment_id="small--east",
        blocker="chat--east",
    )
    # when
    e = explain(h, Around(blocker=blocked))
    # then
    assert e["constraint"] is not None
    assert e["constraint"]["blocker"] == "chat--east"
    assert e["constraint"]["numbers"]["queue_position"] == 2
    assert e["unblock"][0].startswith("wait for chat--east ahead in the queue")
    assert e["unblock"][1].startswith("for chat--east: raise project p's quota for H100 to at")
    assert e.get("blocked_by", {}).get("reason") == "insufficient_quota"
    assert "number 2 in the queue" in e["summary"]


def test_a_pinned_cluster_without_the_class_says_what_the_cluster_reports() -> None:
    evidence = {"wanted": 8, "capacity": 0, "held_in_cluster": 0, "granted": 0}
    h = health(reason="insufficient_capacity", evidence=evidence, device_class="NVIDIA-H100")
    e = explain(h, Around(cluster_classes=["NVIDIA-H100-80GB-HBM3"]))
    assert e["constraint"] is not None
    assert e["constraint"]["message"] == "cluster east reports no NVIDIA-H100 devices"
    assert e["constraint"]["did_you_mean"] == ["NVIDIA-H100-80GB-HBM3"]


def test_a_class_no_cluster_has_explains_the_unplaced_workload() -> None:
    workload: Any = {
        "workload_id": "chat",
        "project": "p",
        "device_class": "NVIDIA-H100",
        "replicas": 2,
        "serving": {"devices_per_replica": 1},
        "deployments": {},
        "unplaced": "none of reachable clusters reports NVIDIA-H100 devices",
        "unplaced_reason": "no_cluster_has_device_class",
    }
    e = explain_unplaced(workload, ["NVIDIA-H100-80GB-HBM3", "L4"])
    assert (e["deployment_id"], e["waiting"]["replicas"]) == (None, 2)
    assert e["constraint"] is not None
    assert e["constraint"]["reason"] == "no_cluster_has_device_class"
    assert e["constraint"]["did_you_mean"] == ["NVIDIA-H100-80GB-HBM3"]
    assert "'NVIDIA-H100-80GB-HBM3'" in e["unblock"][1]


def test_a_selector_no_cluster_matches_says_to_register_one_or_change_it() -> None:
    workload: Any = {
        "workload_id": "chat--2",
        "name": "chat",
        "project": "p",
        "device_class": "H100",
        "replicas": 2,
        "serving": {"devices_per_replica": 1},
        "deployments": {},
        "unplaced": "none of reachable clusters that report H100 devices has tier=gold",
        "unplaced_reason": "no_cluster_matches_selector",
    }
    e = explain_unplaced(workload, ["H100"])
    assert e["constraint"] is not None
    assert e["constraint"]["reason"] == "no_cluster_matches_selector"
    assert "did_you_mean" not in e["constraint"]
    assert "labels its selector asks for" in e["unblock"][0]
    assert "`wingsmith workloads prefer chat --selector" in e["unblock"][1]


def test_fully_running_nothing_waits() -> None:
    evidence = {"wanted": 8, "quota": 8, "held_by_project": 0, "granted": 8}
    e = explain(health(phase="running", evidence=evidence, granted=8))
    assert (e["constraint"], e["unblock"]) == (None, [])
    assert e["summary"].startswith("nothing waits")
    assert e["waiting"] == {"replicas": 0, "devices": 0}


def test_disabled_it_says_to_enable_it() -> None:
    e = explain(health(reason="disabled", enabled=False, waiting_replicas=0))
    assert e["constraint"] is not None and e["constraint"]["reason"] == "disabled"
    assert e["wants"]["replicas"] == 0
    assert "deployments enable chat--east" in e["unblock"][0]


def test_did_you_mean_finds_case_short_names_and_close_spellings() -> None:
    reported = ["NVIDIA-H100-80GB-HBM3", "L4"]
    assert did_you_mean("NVIDIA-H100", reported) == ["NVIDIA-H100-80GB-HBM3"]
    assert did_you_mean("nvidia-h100-80gb-hbm3", reported) == ["NVIDIA-H100-80GB-HBM3"]
    assert did_you_mean("l4", reported) == ["L4"]
    assert did_you_mean("MI300X", reported) == []
