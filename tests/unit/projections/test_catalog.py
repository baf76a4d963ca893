"""The workloads and clusters views (and a name's phase), exactly as the REST API reads them, over
events made by the real aggregates."""

from __future__ import annotations

from datetime import UTC, datetime

from wingsmith.domain.base import Aggregate, Cause, Writer
from wingsmith.domain.cluster import Cluster, Node, OperatorInfo
from wingsmith.domain.deployment import Deployment
from wingsmith.domain.placement import Preferences, Strategy
from wingsmith.domain.workload import MOVES_KEPT, MoveReason, PlacementReason, Workload
from wingsmith.projections.base import Fold, Projection
from wingsmith.projections.fleet import Clusters, WorkloadPhase, Workloads

from .history import envelope, serving


def at(minute: int, writer: Writer = Writer.PLANE) -> Cause:
    when = datetime(2026, 11, 29, 14, minute, tzinfo=UTC)
    return Cause(command_id=f"c{minute}", correlation_id="corr", at=when, writer=writer)


def stamp(minute: int) -> str:
    return f"2026-11-29T14:{minute:02d}:00Z"


class Given:
    """Folds what the aggregates record, and keeps which keys each event changed."""

    def __init__(self, projection: Projection) -> None:
        self.projection = projection
        self.fold = Fold([projection])
        self.position = 0
        self.changed: list[str] = []

    def flush(self, *aggregates: Aggregate) -> None:
        for aggregate in aggregates:
            for event in aggregate.collect_events():
                self.position += 1
                for _, key in self.fold.apply_envelope(envelope(event, self.position)):
                    self.changed.append(key)


def test_a_workload_as_declared_placed_and_deleted() -> None:
    given = Given(Workloads())
    w = Workload.create(
        at(0),
        "chat",
        project="research",
        device_class="H100",
        serving=serving(2),
        replicas=2,
        cluster_pin=None,
        allowed_clusters=("east", "west"),
        engine_args=("--enforce-eager",),
    )
    w.defer_placement(
        at(1),
        "none of its allowed clusters reports H100 devices",
        PlacementReason.NO_CLUSTER_HAS_DEVICE_CLASS,
    )
    given.flush(w)
    assert given.projection.views["chat"]["unplaced"] is not None
    assert given.projection.views["chat"]["unplaced_reason"] == "no_cluster_has_device_class"
    w.attach_deployment(at(2), "east", "chat--east")
    w.scale(at(3), 4)
    given.flush(w)
    assert given.projection.views == {
        "chat": {
            "workload_id": "chat",
            "name": "chat",
            "incarnation": 1,
            "project": "research",
            "device_class": "H100",
            "replicas": 4,
            "serving": serving(2).model_dump(mode="json"),
            "serving_digest": serving(2).digest(),
            "cluster": None,
            "clusters": ["east", "west"],
            "engine_args": ["--enforce-eager"],
            "deployments": {"east": "chat--east"},
            "unplaced": None,
            "unplaced_reason": None,
            "preferences": {"preferred_clusters": [], "cluster_selector": {}, "strategy": "pack"},
            "moves": [],
            "created_at": stamp(0),
            "updated_at": stamp(3),
        }
    }
    bigger = serving(4)
    w.change_serving_config(at(4), bigger)
    given.flush(w)
    view = given.projection.views["chat"]
    assert (view["serving"]["devices_per_replica"], view["serving_digest"]) == (4, bigger.digest())
    assert view["updated_at"] == stamp(4)
    w.delete(at(5))
    given.flush(w)
    assert given.projection.views == {}
    assert given.changed == ["chat"] * 6  # the last one a removal


def test_a_workload_shows_its_preferences_and_its_last_moves() -> None:
    given = Given(Workloads())
    w = Workload.create(
        at(0),
        "chat",
        project="research",
        device_class="H100",
        serving=serving(1),
        replicas=4,
        cluster_pin=None,
        preferences=Preferences(preferred_clusters=("east",), strategy=Strategy.SPREAD),
    )
    w.attach_deployment(at(1), "east", "chat--east")
    w.set_preferences(at(2), Preferences(cluster_selector={"tier": "gold"}))
    for minute in range(3, 3 + MOVES_KEPT + 2):
        w.record_move(at(minute), "east", "west", 1, MoveReason.CLUSTER_LOST)
    given.flush(w)
    view = given.projection.views["chat"]
    assert view["preferences"] == {
        "preferred_clusters": [],
        "cluster_selector": {"tier": "gold"},
        "strategy": "pack",
    }
    assert len(view["moves"]) == MOVES_KEPT
    assert view["moves"][-1] == {
        "from_cluster": "east",
        "to_cluster": "west",
        "replicas": 1,
        "reason": "cluster_lost",
        "at": stamp(3 + MOVES_KEPT + 1),
    }
    assert view["moves"][0]["at"] == stamp(5)  # the two oldest left


