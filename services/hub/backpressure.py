"""Backpressure: clients' commands wait, or are answered `busy`, while the hub is behind.

What the hub commits, the relay publishes and the scheduler folds and decides for. If clients
send faster than that, the difference would pile up somewhere (once it was an unbounded queue
of published events and a lag of minutes before admission). Instead the hub measures how far
behind its follower is — the age of the oldest committed batch it has not handled yet — and
holds clients' commands while that age is above a bound: they wait in the command queue (the
hub's own commands, the scheduler's decisions among them, still go through), so the follower
catches up. A client whose command would wait too long, or that finds too many waiting
already, gets `busy` at once, with a hint of when to retry.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from wingsmith.adapters.store import Notification

MARKS = 100_000  # committed batches remembered; beyond, the oldest one still tells the age


class Backlog:
    """Committed batches the follower has not handled yet, with when they were committed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.handled: Callable[[], int] = lambda: 0  # the follower's position
        self._marks: deque[tuple[int, float]] = deque()

    def committed(self, notifications: list[Notification]) -> None:
        if not notifications:
            return
        if len(self._marks) < MARKS:
            self._marks.append((notifications[-1].id, self.clock()))
        else:  # the last mark stands for these too, with its older time: the age errs high
            self._marks[-1] = (notifications[-1].id, self._marks[-1][1])

    def age(self) -> float:
        """Seconds since the oldest batch the follower has not handled was committed."""
        handled = self.handled()
        marks = self._marks
        while marks and marks[0][0] <= handled:
            marks.popleft()
        return self.clock() - marks[0][1] if marks else 0.0


@dataclass
class Backpressure:
    """When clients' commands go in. `max_lag`: hold them while the backlog is older than this
    (seconds), until it is back under half; `max_waiting`: refuse beyond this many waiting;
    `busy_after`: refuse new ones once intake has been held this long."""

    backlog: Backlog
    max_lag: float = 0.25
    max_waiting: int = 4096
    busy_after: float = 2.0
    _held_since: float | None = field(default=None, init=False)
    held: int = field(default=0, init=False)  # times intake was held
    refused: int = field(default=0, init=False)  # commands answered busy

    def open(self) -> bool:
        """Whether clients' commands may be taken now (with hysteresis)."""
        age = self.backlog.age()
        if self._held_since is None:
            if age <= self.max_lag:
                return True
            self._held_since = self.backlog.clock()
            self.held += 1
            return False
        if age <= self.max_lag / 2:
            self._held_since = None
            return True
        return False

    def busy(self, waiting: int) -> tuple[float, str] | None:
        """(seconds to wait before retrying, why) when a client's command should be refused
        now; None when it may wait its turn."""
        if waiting >= self.max_waiting:
            why = f"{waiting} commands are waiting already"
        elif self._held_too_long():
            why = "the scheduler is behind"
        else:
            return None
        self.refused += 1
        return min(max(self.backlog.age(), self.max_lag), 5.0), why

    def _held_too_long(self) -> bool:
        if self._held_since is None or self.open():  # looked again: the backlog may be gone
            return False
        return self.backlog.clock() - self._held_since > self.busy_after
