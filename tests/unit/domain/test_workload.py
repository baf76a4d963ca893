from __future__ import annotations

import pytest

from domain.base import InvalidValue
from domain.workload import Workload

from .conftest import plane, recorded, serving


def _workload() -> Workload:
    return Workload.create(
        plane(),
        "llama",
        project="research",
        device_class="H100",
        serving=serving(),
        replicas=4,
        cluster_pin=None,
    )


def test_create_scale_and_change_serving() -> None:
    workload = _workload()
    workload.scale(plane(), 6)
    assert workload.change_serving_config(plane(), serving(engine_version="0.10.0"))
    assert recorded(workload) == [
        "WorkloadCreated",
        "WorkloadScaled",
        "WorkloadServingConfigChanged",
    ]
    assert workload.replicas == 6
    assert workload.serving_digest == serving(engine_version="0.10.0").digest()


def test_unchanged_scale_and_serving_record_nothing() -> None:
    workload = _workload()
    recorded(workload)
    workload.scale(plane(), 4)
    assert not workload.change_serving_config(plane(), serving())
    assert recorded(workload) == []


def test_a_cluster_holds_one_deployment_of_a_workload() -> None:
    workload = _workload()
    workload.attach_deployment(plane(), "east", "llama--east")
    with pytest.raises(InvalidValue):
        workload.attach_deployment(plane(), "east", "llama--east")