def chat(
    cause: Cause, workload_id: str = "chat", incarnation: int = 1, replicas: int = 2
) -> Workload:
    return Workload.create(
        cause,
        workload_id,
        name="chat",
        incarnation=incarnation,
        project="research",
        device_class="H100",
        serving=serving(2),
        replicas=replicas,
        cluster_pin=None,
    )


def test_a_name_declared_again_shows_its_new_incarnation_under_the_name() -> None:
    given = Given(Workloads())
    first = chat(at(0))
    first.attach_deployment(at(1), "east", "chat--east")
    first.delete(at(2))
    given.flush(first)
    assert given.projection.views == {}
    second = chat(at(3), "chat--2", 2, replicas=5)
    given.flush(second)
    view = given.projection.views["chat"]
    assert (view["workload_id"], view["name"], view["incarnation"]) == ("chat--2", "chat", 2)
    assert (view["replicas"], view["deployments"], view["created_at"]) == (5, {}, stamp(3))
    assert given.changed == ["chat"] * 4


def test_a_names_phase_is_its_current_incarnations() -> None:
    given = Given(WorkloadPhase())
    first = chat(at(0))
    old = deployment(at(0), "chat")
    old.decide_admission(at(1), admitted=True, reason=None, evidence={}, devices=2)
    given.flush(first, old)
    assert given.projection.views["chat"]["phase"] == "admitted"
    first.delete(at(2))
    old.delete(at(2))
    given.flush(first, old)
    assert given.projection.views == {}
    second, new = chat(at(3), "chat--2", 2), deployment(at(3), "chat--2")
    given.flush(second, new)
    assert given.projection.views == {
        "chat": {
            "workload_id": "chat--2",
            "name": "chat",
            "incarnation": 2,
            "phase": "pending",
            "deployments": {"chat--2--east": "pending"},
        }
    }


def deployment(cause: Cause, workload_id: str) -> Deployment:
    return Deployment.create(
        cause,
        workload_id=workload_id,
        cluster_id="east",
        project="research",
        device_class="H100",
        serving=serving(2),
        desired_replicas=1,
    )


def test_a_workload_created_before_names_were_recorded_is_its_names_first() -> None:
    """Its WorkloadCreated has neither name nor incarnation: its id is its name."""
    given = Given(Workloads())
    body = envelope(chat(at(0)).collect_events()[0], 1)
    old_event = {k: v for k, v in body["event"].items() if k not in ("name", "incarnation")}
    given.fold.apply_envelope(body | {"event": old_event})
    view = given.projection.views["chat"]
    assert (view["workload_id"], view["name"], view["incarnation"]) == ("chat", "chat", 1)


def test_a_pinned_workload_names_its_cluster() -> None:
    given = Given(Workloads())
    w = Workload.create(
        at(0),
        "embed",
        project="research",
        device_class="H100",
        serving=serving(1),
        replicas=1,
        cluster_pin="north",
    )
    given.flush(w)
    view = given.projection.views["embed"]
    assert (view["cluster"], view["clusters"], view["engine_args"]) == ("north", None, [])


def test_a_cluster_with_its_inventory_reachability_and_operator() -> None:
    given = Given(Clusters())
    c = Cluster.register(at(0), "east", "us-east-1", {"tier": "gold"})
    given.flush(c)
    assert given.projection.views["east"] == {
        "cluster_id": "east",
        "region": "us-east-1",
        "labels": {"tier": "gold"},
        "reachable": True,
        "operator": None,
        "nodes": 0,
        "devices": {},
        "registered_at": stamp(0),
    }
    nodes = (
        Node(node_id="n1", device_class="H100", devices=8),
        Node(node_id="n2", device_class="H100", devices=8),
        Node(node_id="n3", device_class="A100", devices=4),
    )
    c.report_inventory(at(1, Writer.CLUSTER), nodes)
    c.set_reachable(at(2), False)
    operator = OperatorInfo(instance="op-1", version="0.3.0", read_only=True)
    c.hear_operator(at(3, Writer.CLUSTER), operator)  # reachable again
    given.flush(c)
    view = given.projection.views["east"]
    assert (view["nodes"], view["devices"]) == (3, {"H100": 16, "A100": 4})
    assert view["reachable"] is True
    assert view["operator"] == {
        "instance": "op-1",
        "version": "0.3.0",
        "read_only": True,
        "simulated": False,
    }
    c.set_reachable(at(4), False)
    given.flush(c)
    assert given.projection.views["east"]["reachable"] is False


def test_a_later_incarnations_moves_show_under_its_name() -> None:
    given = Given(Workloads())
    second = chat(at(0), "chat--2", 2)
    second.attach_deployment(at(1), "east", "chat--2--east")
    second.record_move(at(1), "east", "west", 1, MoveReason.PENDING_TOO_LONG)
    given.flush(second)
    assert [m["reason"] for m in given.projection.views["chat"]["moves"]] == ["pending_too_long"]
