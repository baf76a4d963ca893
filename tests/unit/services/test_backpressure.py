"""Backpressure: clients wait while the scheduler's backlog is too old, and are answered busy
when too many wait or intake has been held too long."""

from __future__ import annotations

import pytest
from eventsourcing.persistence import Notification

from wingsmith.services.hub import backpressure
from wingsmith.services.hub.backpressure import Backlog, Backpressure


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batch(upto: int) -> list[Notification]:
    return [Notification(id=upto, originator_id="x", originator_version=1, topic="t", state=b"")]


def intake(clock: Clock, handled: list[int]) -> Backpressure:
    backlog = Backlog(clock)
    backlog.handled = lambda: handled[0]
    return Backpressure(backlog, max_lag=0.5, max_waiting=10, busy_after=2.0)


def test_the_backlog_is_the_age_of_the_oldest_batch_not_handled() -> None:
    clock, handled = Clock(), [0]
    backlog = intake(clock, handled).backlog
    assert backlog.age() == 0.0
    backlog.committed(batch(5))
    clock.now += 1
    backlog.committed(batch(9))
    clock.now += 1
    assert backlog.age() == 2.0
    handled[0] = 5
    assert backlog.age() == 1.0
    handled[0] = 9
    assert backlog.age() == 0.0


def test_a_full_backlog_still_ages_until_its_last_batch_is_handled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backpressure, "MARKS", 2)
    clock, handled = Clock(), [0]
    backlog = intake(clock, handled).backlog
    for upto in (1, 2, 3):
        backlog.committed(batch(upto))
        clock.now += 1
    handled[0] = 2
    assert backlog.age() == 2.0  # batch 3 waits, counted from the time of the mark it joined


def test_intake_is_held_above_the_lag_and_reopens_below_half_of_it() -> None:
    clock, handled = Clock(), [0]
    gate = intake(clock, handled)
    gate.backlog.committed(batch(5))
    clock.now += 0.4
    assert gate.open()
    clock.now += 0.2  # 0.6 s behind
    assert not gate.open()
    gate.backlog.committed(batch(9))
    handled[0] = 5
    clock.now += 0.3  # the newer batch is 0.3 s old: above half the bound, still held
    assert not gate.open()
    clock.now -= 0.1
    assert gate.open()  # 0.2 s
    assert gate.held == 1


def test_busy_when_too_many_wait_or_held_too_long_with_a_retry_hint() -> None:
    clock, handled = Clock(), [0]
    gate = intake(clock, handled)
    assert gate.busy(9) is None
    hint = gate.busy(10)
    assert hint is not None and hint[0] == 0.5 and "10 commands are waiting" in hint[1]
    gate.backlog.committed(batch(5))
    clock.now += 1
    assert not gate.open() and gate.busy(0) is None  # held: new commands wait their turn
    clock.now += 2.5
    hint = gate.busy(0)
    assert hint is not None and hint == (3.5, "the scheduler is behind")
    handled[0] = 5  # caught up: nobody is turned away
    assert gate.busy(0) is None and gate.open()
    assert gate.refused == 2
