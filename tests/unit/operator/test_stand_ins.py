"""The device ids the operator reports for a pod are flagged as stand-ins exactly when the
cluster did not name the pod's devices: the views tell them apart with the domain's rule."""

from __future__ import annotations

from typing import Any

from wingsmith.domain.values import is_stand_in
from wingsmith.services.operator.backends.kube import DEVICE_IDS_ANNOTATION, _device_ids


def pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    container = {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    metadata = {"name": "llama-worker-0", "annotations": annotations}
    return {"metadata": metadata, "spec": {"containers": [container]}}


def test_unnamed_devices_get_stand_ins_that_the_views_flag() -> None:
    ids = _device_ids(pod(), "gpu-node-1.example.internal")
    assert len(ids) == 2
    assert all(map(is_stand_in, ids))


def test_devices_the_cluster_named_are_not_stand_ins() -> None:
    uuids = "GPU-8f6c2a4e-1b2d-4c3e-9f0a-123456789abc,GPU-0a1b2c3d-1b2d-4c3e-9f0a-123456789abc"
    ids = _device_ids(pod({DEVICE_IDS_ANNOTATION: uuids}), "gpu-node-1")
    assert ids == uuids.split(",")
    assert not any(map(is_stand_in, ids))
