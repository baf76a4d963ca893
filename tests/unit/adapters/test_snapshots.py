"""A snapshot holds an aggregate exactly: restored and brought forward by the events after it,
it equals the aggregate replayed from its whole history, whatever the history and the cut."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from wingsmith.adapters.snapshots import AggregateSnapshot, restore, take
from wingsmith.domain.base import Aggregate, Event, replay
from wingsmith.domain.project import Project
from wingsmith.domain.receipt import CommandReceipt
from wingsmith.domain.replica import Roster
from wingsmith.domain.workload_name import WorkloadName

from ..projections.history import CLUSTER, CREATE, OPERATIONS, PLANE, Fleet, envelope


class RecordedFleet(Fleet):
    """A fleet that keeps its events as they were recorded, beside their envelopes."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        super().__init__()

    def _keep(self, *aggregates: Aggregate) -> None:
        for aggregate in aggregates:
            for event in aggregate.collect_events():
                self.events.append(event)
                self.envelopes.append(envelope(event, len(self.envelopes) + 1))


@st.composite
def histories(draw: st.DrawFn) -> dict[str, list[Event]]:
    """Each aggregate's events, of a random fleet history."""
    fleet = RecordedFleet()
    for op in [*draw(st.lists(CREATE, min_size=1, max_size=4)), *draw(st.lists(OPERATIONS))]:
        fleet.run(op)
    by_aggregate: dict[str, list[Event]] = defaultdict(list)
    for event in fleet.events:
        by_aggregate[event.originator_id].append(event)
    return by_aggregate


def stored(snapshot: AggregateSnapshot) -> AggregateSnapshot:
    """The snapshot as the store gives it back: through JSON."""
    return AggregateSnapshot.model_validate_json(snapshot.model_dump_json())


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_a_snapshot_and_the_events_after_it_replay_to_the_whole_history(
    history: dict[str, list[Event]], data: st.DataObject
) -> None:
    for agg_id, events in history.items():
        cut = data.draw(st.integers(1, len(events)), label=agg_id)
        snapshot = stored(take(replay(events[:cut]), agg_id))  # type: ignore[arg-type]
        assert replay(events[cut:], restore(snapshot)) == replay(events)


def other_aggregates() -> list[Aggregate]:
    """Aggregates the fleet histories do not make."""
    roster = Roster.open(CLUSTER, "w--east")
    for name in ("p-0", "p-1", "p-2"):
        roster.join(CLUSTER, name)
    roster.leave(CLUSTER, "p-1")
    claimed = WorkloadName.claim_first(PLANE, "chat", "chat--2", earlier=("chat",))
    receipt = CommandReceipt.record(PLANE, subject="s", payload_digest="d", result={"a": [1]})
    return [roster, claimed, receipt]


@pytest.mark.parametrize("aggregate", other_aggregates(), ids=lambda a: a.kind)
def test_every_kind_of_aggregate_round_trips_with_typed_values(aggregate: Aggregate) -> None:
    aggregate.collect_events()
    restored = restore(stored(take(aggregate, aggregate.id)))
    assert restored == aggregate
    assert {k: type(v) for k, v in vars(restored).items()} == {
        k: type(v) for k, v in vars(aggregate).items() if k != "on_record"
    }


def test_an_attribute_without_an_annotation_cannot_be_snapshotted() -> None:
    project = Project.register(PLANE, "research")
    unannotated: Any = project
    unannotated.scratch = 1
    with pytest.raises(ValidationError, match="scratch"):
        take(project, project.id)
