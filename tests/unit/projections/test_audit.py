"""Audit timelines: which fields each event changed, from what to what."""

from __future__ import annotations

from typing import Any

from wingsmith.projections.audit import Change, Timeline, incarnation_of, incarnations


def envelope(position: int, type_: str, **fields: Any) -> dict[str, Any]:
    return {
        "position": position,
        "aggregate": "deployment",
        "aggregate_id": "llama--east",
        "version": position,
        "type": type_,
        "event": {
            "timestamp": f"2026-11-29T14:0{position}:00+00:00",
            "command_id": f"c{position}",
            "correlation_id": "corr",
            **fields,
        },
    }


def test_each_entry_names_the_fields_it_changed() -> None:
    timeline = Timeline()
    created = {"desired_replicas": 2, "serving": {"devices": 1, "image": None}, "status": None}
    timeline.apply(envelope(1, "DeploymentCreated", **created))
    timeline.apply(envelope(2, "DeploymentScaled", desired_replicas=4))
    timeline.apply(envelope(3, "ServingConfigChanged", serving={"devices": 2, "image": None}))
    timeline.apply(envelope(3, "ServingConfigChanged", serving={"devices": 2}))  # a repeat
    first, scaled, serving = timeline.entries
    assert first.changes == {  # nulls are not news
        "desired_replicas": Change(None, 2),
        "serving.devices": Change(None, 1),
    }
    assert scaled.changes == {"desired_replicas": Change(2, 4)}
    assert serving.changes == {"serving.devices": Change(1, 2)}
    assert serving.as_dict()["changes"] == {"serving.devices": {"before": 1, "after": 2}}
    assert (serving.command_id, serving.correlation_id) == ("c3", "corr")


def test_a_deletion_is_an_entry_that_changes_no_field() -> None:
    timeline = Timeline()
    timeline.apply(envelope(1, "DeploymentScaled", desired_replicas=4))
    deleted = timeline.apply(envelope(2, "DeploymentDeleted"))
    assert deleted is not None
    assert (deleted.type, deleted.changes, deleted.version) == ("DeploymentDeleted", {}, 2)


def claim(position: int, type_: str, **fields: Any) -> dict[str, Any]:
    return envelope(position, type_, **fields) | {"aggregate": "workload_name"}


def test_a_names_record_numbers_every_incarnation_of_it() -> None:
    record = [
        claim(1, "WorkloadNameClaimed", workload_id="chat--2", incarnation=2, earlier=["chat"]),
        claim(2, "WorkloadNameReclaimed", workload_id="chat--3", incarnation=3),
    ]
    numbered = incarnations(record)
    assert numbered == {"chat": 1, "chat--2": 2, "chat--3": 3}
    timeline = Timeline()
    second = timeline.apply(
        envelope(3, "WorkloadCreated", name="chat")
        | {"aggregate": "workload"}
        | {"aggregate_id": "chat--2"}
    )
    assert second is not None and incarnation_of(second, numbered) == 2
    other = timeline.apply(envelope(4, "DeploymentScaled", desired_replicas=1))
    assert other is not None and incarnation_of(other, numbered) is None


def test_a_name_never_reused_has_no_record_and_no_numbers() -> None:
    assert incarnations([]) == {}
