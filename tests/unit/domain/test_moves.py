"""Placement that moves, rule by rule, as given / when / then on the pure ledger: preferences,
shares waiting too long, lost clusters and their return, pinned workloads, rebalancing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from wingsmith.domain.admission import Decision, Placement
from wingsmith.domain.base import InvalidValue
from wingsmith.domain.commands import CreateWorkload, SetPlacementPreferences
from wingsmith.domain.moves import MoveRules, due
from wingsmith.domain.placement import Move, Preferences, Strategy, preferred_shares
from wingsmith.domain.workload import MoveReason, Workload

from .conftest import plane, serving
from .test_admission import Fleet, verdict

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RULES = MoveRules(
    move_after=timedelta(seconds=300), lost_after=timedelta(seconds=600), max_fraction=0.25
)


class Clocked(Fleet):
    """A fleet whose events carry the time, as stored events do; `moves` runs the tick."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.moved: list[Placement] = []

    def event(self, event_type: str, aggregate_id: str, **e: Any) -> list[Decision]:
        e.setdefault("timestamp", self.now.isoformat())
        return super().event(event_type, aggregate_id, **e)

    def later(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def moves(self, rules: MoveRules = RULES) -> list[Move]:
        made = list(due(self.ledger, self.now, rules))
        for placement, decide in made:
            self.moved.append(placement)
            self.decide(decide)
        return [p.move for p in (p for p, _ in made) if p.move is not None]

    def cluster(self, name: str, devices: int, **labels: str) -> None:
        self.event("ClusterRegistered", name, region=None, labels=labels)
        self.inventory(name, devices)

    def preferring(
        self, name: str, replicas: int, preferences: Preferences, per: int = 1
    ) -> list[Decision]:
        return self.event(
            "WorkloadCreated",
            name,
            project="p",
            device_class="H100",
            serving={"devices_per_replica": per},
            serving_digest="d1",
            replicas=replicas,
            cluster_pin=None,
            preferences=preferences.model_dump(mode="json"),
        )

    def running(self, deployment: str) -> None:
        self.event("DeploymentPlaced", deployment)
        self.event("DeploymentRunning", deployment)


# -- preferences -------------------------------------------------------------------------


def test_pack_fills_the_preferred_clusters_in_their_order() -> None:
    grown = preferred_shares(5, 1, {}, [("west", 3), ("east", 8), ("north", 8)], Strategy.PACK)
    assert grown == {"west": 3, "east": 2}


def test_spread_splits_over_the_candidates_with_room() -> None:
    grown = preferred_shares(5, 1, {}, [("west", 1), ("east", 8), ("north", 8)], Strategy.SPREAD)
    assert grown == {"west": 1, "east": 2, "north": 2}


def test_with_no_room_the_rest_waits_on_the_first_choice() -> None:
    assert preferred_shares(4, 2, {}, [("west", 2), ("east", 0)], Strategy.PACK) == {"west": 4}


def test_shrinking_takes_from_the_least_preferred_first() -> None:
    current = {"west": 2, "east": 2, "gone": 1}
    order = [("west", 0), ("east", 0)]
    assert preferred_shares(3, 1, current, order, Strategy.PACK) == {"gone": 0, "east": 1}
    assert preferred_shares(3, 1, {"west": 3, "east": 1}, order, Strategy.SPREAD) == {"west": 2}


def test_a_selector_narrows_the_candidates_and_the_list_orders_them() -> None:
    fleet = Clocked()
    fleet.quota("p", 100)
    fleet.cluster("east", 8, tier="gold")
    fleet.cluster("west", 8, tier="gold")
    fleet.cluster("north", 16, tier="bronze")
    gold_west = Preferences(preferred_clusters=("west",), cluster_selector={"tier": "gold"})
    fleet.preferring("chat", 10, gold_west)
    assert fleet.shares("chat") == {"west": 8, "east": 2}  # north has most room: not gold


def test_a_selector_no_cluster_matches_defers_saying_so_until_one_does() -> None:
    fleet = Clocked()
    fleet.quota("p", 100)
    fleet.cluster("east", 8, tier="bronze")
    fleet.preferring("chat", 2, Preferences(cluster_selector={"tier": "gold"}))
    deferred = fleet.placed[-1]
    assert (deferred.shares, deferred.reason) == ({}, "no_cluster_matches_selector")
    assert deferred.message == ("none of reachable clusters that report H100 devices has tier=gold")
    fleet.event("ClusterRegistered", "east", region=None, labels={"tier": "gold"})  # again
    assert fleet.shares("chat") == {"east": 2}


def test_spread_by_preferences_through_the_ledger() -> None:
    fleet = Clocked()
    fleet.quota("p", 100)
    for name in ("east", "west", "north"):
        fleet.cluster(name, 8)
    fleet.preferring("chat", 4, Preferences(strategy=Strategy.SPREAD))
    assert sorted(fleet.shares("chat").values()) == [1, 1, 2]


def test_bad_preferences_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as strategy:
        SetPlacementPreferences.model_validate(
            {"command_id": "c1", "workload_id": "chat", "strategy": "scatter"}
        )
    assert strategy.value.errors()[0]["loc"] == ("strategy",)
    with pytest.raises(ValidationError) as selector:
        SetPlacementPreferences.model_validate(
            {"command_id": "c1", "workload_id": "chat", "cluster_selector": {"bad key!": "x"}}
        )
    assert selector.value.errors()[0]["loc"][0] == "cluster_selector"
    pinned = CreateWorkload.model_validate(
        {
            "command_id": "c2",
            "workload_id": "chat",
            "project": "p",
            "device_class": "H100",
            "serving": serving().model_dump(mode="json"),
            "replicas": 1,
            "cluster": "east",
            "preferred_clusters": ["west"],
        }
    )
    with pytest.raises(InvalidValue) as refused:
        Workload.create(
            plane(),
            "chat",
            project="p",
            device_class="H100",
            serving=serving(),
            replicas=1,
            cluster_pin="east",
            preferences=pinned.preferences(),
        )
    assert refused.value.field == "preferred_clusters"


def test_preferences_unchanged_record_nothing() -> None:
    w = Workload.create(
        plane(),
        "chat",
        project="p",
        device_class="H100",
        serving=serving(),
        replicas=1,
        cluster_pin=None,
    )
    w.collect_events()
    w.set_preferences(plane(), Preferences())
    assert w.collect_events() == []
    w.set_preferences(plane(), Preferences(strategy=Strategy.SPREAD))
    assert [type(e).__name__ for e in w.collect_events()] == ["PlacementPreferencesChanged"]


# -- a share waiting too long ----------------------------------------------------------------


def starved() -> Clocked:
    """chat's 4 replicas on east, which lost half its devices before quota came: 2 run, 2
    wait for capacity; west has room."""
    fleet = Clocked()
    fleet.cluster("east", 4)
    fleet.workload("chat", 4)  # no quota yet: pending
    assert fleet.shares("chat") == {"east": 4}
    fleet.inventory("east", 2)
    fleet.cluster("west", 4)
    assert verdict(fleet.quota("p", 8)) == [("chat--east", True, 2, "insufficient_capacity")]
    return fleet


def test_a_share_waiting_for_capacity_moves_where_room_is_after_the_delay() -> None:
    fleet = starved()
    fleet.later(299)
    assert fleet.moves() == []  # not before the delay
    fleet.later(1)
    assert fleet.moves() == [Move("east", "west", 2, "pending_too_long")]
    assert fleet.shares("chat") == {"east": 2, "west": 2}
    assert verdict(fleet.decided[-2:]) == [
        ("chat--east", True, 2, None),  # what it holds is all it wants now
        ("chat--west", True, 2, None),
    ]
    assert fleet.moves() == []  # nothing waits any more


def test_a_waiting_share_stays_when_no_other_cluster_has_room() -> None:
    fleet = starved()
    fleet.workload("hog", 4)  # takes west's room
    assert fleet.shares("hog") == {"west": 4}
    fleet.later(600)
    assert fleet.moves() == []
    assert fleet.shares("chat") == {"east": 4}


def test_a_share_waiting_for_quota_does_not_move() -> None:
    fleet = Clocked()
    fleet.cluster("east", 4)
    fleet.cluster("west", 4)
    fleet.quota("p", 1)
    fleet.workload("chat", 3)
    fleet.later(3600)
    assert fleet.moves() == []  # another cluster has no more quota to give


def test_a_share_waiting_for_quota_on_an_unreachable_cluster_does_not_move() -> None:
    fleet = Clocked()
    fleet.cluster("east", 4)
    fleet.cluster("west", 4)
    fleet.quota("p", 1)
    fleet.workload("chat", 3)
    assert fleet.shares("chat") == {"east": 3}
    fleet.event("ClusterUnreachable", "east")
    fleet.later(300)  # waited past the delay, not yet lost
    assert fleet.moves() == []  # the quota it waits for is the same on any cluster


# -- a lost cluster --------------------------------------------------------------------------


def lost() -> Clocked:
    """chat runs 2 replicas on east, which then goes silent; west has room."""
    fleet = Clocked()
    fleet.quota("p", 8)
    fleet.cluster("east", 4)
    fleet.workload("chat", 2)
    fleet.cluster("west", 4)
    assert fleet.shares("chat") == {"east": 2}
    fleet.running("chat--east")
    fleet.replica("r1", "chat--east", 1)
    fleet.replica("r2", "chat--east", 1)
    fleet.event("ClusterUnreachable", "east")
    return fleet


def test_a_lost_clusters_shares_move_after_its_grace_and_its_deployment_is_disabled() -> None:
    fleet = lost()
    fleet.later(599)
    assert fleet.moves() == []  # unreachable, not lost yet
    fleet.later(1)
    assert fleet.moves() == [Move("east", "west", 2, "cluster_lost")]
    assert fleet.moved[-1].disable == "east"
    assert fleet.shares("chat") == {"east": 0, "west": 2}
    old = fleet.ledger.deployments["chat--east"]
    assert (old.enabled, old.deleted) == (False, False)  # disabled, not deleted
    assert old.allocated == 2  # what may still run there counts until it is seen to stop
    assert ("chat--west", True, 2, None) in verdict(fleet.decided)
    fleet.later(600)
    assert fleet.moves() == []  # moved once


def test_a_look_that_fails_part_way_keeps_the_moves_found_before() -> None:
    fleet = lost()
    members = fleet.ledger.members[("east", next(iter(fleet.ledger.classes["east"])))]
    members["ghost--east"] = None  # a member the ledger has no deployment for: reading it fails
    fleet.later(600)
    found = due(fleet.ledger, fleet.now, RULES)
    placement, _ = next(found)
    assert placement.move == Move("east", "west", 2, "cluster_lost")
    with pytest.raises(KeyError, match="ghost--east"):
        next(found)
    assert fleet.shares("chat") == {"east": 0, "west": 2}  # recorded: the scheduler makes it


def test_when_the_lost_cluster_returns_its_operator_takes_the_old_replicas_down() -> None:
    fleet = lost()
    fleet.later(600)
    fleet.moves()
    fleet.event("ClusterReachable", "east")
    # its operator renders the disabled deployment at 0 replicas: they are seen to stop
    fleet.event("ReplicaTerminated", "r1")
    fleet.event("ReplicaTerminated", "r2")
    old = fleet.ledger.deployments["chat--east"]
    assert (old.enabled, old.desired, old.allocated) == (False, 0, 0)
    fleet.later(3600)
    assert fleet.moves() == []
    assert fleet.shares("chat") == {"east": 0, "west": 2}
    fleet.event("WorkloadScaled", "chat", replicas=3)  # growth never goes to a disabled one
    while (placement := fleet.ledger.next_placement()) is not None:
        fleet.decide(fleet.ledger.record_placement(placement))
    assert fleet.shares("chat") == {"east": 0, "west": 3}


def test_a_lost_share_with_no_room_elsewhere_stays_until_room_appears() -> None:
    fleet = lost()
    fleet.workload("hog", 4)  # west is full
    fleet.later(600)
    assert fleet.moves() == []
    fleet.cluster("north", 2)
    assert fleet.moves() == [Move("east", "north", 2, "cluster_lost")]


def test_a_pinned_workload_never_moves() -> None:
    fleet = Clocked()
    fleet.quota("p", 8)
    fleet.cluster("east", 4)
    fleet.cluster("west", 4)
    fleet.event(
        "WorkloadCreated",
        "embed",
        project="p",
        device_class="H100",
        serving={"devices_per_replica": 1},
        serving_digest="d1",
        replicas=2,
        cluster_pin="east",
    )
    fleet.deployment("embed--east", 2)
    fleet.event("DeploymentAttached", "embed", cluster_id="east", deployment_key="embed--east")
    fleet.ledger.deployments["embed--east"].workload = "embed"
    fleet.event("ClusterUnreachable", "east")
    fleet.later(3600)
    assert fleet.moves() == []
    with pytest.raises(InvalidValue):
        w = Workload.create(
            plane(),
            "embed",
            project="p",
            device_class="H100",
            serving=serving(),
            replicas=2,
            cluster_pin="east",
        )
        w.record_move(plane(), "east", "west", 1, MoveReason.CLUSTER_LOST)


# -- rebalancing -------------------------------------------------------------------------------


def crowded_out(replicas: int) -> Clocked:
    """chat prefers east, which a pinned hog fills: it runs on west; then the hog leaves."""
    fleet = Clocked()
    fleet.quota("p", 100)
    fleet.cluster("east", 8)
    fleet.cluster("west", 8)
    fleet.deployment("hog", 8, cluster="east")
    fleet.preferring("chat", replicas, Preferences(preferred_clusters=("east",)))
    assert fleet.shares("chat") == {"west": replicas}
    fleet.running("chat--west")
    fleet.event("DeploymentDeleted", "hog")
    return fleet


def test_rebalancing_moves_toward_the_preferences_a_fraction_at_a_time() -> None:
    fleet = crowded_out(8)
    assert fleet.moves() == [Move("west", "east", 2, "rebalance")]  # a quarter of 8
    assert fleet.moves() == []  # until what moved serves
    fleet.running("chat--east")
    assert fleet.moves() == [Move("west", "east", 2, "rebalance")]
    for _ in range(2):
        fleet.running("chat--east")
        fleet.moves()
    assert fleet.shares("chat") == {"west": 0, "east": 8}
    fleet.running("chat--east")
    assert fleet.moves() == []  # where it prefers: it stays


def test_rebalancing_never_moves_more_than_the_fraction() -> None:
    fleet = crowded_out(3)  # a quarter of 3 is not one replica
    assert fleet.moves() == []
    assert fleet.moves(MoveRules(max_fraction=0.34)) == [Move("west", "east", 1, "rebalance")]


def test_rebalancing_moves_only_into_room() -> None:
    fleet = crowded_out(8)
    fleet.deployment("other", 7, cluster="east")
    assert fleet.moves() == [Move("west", "east", 1, "rebalance")]
