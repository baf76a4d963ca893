"""Views as of a past time, from the real store and its checkpoints, checked against a history
whose every view is computed here by hand."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from wingsmith.adapters.checkpoints import Checkpoint, CheckpointStore
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain.base import Aggregate, Cause, Writer
from wingsmith.domain.cluster import Cluster, Node
from wingsmith.domain.deployment import AdmissionReason, Deployment
from wingsmith.domain.project import Project
from wingsmith.domain.replica import Replica
from wingsmith.domain.values import ServingConfig
from wingsmith.projections.base import VERSION, Fold, Projection
from wingsmith.projections.fleet import Capacity, DeploymentHealth
from wingsmith.services.hub.projector import as_of, fold, rebuild


def at(hhmm: str) -> datetime:
    hour, minute = map(int, hhmm.split(":"))
    return datetime(2026, 11, 29, hour, minute, tzinfo=UTC)


def cause(hhmm: str, writer: Writer = Writer.PLANE) -> Cause:
    return Cause(command_id=f"c-{hhmm}", correlation_id="tt", at=at(hhmm), writer=writer)


def inventory(devices: int) -> tuple[Node, ...]:
    return (Node(node_id="n1", device_class="H100", devices=devices, topology_domain="nvl"),)


def write_history(store: EventStore) -> None:
    """14:00 east has 8 H100 · 14:01 llama asks for 2 replicas of 2 devices · 14:02 pending for
    capacity · 14:04 admitted · 14:05 one replica holds 2 devices · 14:06 east grows to 16."""

    def save(*aggregates: Aggregate) -> None:
        store.save([e for a in aggregates for e in a.collect_events()])

    project = Project.register(cause("14:00"), "research")
    project.set_quota(cause("14:00"), "H100", 16)
    east = Cluster.register(cause("14:00"), "east", None, {})
    east.report_inventory(replace(cause("14:00"), writer=Writer.CLUSTER), inventory(8))
    save(project, east)
    serving = ServingConfig(model="m", backend="vllm", engine_version="1.0", devices_per_replica=2)
    llama = Deployment.create(
        cause("14:01"),
        workload_id="llama",
        cluster_id="east",
        project="research",
        device_class="H100",
        serving=serving,
        desired_replicas=2,
    )
    save(llama)
    evidence = {"free": 0, "needed": 4}
    reason = AdmissionReason.INSUFFICIENT_CAPACITY
    llama.decide_admission(cause("14:02"), admitted=False, reason=reason, evidence=evidence)
    save(llama)
    llama.decide_admission(
        cause("14:04"), admitted=True, reason=None, evidence={"free": 8}, devices=4
    )
    save(llama)
    replica = Replica.start(
        cause("14:05", Writer.CLUSTER),
        deployment_id=llama.key,
        name="llama-0",
        node_id="n1",
        device_ids=("GPU-0", "GPU-1"),
        serving_digest=llama.serving_digest,
        engine_version="1.0",
    )
    save(replica)
    east.report_inventory(cause("14:06", Writer.CLUSTER), inventory(16))
    save(east)


def capacity(total: int, allocated: int, reserved: int) -> dict[str, Any]:
    return {
        "cluster_id": "east",
        "device_class": "H100",
        "total": total,
        "unschedulable": 0,
        "held_outside": 0,
        "allocated": allocated,
        "reserved": reserved,
        "free": total - allocated - reserved,
    }


EXPECTED_CAPACITY = {
    "13:59": None,
    "14:00": capacity(8, 0, 0),
    "14:03": capacity(8, 0, 0),  # pending reserves nothing
    "14:04": capacity(8, 0, 4),  # admitted: 2 replicas x 2 devices reserved
    "14:05": capacity(8, 2, 2),  # one replica allocated, one still reserved
    "14:30": capacity(16, 2, 2),
}
EXPECTED_ADMISSION = {
    "14:00": None,
    "14:01": ("pending", "awaiting_admission", None),
    "14:03": ("pending", "insufficient_capacity", {"free": 0, "needed": 4}),
    "14:04": ("admitted", None, {"free": 8}),
}


@pytest.fixture
def stores(store_url: str, tmp_path: Path) -> Any:
    env = store_env(store_url, tmp_path)
    store, checkpoints = EventStore(env), CheckpointStore(env)
    write_history(store)
    yield store, checkpoints
    checkpoints.close()
    store.close()


def answers(store: EventStore, checkpoints: CheckpointStore) -> None:
    for hhmm, expected in EXPECTED_CAPACITY.items():
        [capacity] = as_of(store.read, checkpoints, at(hhmm), [Capacity])
        assert capacity.views.get("east.H100") == expected, hhmm
    for hhmm, admission in EXPECTED_ADMISSION.items():
        [health] = as_of(store.read, checkpoints, at(hhmm), [DeploymentHealth])
        view = health.views.get("llama--east")
        if admission is None:
            assert view is None, hhmm
            continue
        phase, reason, evidence = admission
        assert view is not None and view["admission"]["phase"] == phase, hhmm
        assert view["admission"]["reason"] == reason, hhmm
        assert view["admission"].get("evidence") == evidence, hhmm


def test_as_of_answers_match_the_hand_computed_history(stores: Any) -> None:
    answers(*stores)


def test_as_of_starts_from_checkpoints_and_ignores_later_ones(stores: Any) -> None:
    store, checkpoints = stores
    kinds: list[type[Projection]] = [Capacity, DeploymentHealth]
    upto_1402 = Fold(kind() for kind in kinds)
    fold(store.read, upto_1402, until=at("14:02"))
    full = rebuild(store.read, kinds)
    # one checkpoint inside the history and one at its end: answers must not change
    for target, when in ((upto_1402, at("14:02")), (full, at("14:06"))):
        checkpoints.save(
            [Checkpoint(p.name, target.position, 0, when, p.state()) for p in target.projections]
        )
    answers(store, checkpoints)


def test_as_of_ignores_checkpoints_an_earlier_version_of_a_projection_saved(stores: Any) -> None:
    """Its views were of another shape: the answer is folded from the first event instead."""
    store, checkpoints = stores
    full = rebuild(store.read, [Capacity])
    [capacity] = full.projections
    state = capacity.state() | {VERSION: Capacity.version - 1}
    state["views"]["east.H100"] = {"cluster_id": "east", "total": 99}  # as it was then, say
    checkpoints.save([Checkpoint("capacity", full.position, 0, at("14:06"), state)])
    answers(store, checkpoints)


def test_checkpoint_retention_keeps_one_per_hour_then_one_per_day(tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store_env(None, tmp_path))
    newest = at("00:00")
    times = [newest - timedelta(minutes=20 * i) for i in range(3 * 24 * 3, -1, -1)]
    for position, when in enumerate(times, start=1):  # three days, three an hour
        checkpoints.save([Checkpoint("capacity", position, position, when, {"n": position})])
    found = (checkpoints.before("capacity", t) for t in times)
    kept = {c.event_time for c in found if c is not None}
    hour, day = timedelta(hours=1), timedelta(days=1)
    assert kept == (
        {newest - 3 * day, newest - 2 * day}  # the first of each day, before the last two
        | {newest - 2 * day + h * hour for h in range(1, 48)}  # the first of each hour
        | {newest - timedelta(minutes=20), newest}  # the latest two
    )
    checkpoints.close()
