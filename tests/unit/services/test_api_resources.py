"""The REST API's pure parts: `{ref}` resolution and resources over views, bearer tokens, and
problem documents."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from wingsmith.domain.contracts.replies import HubError
from wingsmith.services.api import resources as r
from wingsmith.services.api.app import Tokens
from wingsmith.services.api.problems import Problem


class Views:
    def __init__(self, **projections: dict[str, dict[str, Any]]) -> None:
        self.projections = projections

    def get(self, projection: str, key: str) -> dict[str, Any] | None:
        return self.projections.get(projection, {}).get(key)

    def all(self, projection: str) -> Iterable[dict[str, Any]]:
        return list(self.projections.get(projection, {}).values())


def health(deployment_id: str, cluster: str) -> dict[str, Any]:
    workload = deployment_id.split("--")[0]
    return {
        "deployment_id": deployment_id,
        "workload_id": workload,
        "cluster_id": cluster,
        "desired_replicas": 2,
        "ready_replicas": 1,
        "waiting_replicas": 0,
        "live_digests": {"svg_a": 1},
        "admission": {"phase": "running", "reason": None},
    }


def sighting(cluster: str, namespace: str, name: str) -> dict[str, Any]:
    key = f"{cluster}--{namespace}--{name}"
    return {
        "discovery_id": key,
        "cluster_id": cluster,
        "namespace": namespace,
        "name": name,
        "state": "sighted",
    }


VIEWS = Views(
    workloads={
        "llama": {
            "workload_id": "llama",
            "name": "llama",
            "project": "p",
            "deployments": {"east": "llama--east"},
        },
        "both": {
            "workload_id": "both",
            "name": "both",
            "project": "p",
            "deployments": {"east": "both--east", "west": "both--west"},
        },
    },
    deployment_health={
        key: health(key, key.split("--")[1]) for key in ("llama--east", "both--east", "both--west")
    },
    discovered={
        v["discovery_id"]: v
        for v in (
            sighting("east", "team-a", "qwen"),
            sighting("west", "team-a", "qwen"),
            sighting("west", "team-b", "mistral") | {"state": "ignored"},
        )
    },
    allocations={
        "llama--east--pod-1": {"replica_id": "llama--east--pod-1", "deployment_id": "llama--east"}
    },
    workload_phase={"llama": {"workload_id": "llama", "phase": "running"}},
)


@pytest.mark.parametrize("ref", ["llama--east", "llama/east", "llama@east", "llama"])
def test_a_deployment_is_found_by_id_or_by_a_readable_name(ref: str) -> None:
    assert r.deployment_id(VIEWS, ref) == "llama--east"


def test_a_workload_with_two_deployments_does_not_name_one() -> None:
    with pytest.raises(Problem) as refused:
        r.deployment_id(VIEWS, "both")
    assert (refused.value.code, refused.value.status) == ("ambiguous_reference", 409)
    assert refused.value.details["candidates"] == ["both--east", "both--west"]


@pytest.mark.parametrize(
    ("ref", "found"),
    [
        ("east--team-a--qwen", "east--team-a--qwen"),
        ("east/team-a/qwen", "east--team-a--qwen"),
        ("mistral", "west--team-b--mistral"),
        ("team-b/mistral", "west--team-b--mistral"),
    ],
)
def test_a_discovered_model_is_found_by_id_or_by_its_objects_name(ref: str, found: str) -> None:
    assert r.discovery_id(VIEWS, ref) == found


def test_a_name_on_two_clusters_is_ambiguous_and_nothing_is_not_found() -> None:
    with pytest.raises(Problem) as ambiguous:
        r.discovery_id(VIEWS, "team-a/qwen")
    assert ambiguous.value.details["candidates"] == ["east--team-a--qwen", "west--team-a--qwen"]
    with pytest.raises(Problem) as missing:
        r.discovery_id(VIEWS, "nothing")
    assert (missing.value.status, missing.value.field) == (404, "ref")


def test_a_workload_name_the_views_lack_is_left_for_the_hub_but_a_bad_one_is_not() -> None:
    assert r.workload_id(VIEWS, "created-elsewhere") == "created-elsewhere"
    with pytest.raises(Problem):
        r.workload_id(VIEWS, "Not A Name")


def test_resources_join_the_views() -> None:
    deployment = r.deployment(VIEWS, "llama--east")
    assert deployment["admission_phase"] == "running"
    assert [x["replica_id"] for x in deployment["replicas"]] == ["llama--east--pod-1"]
    workload = r.workload(VIEWS, "llama")
    assert workload["phase"] == "running"
    assert workload["deployments"][0]["live_digests"] == {"svg_a": 1}
    assert r.workload(VIEWS, "both")["phase"] == "pending"  # no phase view yet
    assert [d["name"] for d in r.discovered(VIEWS)] == ["qwen", "qwen"]
    assert len(r.discovered(VIEWS, include_ignored=True)) == 3


def test_a_clusters_nodes_are_listed_by_class_and_name() -> None:
    def at(cluster: str, device_class: str, node: str) -> dict[str, Any]:
        return {"cluster_id": cluster, "device_class": device_class, "node_id": node}

    nodes = [at("east", "H100", "n2"), at("east", "A100", "n9"), at("east", "H100", "n1")]
    views = Views(
        clusters={"east": {"cluster_id": "east"}},
        capacity_nodes={f"{n['cluster_id']}.{n['device_class']}.{n['node_id']}": n for n in nodes}
        | {"west.H100.n1": at("west", "H100", "n1")},
    )
    assert [n["node_id"] for n in r.nodes(views, "east")] == ["n9", "n1", "n2"]
    assert [n["node_id"] for n in r.nodes(views, "east", device_class="H100")] == ["n1", "n2"]
    with pytest.raises(Problem) as missing:
        r.nodes(views, "west")  # its nodes' views, but no such cluster
    assert (missing.value.status, missing.value.field) == (404, "ref")


TOKENS = Tokens(writers={"w" * 20: "alice"}, readers={"r" * 20: "dashboard"})


def test_tokens_say_who_and_what_they_may_do() -> None:
    assert TOKENS.check("w" * 20, write=True) == "alice"
    assert TOKENS.check("r" * 20, write=False) == "dashboard"
    for token, write, code in (
        (None, False, "unauthorized"),
        ("", True, "unauthorized"),
        ("w" * 19, True, "unauthorized"),
        ("r" * 20, True, "forbidden"),
    ):
        with pytest.raises(Problem) as refused:
            TOKENS.check(token, write=write)
        assert refused.value.code == code


def test_a_hub_error_becomes_a_problem_naming_the_requests_field() -> None:
    error: HubError = {
        "code": "not_found",
        "message": "workload 'x' does not exist",
        "details": {"field": "workload_id", "status": 999, "known": ["a"]},
    }
    problem = Problem.from_hub(error, {"workload_id": "ref"})
    body = problem.body("/v1/workloads/x/scale")
    assert (body["status"], body["field"], body["known"]) == (404, "ref", ["a"])
    assert body["type"] == "https://wingsmith.dev/problems/not_found"


def waiting(deployment_id: str, **admission: Any) -> dict[str, Any]:
    """A deployment on east granted 2 of the 4 one-device replicas it wants."""
    return {
        "deployment_id": deployment_id,
        "workload_id": deployment_id.split("--")[0],
        "cluster_id": "east",
        "project": "p",
        "device_class": "H100",
        "desired_replicas": 4,
        "enabled": True,
        "authority": "managed",
        "devices_per_replica": 1,
        "granted_devices": 2,
        "waiting_replicas": 2,
        "admission": {"phase": "running", "since": "t"} | admission,
    }


EXPLAINED = Views(
    workloads={
        "big": {"workload_id": "big", "deployments": {"east": "big--east"}, "unplaced": None},
        "small": {"workload_id": "small", "deployments": {"east": "small--east"}},
        "typo": {
            "workload_id": "typo",
            "project": "p",
            "device_class": "H10",
            "replicas": 1,
            "serving": {"devices_per_replica": 1},
            "deployments": {},
            "unplaced": "none of reachable clusters reports H10 devices",
            "unplaced_reason": "no_cluster_has_device_class",
        },
    },
    deployment_health={
        "big--east": waiting(
            "big--east",
            reason="insufficient_capacity",
            evidence={"wanted": 4, "capacity": 4, "held_in_cluster": 2, "granted": 2},
        ),
        "small--east": waiting(
            "small--east",
            reason="insufficient_capacity",
            evidence={"wanted": 4, "queue_position": 2, "granted": 2},
            blocker="big--east",
        ),
    },
    capacity_nodes={
        "east.H100.n1": {"cluster_id": "east", "device_class": "H100", "node_id": "n1", "free": 0},
        "west.H100.n1": {"cluster_id": "west", "device_class": "H100", "node_id": "n1", "free": 8},
    },
    clusters={
        "east": {"cluster_id": "east", "devices": {"H100": 4}},
        "west": {"cluster_id": "west", "devices": {"H100": 8, "L4": 0}},
    },
)


def test_an_explanation_takes_its_clusters_nodes_and_its_blockers_own() -> None:
    big = r.explanation(EXPLAINED, "big")
    assert big["constraint"] is not None
    assert big["constraint"].get("nodes_free") == {"n1": 0}  # east's, not west's
    assert big["unblock"][0] == "free 2 H100 devices on cluster east, or add nodes"
    small = r.explanation(EXPLAINED, "small/east")
    assert small["constraint"] is not None and small["constraint"].get("blocker") == "big--east"
    assert small["unblock"][1] == "for big--east: free 2 H100 devices on cluster east, or add nodes"


def test_a_workload_placed_nowhere_is_explained_and_an_unknown_ref_is_not_found() -> None:
    typo = r.explanation(EXPLAINED, "typo")
    assert typo["constraint"] is not None
    assert typo["constraint"]["reason"] == "no_cluster_has_device_class"
    assert typo["constraint"].get("reported") == ["H100"]  # L4: no devices
    assert typo["constraint"].get("did_you_mean") == ["H100"]
    with pytest.raises(Problem) as missing:
        r.explanation(EXPLAINED, "nothing")
    assert (missing.value.status, missing.value.code) == (404, "not_found")


INCARNATIONS = Views(
    workloads={"chat": {"workload_id": "chat--2", "name": "chat", "deployments": {}}},
    deployment_health={
        "chat--east": health("chat--east", "east"),  # the deleted first's, still shown
        "chat--2--east": health("chat--2--east", "east") | {"workload_id": "chat--2"},
    },
    workload_phase={"chat": {"workload_id": "chat", "phase": "running"}},  # not caught up
)


def test_a_name_addresses_its_current_incarnation() -> None:
    assert r.deployment_id(INCARNATIONS, "chat/east") == "chat--2--east"
    assert r.deployment_id(INCARNATIONS, "chat--east") == "chat--east"  # an id is an id
    listed = r.deployments(INCARNATIONS, workload="chat")
    assert [d["deployment_id"] for d in listed] == ["chat--2--east"]
    shown = r.workload(INCARNATIONS, "chat")
    assert (shown["workload_id"], shown["phase"]) == ("chat--2", "pending")
