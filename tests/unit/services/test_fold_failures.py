"""An event one projection's fold cannot handle: the other projections fold it, the failure is
reported once, and a rebuild from the store reaches the same views as the live fold."""

from __future__ import annotations

from typing import Any

import orjson

from wingsmith.adapters.store import Notification
from wingsmith.projections.base import Fold
from wingsmith.projections.fleet import PROJECTIONS
from wingsmith.services.hub.projector import envelope_problem, rebuild

AT = "2026-11-29T14:00:00+00:00"
HISTORY: list[tuple[str, str, str, dict[str, Any]]] = [  # (aggregate, id, type, fields)
    ("project", "p", "QuotaSet", {"device_class": "H100", "devices": 4}),
    ("replica", "d--east--pod", "ReplicaStarted", {"deployment_id": "d--east", "device_ids": 5}),
    ("project", "p", "QuotaSet", {"device_class": "H100", "devices": 8}),
]


def notes() -> list[Notification]:
    stored = []
    for position, (aggregate, key, kind, fields) in enumerate(HISTORY, start=1):
        state = orjson.dumps({"timestamp": AT, "command_id": "c", "correlation_id": "c"} | fields)
        topic = f"domain.{aggregate}:{kind}"
        stored.append(Notification(f"{aggregate}:{key}", 1, topic, state, position))
    return stored


def test_a_failing_handler_is_reported_and_the_rest_fold_on() -> None:
    live = Fold(kind() for kind in PROJECTIONS)
    failures = []
    for note in notes():
        event = orjson.loads(note.state)
        kind = note.topic.rpartition(":")[2]
        live.apply(note.id, kind, str(note.originator_id).partition(":")[2], event)
        failures += live.take_failures()

    assert live.position == 3
    assert {name for name, _ in failures} == {
        "allocations",
        "capacity",
        "capacity_nodes",
        "quota_use",
    }
    assert all(reason.startswith("TypeError") for _, reason in failures)
    [quota] = [p for p in live.projections if p.name == "quota_use"]
    assert quota.views["p.H100"]["quota"] == 8  # what came after still folds

    rebuilt = rebuild(lambda after, limit: [n for n in notes() if n.id > after][:limit])
    for mine, theirs in zip(live.projections, rebuilt.projections, strict=True):
        assert mine.views == theirs.views, mine.name


def test_what_is_not_an_event_is_named() -> None:
    good = {"position": 1, "type": "QuotaSet", "aggregate_id": "p", "event": {"timestamp": AT}}
    assert envelope_problem(good) is None
    assert envelope_problem([]) == "the message is not a JSON object"
    assert envelope_problem(good | {"position": True}) == "position: missing or not int"
    assert envelope_problem({k: v for k, v in good.items() if k != "event"}) == (
        "event: missing or not dict"
    )
    naive = good | {"event": {"timestamp": "2026-11-29T14:00:00"}}
    assert envelope_problem(naive) == "event.timestamp: not a time with its zone: " + repr(
        "2026-11-29T14:00:00"
    )
