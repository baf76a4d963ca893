from __future__ import annotations

import pytest

from wingsmith.domain.base import AlreadyExists, IllegalTransition, InvalidValue, WrongWriter
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


def disaggregated(**changes: object) -> Sighting:
    workers = (
        DiscoveredComponent(name="prefill", role="prefill", replicas=2, gpus_per_replica=2),
        DiscoveredComponent(name="decode", role="decode", replicas=2, gpus_per_replica=4),
        DiscoveredComponent(name="frontend", role="frontend", replicas=1, gpus_per_replica=0),
    )
    base = {"backend": "vllm", "model": "Qwen/Qwen3-8B", "components": workers}
    return SIGHTING.model_copy(update=base | changes)


def test_the_serving_config_a_sighting_implies() -> None:
    implied = disaggregated().implied_serving()
    assert (implied.mode, implied.devices_per_replica) == ("disaggregated", 6)
    assert (implied.engine_version, implied.parallelism.tensor) == ("unknown", 1)
    with pytest.raises(InvalidValue) as invalid:  # 6 devices cannot hold 2 workers of 4
        disaggregated(tensor_parallel=4).implied_serving()
    assert (invalid.value.field or "").startswith("serving")
    uneven = disaggregated(
        components=(
            DiscoveredComponent(name="prefill", role="prefill", replicas=1, gpus_per_replica=1),
            DiscoveredComponent(name="decode", role="decode", replicas=2, gpus_per_replica=1),
        )
    )
    assert uneven.devices_per_replica() == 0  # 3 devices over 2 decode replicas
    with pytest.raises(InvalidValue) as missing:
        SIGHTING.implied_serving()
    assert missing.value.field == "backend"


def test_an_adoption_defaults_to_the_manifests_name_when_it_is_a_valid_id() -> None:
    d = Discovery.sight(cluster(), "east", disaggregated(name="qwen"))
    workload_id, primary = d.adoption(None)
    assert (workload_id, primary.role) == ("qwen", "decode")
    assert d.adoption("other")[0] == "other"
    dotted = Discovery.sight(cluster(), "east", SIGHTING)  # "qwen.prod" is no workload id
    with pytest.raises(InvalidValue) as refused:
        dotted.adoption(None)
    assert refused.value.field == "workload_id"
    d.promote(plane(), "qwen")
    with pytest.raises(AlreadyExists):
        d.adoption(None)
