"""A move as the hub applies it (given / when / then): one command changes both shares and
records the move with its reason; a lost cluster's emptied deployment is disabled, not deleted;
a stale move changes nothing; preferences are checked against the clusters known."""

from __future__ import annotations

from typing import Any

import pytest

from wingsmith.domain.base import NotFound
from wingsmith.domain.deployment import Deployment
from wingsmith.domain.workload import Workload
from wingsmith.services.hub.handlers import StalePlacement

from .test_delete import fleet, run
from .test_observe import Repo, types


def move(repo: Repo, reason: str, **extra: Any) -> dict[str, Any]:
    workload = repo.get(Workload, "chat")
    return run(
        repo,
        "workload.place",
        workload_id="chat",
        replicas=2,
        serving_digest=workload.serving_digest,
        shares={"east": 0, "west": 2},
        previous={"east": 1, "west": 1},
        move={"from_cluster": "east", "to_cluster": "west", "replicas": 1, "reason": reason},
        **extra,
    )


def test_a_move_off_a_lost_cluster_records_why_and_disables_the_old_deployment() -> None:
    repo = fleet()
    move(repo, "cluster_lost", disable="east")
    (moved,) = repo.get(Workload, "chat").collect_events()
    assert (type(moved).__name__, moved.reason) == ("WorkloadMoved", "cluster_lost")
    east, west = (repo.get(Deployment, k) for k in ("chat--east", "chat--west"))
    assert types(east) == ["DeploymentScaled", "DeploymentDisabled"]  # not deleted
    assert (east.desired_replicas, east.enabled, east.deleted) == (0, False, False)
    assert (west.desired_replicas, west.enabled) == (2, True)


def test_a_stale_move_changes_nothing() -> None:
    repo = fleet()
    run(repo, "deployment.disable", deployment_id="chat--east")
    for aggregate in list(repo.items.values()):
        aggregate.collect_events()
    with pytest.raises(StalePlacement):
        move(repo, "cluster_lost", disable="east")


def test_preferences_name_known_clusters() -> None:
    repo = fleet()
    result = run(
        repo,
        "workload.set_preferences",
        workload_id="chat",
        preferred_clusters=["west", "east"],
        strategy="spread",
    )
    assert result["preferences"]["preferred_clusters"] == ["west", "east"]
    assert types(repo.get(Workload, "chat")) == ["PlacementPreferencesChanged"]
    with pytest.raises(NotFound) as unknown:
        run(repo, "workload.set_preferences", workload_id="chat", preferred_clusters=["mars"])
    assert unknown.value.field == "preferred_clusters"
