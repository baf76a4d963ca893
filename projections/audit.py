"""Audit timelines: an aggregate's history as a list of what each event changed.

A pure fold like the other projections, but of one aggregate's events (or of one causal chain's)
at a time, for `wingsmith audit`: it keeps each aggregate's fields as its events set them, so
every entry can say which fields moved from what to what.

A workload is audited by its name: its name's record (domain/workload_name.py) says which
workload id each incarnation of the name had, and every incarnation's history is shown, each
entry labelled with the incarnation it belongs to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from wingsmith.domain.contracts import views as v
from wingsmith.domain.workload import Workload
from wingsmith.domain.workload_name import (
    WorkloadName,
    WorkloadNameClaimed,
    WorkloadNameReclaimed,
)
from wingsmith.projections.base import Envelope

METADATA = ("timestamp", "command_id", "correlation_id")


@dataclass(frozen=True, slots=True)
class Change:
    before: Any
    after: Any


@dataclass(frozen=True, slots=True)
class Entry:
    position: int
    timestamp: str
    aggregate: str
    aggregate_id: str
    version: int
    type: str
    changes: dict[str, Change]
    command_id: str
    correlation_id: str

    def as_dict(self) -> v.TimelineEntry:
        return {
            "position": self.position,
            "timestamp": self.timestamp,
            "aggregate": self.aggregate,
            "aggregate_id": self.aggregate_id,
            "version": self.version,
            "type": self.type,
            "changes": {k: {"before": c.before, "after": c.after} for k, c in self.changes.items()},
            "command_id": self.command_id,
            "correlation_id": self.correlation_id,
        }


def flatten(fields: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted names (`serving.devices_per_replica`); lists stay whole."""
    flat: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


class Timeline:
    """Entries in the order events are applied; an event seen before is skipped."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._fields: dict[tuple[str, str], dict[str, Any]] = {}
        self._position = 0

    def apply(self, envelope: Envelope) -> Entry | None:
        if envelope["position"] <= self._position:
            return None
        self._position = envelope["position"]
        event = envelope["event"]
        known = self._fields.setdefault((envelope["aggregate"], envelope["aggregate_id"]), {})
        body = flatten({k: v for k, v in event.items() if k not in METADATA})
        changes = {  # a field no event has set yet counts as null
            name: Change(known.get(name), value)
            for name, value in body.items()
            if known.get(name) != value
        }
        known |= body
        entry = Entry(
            position=envelope["position"],
            timestamp=event["timestamp"],
            aggregate=envelope["aggregate"],
            aggregate_id=envelope["aggregate_id"],
            version=envelope["version"],
            type=envelope["type"],
            changes=changes,
            command_id=event["command_id"],
            correlation_id=event["correlation_id"],
        )
        self.entries.append(entry)
        return entry


NAME_KIND = WorkloadName.kind


def incarnations(record: Iterable[Envelope]) -> dict[str, int]:
    """Workload id -> incarnation number, of every workload of a name, from the events of the
    name's record; empty when it has none (a name given before names were recorded, and never
    reused: its one workload's id is the name)."""
    ids: list[str] = []
    for envelope in record:
        event = envelope["event"]
        if envelope["type"] == WorkloadNameClaimed.__name__:
            ids = [*event.get("earlier", ()), event["workload_id"]]
        elif envelope["type"] == WorkloadNameReclaimed.__name__:
            ids.append(event["workload_id"])
    return {workload_id: n for n, workload_id in enumerate(ids, start=1)}


def incarnation_of(entry: Entry, numbered: Mapping[str, int]) -> int | None:
    """The incarnation a workload's entry belongs to (None for another aggregate's)."""
    if entry.aggregate != Workload.kind:
        return None
    return numbered.get(entry.aggregate_id)
