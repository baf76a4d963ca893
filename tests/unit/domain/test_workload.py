from __future__ import annotations

import pytest

from wingsmith.domain.base import InvalidValue, NotFound
from wingsmith.domain.workload import Workload

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


def test_a_deleted_workload_refuses_every_further_command() -> None:
    workload = _workload()
    recorded(workload)
    workload.delete(plane())
    assert recorded(workload) == ["WorkloadDeleted"]
    assert workload.deleted
    for attempt in (
        lambda: workload.scale(plane(), 4),  # even one that would change nothing
        lambda: workload.change_serving_config(plane(), serving()),
        lambda: workload.attach_deployment(plane(), "east", "llama--east"),
        lambda: workload.defer_placement(plane(), "nowhere"),
        lambda: workload.delete(plane()),
    ):
        with pytest.raises(NotFound) as refused:
            attempt()
        assert (refused.value.field, refused.value.message) == (
            "workload_id",
            "workload 'llama' was deleted",
        )
    assert recorded(workload) == []
