"""The event store, against SQLite and PostgreSQL alike."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from wingsmith.adapters.store import Conflict, EventStore, Fenced, store_env
from wingsmith.domain.base import Cause, Writer
from wingsmith.domain.cluster import Cluster, Node
from wingsmith.domain.deployment import ClusterPhase, Deployment, DeploymentStatus
from wingsmith.domain.discovery import DiscoveredComponent, Discovery, Sighting
from wingsmith.domain.project import Project
from wingsmith.domain.receipt import CommandReceipt
from wingsmith.domain.replica import Replica
from wingsmith.domain.values import ServingConfig
from wingsmith.domain.workload import Workload

AT = datetime(2026, 11, 29, 14, 2, 3, 456789, tzinfo=timezone(timedelta(hours=2)))
PLANE = Cause(command_id="c-1", correlation_id="corr", at=AT)
CLUSTER = replace(PLANE, writer=Writer.CLUSTER)
SERVING = ServingConfig(
    model="m",
    backend="sglang",
    engine_version="0.4.1",
    devices_per_replica=2,
    parallelism={"tensor": 2},
    quantization="fp8",
)


@pytest.fixture
def store(store_url: str, tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore(store_env(store_url, tmp_path))
    yield opened
    opened.close()


def every_aggregate() -> list[object]:
    project = Project.register(PLANE, "research")
    project.set_quota(PLANE, "H100", 8)
    cluster = Cluster.register(PLANE, "east", "us-east-1", {"tier": "gold"})
    cluster.report_inventory(
        PLANE,
        (
            Node(
                node_id="n1",
                device_class="H100",
                devices=8,
                device_ids=("GPU-a",),
                topology_domain="nvl-1",
            ),
        ),
    )
    workload = Workload.create(
        PLANE,
        "llama",
        project="research",
        device_class="H100",
        serving=SERVING,
        replicas=2,
        cluster_pin="east",
    )
    deployment = Deployment.create(
        PLANE,
        workload_id="llama",
        cluster_id="east",
        project="research",
        device_class="H100",
        serving=SERVING,
        desired_replicas=2,
        engine_args=("--x",),
    )
    deployment.observe_status(
        CLUSTER,
        DeploymentStatus(
            phase=ClusterPhase.PROGRESSING,
            reason="PendingWeightDownload",
            ready_replicas=0,
            desired_replicas=2,
        ),
    )
    deployment.observe_live_digests(CLUSTER, {SERVING.digest(): 2})
    replica = Replica.start(
        CLUSTER,
        deployment_id=deployment.key,
        name="p-0",
        node_id="n1",
        device_ids=("GPU-a", "GPU-b"),
        serving_digest=SERVING.digest(),
        engine_version="0.4.1",
    )
    replica.mark_ready(CLUSTER)
    discovery = Discovery.sight(
        CLUSTER,
        "east",
        Sighting(
            namespace="ns",
            name="old",
            api_version="nvidia.com/v1alpha1",
            backend="trtllm",
            components=(
                DiscoveredComponent(name="w", role="decode", replicas=1, gpus_per_replica=4),
            ),
        ),
    )
    discovery.track(PLANE)
    receipt = CommandReceipt.record(PLANE, subject="s", payload_digest="d", result={"a": [1]})
    return [project, cluster, workload, deployment, replica, discovery, receipt]


def test_every_aggregate_round_trips_with_typed_values(store: EventStore) -> None:
    aggregates = every_aggregate()
    events = [e for a in aggregates for e in a.collect_events()]  # type: ignore[attr-defined]
    notes = store.save(events)
    assert [n.id for n in notes] == list(range(1, len(events) + 1))
    for aggregate in aggregates:
        loaded = store.load(aggregate.id)  # type: ignore[attr-defined]
        assert loaded == aggregate
    loaded_deployment = store.load("deployment:llama--east")
    assert loaded_deployment.modified_at == AT  # type: ignore[union-attr]
    assert isinstance(loaded_deployment.created_at, datetime)  # type: ignore[union-attr]
    assert loaded_deployment.created_at.utcoffset() == timedelta(hours=2)  # type: ignore[union-attr]


def test_a_conflicting_save_stores_nothing(store: EventStore) -> None:
    first = Project.register(PLANE, "research")
    store.save(first.collect_events())
    rival = Project.register(PLANE, "other")
    twin = Project.register(replace(PLANE, at=datetime.now(UTC)), "research")
    with pytest.raises(Conflict):
        store.save(rival.collect_events() + twin.collect_events())
    assert store.last_position() == 1
    assert store.load("project:other") is None


def test_reading_in_store_order_between_positions(store: EventStore) -> None:
    project = Project.register(PLANE, "research")
    for devices in range(1, 10):
        project.set_quota(PLANE, "H100", devices)
    store.save(project.collect_events())
    assert [n.id for n in store.read(3, 4)] == [4, 5, 6, 7]
    assert [n.id for n in store.read(3, 100, stop=5)] == [4, 5]
    assert store.read(10, 100) == []
    assert store.last_position() == 10


def test_stored_topics_do_not_name_the_installed_package(store: EventStore) -> None:
    """Topics name the module inside the package, as stores written before it was one hold
    them, so a store reads the same whatever the code is installed as."""
    project = Project.register(PLANE, "p")
    store.save(project.collect_events())
    (note,) = store.read(0, 10)
    assert note.topic == "domain.project:ProjectRegistered", note.topic
    assert store.load(project.id) == project


def test_a_save_under_a_fenced_token_stores_nothing(store: EventStore, store_url: str) -> None:
    """Once a newer lease holder raised the fence, an older holder's saves are refused; saves
    without a token (clients' commands) go on. The fence never moves back."""
    assert store.fence(7) == 7
    first = Project.register(PLANE, "research")
    store.save(first.collect_events(), fence=7)
    assert store.fence(9) == 9
    assert store.fence(8) == 9  # a late takeover of an older token does not lower it
    late = Project.register(PLANE, "late")
    with pytest.raises(Fenced):
        store.save(late.collect_events(), fence=7)
    assert store.load("project:late") is None
    unfenced = Project.register(PLANE, "client")
    store.save(unfenced.collect_events())
    store.save(Project.register(PLANE, "newer").collect_events(), fence=9)
    assert [n.originator_id for n in store.read(0, 10)] == [
        "project:research",
        "project:client",
        "project:newer",
    ]


def test_a_fenced_token_is_refused_by_another_process_of_the_store(
    store: EventStore, store_url: str, tmp_path: Path
) -> None:
    """The fence is in the store, not in the hub: a second connection (another hub's) sees it."""
    other = EventStore(store_env(store_url, tmp_path))
    try:
        other.fence(3)
        store.save(Project.register(PLANE, "a").collect_events(), fence=3)
        other.fence(4)
        with pytest.raises(Fenced):
            store.save(Project.register(PLANE, "b").collect_events(), fence=3)
    finally:
        other.close()


def test_a_token_before_any_fence_is_refused(store: EventStore) -> None:
    with pytest.raises(Fenced):
        store.save(Project.register(PLANE, "a").collect_events(), fence=1)
    assert store.last_position() == 0


def test_a_probe_write_waits_out_another_writers_lock_rather_than_call_the_store_unwritable(
    tmp_path: Path,
) -> None:
    """Hubs starting side by side on one SQLite file lock it for each other now and then; the
    probe a hub starts with waits that out (past SQLite's own busy timeout) instead of
    refusing to start as if the file could not be written."""
    store = EventStore(store_env(None, tmp_path))
    other = sqlite3.connect(
        tmp_path / "events.sqlite", isolation_level=None, check_same_thread=False
    )
    try:
        other.execute("BEGIN EXCLUSIVE")
        release = threading.Timer(6.0, lambda: other.execute("COMMIT"))  # past the 5 s timeout
        release.start()
        store.probe_write()
        release.join()
    finally:
        store.close()
        other.close()
