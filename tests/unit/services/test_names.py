"""Names can be reused, rule by rule (given / when / then): a deleted workload's name declared
again is a new incarnation with its own id and history; commands sent by name go to the current
one; a name is refused while its workload is not deleted; a workload created before names were
reused is its name's first incarnation."""

from __future__ import annotations

from typing import Any

import pytest

from wingsmith.domain.base import AlreadyExists, NotFound, replay
from wingsmith.domain.deployment import Deployment
from wingsmith.domain.values import ServingConfig
from wingsmith.domain.workload import Workload
from wingsmith.domain.workload_name import WorkloadName

from ..domain.conftest import plane
from .test_delete import CHAT, deployments, fleet, run
from .test_observe import Repo, types

PINNED = {
    "project": "research",
    "device_class": "H100",
    "serving": CHAT,
    "cluster": "east",
    "replicas": 1,
}


def create(repo: Repo, name: str = "chat", **changes: Any) -> dict[str, Any]:
    return run(repo, "workload.create", workload_id=name, **PINNED | changes)


def test_a_deleted_workloads_name_declared_again_is_its_second_incarnation() -> None:
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    types(*repo.items.values())  # forget what the fleet and the delete recorded
    again = create(repo, replicas=3)
    assert (again["workload_id"], again["name"], again["incarnation"]) == ("chat--2", "chat", 2)
    assert again["deployments"] == ["chat--2--east"]
    second = repo.get(Workload, "chat--2")
    assert types(second) == ["WorkloadCreated", "DeploymentAttached"]  # a history of its own
    assert (second.name, second.incarnation, second.replicas) == ("chat", 2, 3)
    assert types(repo.get(WorkloadName, "chat")) == ["WorkloadNameClaimed"]
    assert repo.get(WorkloadName, "chat").incarnations == ("chat", "chat--2")
    first = repo.get(Workload, "chat")
    assert first.deleted and types(first, *deployments(repo)) == []  # the old one untouched
    assert repo.get(Deployment, "chat--2--east").workload_id == "chat--2"


def test_a_name_is_refused_while_its_workload_is_not_deleted() -> None:
    repo = fleet()
    types(*repo.items.values())
    with pytest.raises(AlreadyExists) as refused:
        create(repo)
    assert (refused.value.field, refused.value.message) == (
        "workload_id",
        "workload 'chat' already exists",
    )
    create(repo, "other")
    run(repo, "workload.delete", workload_id="chat")
    create(repo)
    with pytest.raises(AlreadyExists, match="workload 'chat' already exists"):
        create(repo)  # the second incarnation holds it now


def test_commands_sent_by_name_go_to_the_current_incarnation() -> None:
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    create(repo)
    types(*repo.items.values())
    scaled = run(repo, "workload.scale", workload_id="chat", replicas=4)
    assert (scaled["workload_id"], scaled["replicas"]) == ("chat--2", 4)
    assert types(repo.get(Workload, "chat--2"), repo.get(Deployment, "chat--2--east")) == [
        "WorkloadScaled",
        "DeploymentScaled",
    ]
    assert types(repo.get(Workload, "chat"), *deployments(repo)) == []
    deleted = run(repo, "workload.delete", workload_id="chat")
    assert (deleted["workload_id"], deleted["deployments"]) == ("chat--2", ["chat--2--east"])
    with pytest.raises(NotFound, match="workload 'chat' was deleted"):
        run(repo, "workload.scale", workload_id="chat", replicas=1)
    third = create(repo)
    assert (third["workload_id"], third["incarnation"]) == ("chat--3", 3)
    assert types(repo.get(WorkloadName, "chat")) == ["WorkloadNameReclaimed"]
    assert repo.get(WorkloadName, "chat").incarnations == ("chat", "chat--2", "chat--3")


def test_a_name_never_reused_has_no_record() -> None:
    """Its workload's id is the name: nothing more to say, as before names were reused."""
    repo = fleet()
    assert create(repo, "other")["workload_id"] == "other"
    assert repo.get(WorkloadName, "other") is None


def test_an_incarnations_id_is_not_addressed_as_a_name() -> None:
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    create(repo)
    with pytest.raises(NotFound, match="workload 'chat--2' does not exist"):
        run(repo, "workload.scale", workload_id="chat--2", replicas=4)


def test_a_name_that_is_another_incarnations_id_gets_an_id_of_its_own() -> None:
    """`chat--2` is a name anyone may give; the second `chat` holds that id already."""
    repo = fleet()
    run(repo, "workload.delete", workload_id="chat")
    create(repo)
    own = create(repo, "chat--2")
    assert (own["workload_id"], own["name"], own["incarnation"]) == ("chat--2--2", "chat--2", 1)
    run(repo, "workload.delete", workload_id="chat")
    assert create(repo)["workload_id"] == "chat--3"  # `chat--2`'s own name is no matter


def test_a_long_names_later_incarnations_keep_their_id_a_dns_label() -> None:
    repo = fleet()
    name = "a" * 63
    create(repo, name)
    run(repo, "workload.delete", workload_id=name)
    again = create(repo, name)
    assert again["workload_id"] == "a" * 60 + "--2"
    assert again["deployments"] == ["a" * 60 + "--2--east"]


def test_a_workload_created_before_names_were_reused_is_its_names_first() -> None:
    """Made as the aggregate made it then: its event has no name; its name has no record."""
    repo = fleet()
    legacy = Workload.create(
        plane(),
        "old",
        project="research",
        device_class="H100",
        serving=ServingConfig.model_validate(CHAT),
        replicas=1,
        cluster_pin=None,
    )
    (created,) = legacy.collect_events()
    stored = replay([created.model_copy(update={"name": None})])  # as it was stored then
    assert isinstance(stored, Workload) and (stored.name, stored.incarnation) == ("old", 1)
    repo.add(stored)
    with pytest.raises(AlreadyExists):
        create(repo, "old")
    run(repo, "workload.delete", workload_id="old")
    again = create(repo, "old")
    assert (again["workload_id"], again["incarnation"]) == ("old--2", 2)
    record = repo.get(WorkloadName, "old")
    assert record.incarnations == ("old", "old--2")
    claimed = record.collect_events()[0]
    assert (claimed.incarnation, claimed.earlier) == (2, ("old",))


def test_two_creates_for_a_free_name_claim_it_at_one_version() -> None:
    """Each, run alone, would claim the name; both record the same version of its record, so
    the store keeps one (tests/integration/test_names.py runs them against the store)."""
    claims = []
    for _ in range(2):
        repo = fleet()
        run(repo, "workload.delete", workload_id="chat")
        types(*repo.items.values())
        create(repo)
        (claim,) = repo.get(WorkloadName, "chat").collect_events()
        claims.append((claim.originator_id, claim.originator_version))
    assert claims[0] == claims[1]
