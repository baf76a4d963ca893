from __future__ import annotations

import pytest

from wingsmith.domain.base import IllegalTransition, InvalidValue, WrongWriter
from wingsmith.domain.replica import Replica

from .conftest import cluster, plane, recorded


def started() -> Replica:
    return Replica.start(
        cluster(),
        deployment_id="llama--east",
        name="llama-worker-0.abc",
        node_id="n1",
        device_ids=("GPU-1", "GPU-2"),
        serving_digest="svg_a",
        engine_version="0.9.2",
    )


def test_a_replica_starts_becomes_ready_and_terminates() -> None:
    r = started()
    r.mark_ready(cluster())
    r.mark_ready(cluster())
    r.mark_not_ready(cluster())
    r.terminate(cluster())
    assert recorded(r) == ["ReplicaStarted", "ReplicaReady", "ReplicaNotReady", "ReplicaTerminated"]
    assert r.key == "llama--east--llama-worker-0-abc"
    assert (r.ready, r.terminated, r.device_ids) == (False, True, ("GPU-1", "GPU-2"))


def test_a_terminated_replica_never_becomes_ready() -> None:
    r = started()
    r.terminate(cluster())
    with pytest.raises(IllegalTransition):
        r.mark_ready(cluster())


def test_replicas_are_observed_not_declared() -> None:
    with pytest.raises(WrongWriter):
        Replica.start(
            plane(),
            deployment_id="d",
            name="p",
            node_id="n",
            device_ids=(),
            serving_digest="svg_a",
            engine_version="1",
        )


def test_a_device_is_held_once() -> None:
    with pytest.raises(InvalidValue):
        Replica.start(
            cluster(),
            deployment_id="d",
            name="p",
            node_id="n",
            device_ids=("GPU-1", "GPU-1"),
            serving_digest="svg_a",
            engine_version="1",
        )
