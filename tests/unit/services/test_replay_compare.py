"""`wingsmith replay`'s verdict: rebuilt views against live ones, position by position."""

from __future__ import annotations

import orjson

from wingsmith.projections.base import Fold
from wingsmith.projections.fleet import QuotaUse
from wingsmith.services.hub.projector import compare


def rebuilt() -> QuotaUse:
    projection = QuotaUse()
    target = Fold([projection])
    for position, (project, devices) in enumerate([("a", 4), ("b", 8)], start=1):
        event = {"device_class": "H100", "devices": devices, "timestamp": "2026-11-29T14:00:00Z"}
        target.apply(position, "QuotaSet", project, event)
    return projection


def live(projection: QuotaUse, key: str, position: int) -> tuple[int, bytes]:
    return position, orjson.dumps(projection.views[key])


def test_equal_views_pass_and_later_changes_are_not_compared() -> None:
    expected = rebuilt()
    changed_later = dict(expected.views["b.H100"], quota=99)
    verdict = compare(
        expected,
        2,
        {"a.H100": live(expected, "a.H100", 1), "b.H100": (3, orjson.dumps(changed_later))},
    )
    assert (verdict.equal, verdict.newer, verdict.mismatched) == (1, 1, [])


def test_differences_missing_and_extra_views_are_reported() -> None:
    expected = rebuilt()
    wrong = dict(expected.views["a.H100"], quota=5, available=5)
    verdict = compare(
        expected, 2, {"a.H100": (1, orjson.dumps(wrong)), "c.H100": (2, b'{"quota": 1}')}
    )
    assert verdict.equal == 0
    assert verdict.mismatched == [
        "a.H100: differs in available, quota",
        "b.H100: missing from the live view",
        "c.H100: live view has a key the rebuild does not",
    ]


def test_a_view_removed_in_both_is_equal() -> None:
    expected = rebuilt()
    views = {key: live(expected, key, 1) for key in expected.views}
    verdict = compare(expected, 2, views | {"gone.H100": (2, None)})
    assert (verdict.equal, verdict.mismatched) == (2, [])
