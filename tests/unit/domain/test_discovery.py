from __future__ import annotations

import pytest

from wingsmith.domain.base import IllegalTransition, WrongWriter
from wingsmith.domain.discovery import DiscoveredComponent, Discovery, DiscoveryState, Sighting

from .conftest import cluster, plane, recorded

SIGHTING = Sighting(
    namespace="team-a",
    name="qwen.prod",
    api_version="nvidia.com/v1beta1",
    backend=None,
    components=(
        DiscoveredComponent(
            name="worker",
            role="worker",
            replicas=2,
            gpus_per_replica=1,
            imported_args=("--model", "Qwen/Qwen3-8B"),
        ),
    ),
)


def test_sighted_then_tracked_ignored_and_tracked_again() -> None:
    d = Discovery.sight(cluster(), "east", SIGHTING)
    d.track(plane())
    d.track(plane())
    d.ignore(plane())
    d.track(plane())
    assert recorded(d) == [
        "DiscoverySighted",
        "DiscoveryTracked",
        "DiscoveryIgnored",
        "DiscoveryTracked",
    ]
    assert d.key == "east--team-a--qwen-prod"


def test_promotion_is_final() -> None:
    d = Discovery.sight(cluster(), "east", SIGHTING)
    d.promote(plane(), "qwen")
    assert (d.state, d.workload_id) == (DiscoveryState.PROMOTED, "qwen")
    for decide in (d.track, d.ignore):
        with pytest.raises(IllegalTransition):
            decide(plane())


def test_only_the_cluster_sights_and_only_people_decide() -> None:
    with pytest.raises(WrongWriter):
        Discovery.sight(plane(), "east", SIGHTING)
    d = Discovery.sight(cluster(), "east", SIGHTING)
    with pytest.raises(WrongWriter):
        d.promote(cluster(), "qwen")
    d.resight(cluster(), SIGHTING)
    d.resight(cluster(), SIGHTING.model_copy(update={"backend": "sglang"}))
    assert recorded(d) == ["DiscoverySighted", "DiscoveryResighted"]
