"""Deleting a workload, rule by rule (given / when / then): it goes with every deployment of it
in one command, what is deleted refuses the plane, its id is not reused (its name is), and its
cluster's reports of it winding down are still recorded."""

from __future__ import annotations

from typing import Any

import pytest

from wingsmith.domain import commands as c
from wingsmith.domain.base import NotFound, Writer
from wingsmith.domain.cluster import Cluster, Node
from wingsmith.domain.deployment import Deployment
from wingsmith.domain.project import Project
from wingsmith.domain.replica import Replica
from wingsmith.domain.values import ServingConfig
from wingsmith.domain.workload import Workload
from wingsmith.services.hub.handlers import (
    HANDLERS,
    observe_deployment,
    observe_discovery,
    observe_replica,
)

from ..domain.conftest import cluster, plane
from .test_discover import observe, promote, sighting
from .test_observe import Repo, replica, status, types

CHAT = {"model": "m", "backend": "vllm", "engine_version": "1.0", "devices_per_replica": 1}
ADMIT: dict[str, Any] = {"admitted": True, "devices": 1, "reason": None, "evidence": {}}
INTERNAL = {cls.subject: cls for cls in (c.PlaceWorkload, c.DecideAdmission, c.ObserveAction)}


def run(repo: Repo, subject: str, **body: Any) -> dict[str, Any]:
    """A command as the hub runs it: validated from its wire form, then handled."""
    command = c.COMMANDS.get(subject) or INTERNAL[subject]
    cause = cluster() if command.writer is Writer.CLUSTER else plane()
    return HANDLERS[command](repo, command.model_validate({"command_id": "x"} | body), cause)


def fleet() -> Repo:
    """`chat` placed on east and west, one replica each; east's admitted and running."""
    nodes = (Node(node_id="n1", device_class="H100", devices=8),)
    clusters = [Cluster.register(plane(), name, None, {}) for name in ("east", "west")]
    for each in clusters:
        each.report_inventory(cluster(), nodes)
    project = Project.register(plane(), "research")
    project.set_quota(plane(), "H100", 16)
    repo = Repo(*clusters, project)
    run(
        repo,
        "workload.create",
        workload_id="chat",
        project="research",
        device_class="H100",
        serving=CHAT,
        replicas=2,
    )
    run(
        repo,
        "workload.place",
        workload_id="chat",
        replicas=2,
        serving_digest=repo.get(Workload, "chat").serving_digest,
        shares={"east": 1, "west": 1},
        previous={},
    )
    run(repo, "deployment.decide_admission", deployment_id="chat--east", **ADMIT)
    observe_replica(repo, replica("ready"), cluster())
    assert repo.get(Deployment, "chat--east").admission_phase.value == "running"
    for aggregate in list(repo.items.values()):
        aggregate.collect_events()
    return repo


def deployments(repo: Repo) -> list[Deployment]:
    return [repo.get(Deployment, key) for key in ("chat--east", "chat--west")]


def test_a_workload_is_deleted_with_every_deployment_in_one_command() -> None:
    repo = fleet()
    result = run(repo, "workload.delete", workload_id="chat")
    assert result["deleted"] and result["deployments"] == ["chat--east", "chat--west"]
    workload = repo.get(Workload, "chat")
    assert types(workload, *deployments(repo)) == [
        "WorkloadDeleted",
        "DeploymentDeleted",
        "DeploymentDeleted",
    ]
    assert workload.deleted and all(d.deleted for d in deployments(repo))
    assert [d.granted_devices for d in deployments(repo)] == [0, 0]


def test_deleting_twice_or_what_never_was_is_not_found() -> None:
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    for workload_id, message in (
        ("chat", "workload 'chat' was deleted"),
        ("nope", "workload 'nope' does not exist"),
    ):
        with pytest.raises(NotFound) as refused:
            run(repo, "workload.delete", workload_id=workload_id)
        assert (refused.value.field, refused.value.message) == ("workload_id", message)


PLANE_COMMANDS: list[tuple[str, dict[str, Any]]] = [
    ("workload.scale", {"workload_id": "chat", "replicas": 3}),
    (
        "workload.change_serving_config",
        {"workload_id": "chat", "serving": CHAT | {"engine_version": "2.0"}},
    ),
    (
        "workload.place",
        {
            "workload_id": "chat",
            "replicas": 2,
            "serving_digest": ServingConfig.model_validate(CHAT).digest(),
            "shares": {},
            "previous": {},
            "message": "nowhere",
        },
    ),
    ("deployment.enable", {"deployment_id": "chat--east"}),
    ("deployment.disable", {"deployment_id": "chat--east"}),
    ("deployment.set_engine_args", {"deployment_id": "chat--east", "engine_args": ["--x"]}),
    ("deployment.promote_authority", {"deployment_id": "chat--west", "authority": "managed"}),
    ("deployment.decide_admission", {"deployment_id": "chat--west"} | ADMIT),
]


@pytest.mark.parametrize(("subject", "body"), PLANE_COMMANDS, ids=[s for s, _ in PLANE_COMMANDS])
def test_what_is_deleted_refuses_the_plane(subject: str, body: dict[str, Any]) -> None:
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    types(repo.get(Workload, "chat"), *deployments(repo))  # forget what deleting recorded
    with pytest.raises(NotFound) as refused:
        run(repo, subject, **body)
    assert refused.value.message.endswith("was deleted")
    assert refused.value.field == subject.split(".")[0] + "_id"
    assert types(repo.get(Workload, "chat"), *deployments(repo)) == []


def test_the_id_of_a_deleted_workload_is_not_reused() -> None:
    """Its name is (tests/unit/services/test_names.py): the new workload gets another id."""
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    again = run(
        repo,
        "workload.create",
        workload_id="chat",
        project="research",
        device_class="H100",
        serving=CHAT,
        replicas=1,
    )
    assert again["workload_id"] != "chat"
    assert repo.get(Workload, "chat").deleted


def test_a_discovery_promoted_onto_a_deleted_workloads_name_is_a_new_incarnation() -> None:
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    observe_discovery(repo, observe(sighting()), cluster())
    adopted = promote(repo, workload_id="chat")
    assert (adopted["workload_id"], adopted["name"], adopted["incarnation"]) == (
        "chat--2",
        "chat",
        2,
    )
    assert adopted["deployments"] == ["chat--2--east"]


def test_reports_of_a_deleted_deployment_winding_down_are_recorded_and_move_no_phase() -> None:
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    east = repo.get(Deployment, "chat--east")
    east.collect_events()
    observe_replica(repo, replica("terminated"), cluster())
    observe_deployment(repo, status("progressing", 0), cluster())
    observe_deployment(repo, status("failed", 0, reason="Evicted"), cluster())
    run(
        repo,
        "deployment.observe_action",
        cluster_id="east",
        deployment_id="chat--east",
        verb="delete",
        namespace="serving",
        name="chat",
        performed=True,
        reason="the deployment was removed",
    )
    assert types(repo.get(Replica, "chat--east--chat-0")) == ["ReplicaTerminated"]
    assert types(east) == ["StatusObserved", "StatusObserved", "OperatorActed"]
    assert east.admission_phase.value == "running"  # as it was when deleted
