"""The hub's health: can it take a command, store it and carry it through to the views?

"The process answers" is not enough: a hub whose store refuses writes, whose relay cannot
publish, whose projector died or whose scheduler fell far behind still answers on NATS, and
every write then hangs or waits for views that never come. The monitor looks at each stage
every second and compares its position with the store's (docs/operations.md#health):

- store: a row written and committed every few seconds (`EventStore.probe_write`);
- relay: synchronised with WINGSMITH_EVENTS, and how many store positions it has not published;
- projector: its process running (supervised), and how many events of WINGSMITH_EVENTS it has
  not folded into the views yet;
- scheduler: how many store positions it has not read yet;
- dead letters: what any stage set aside (a warning: the rest flows on).

A stage is failing when it lags by more than its limit (`HealthLimits`), or lags at all and
has not moved for `stall_seconds`. The hub answers `HEALTH_SUBJECT` with a `HealthReport`;
`wingsmith ping` and the API's `/readyz` ask it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from wingsmith.adapters.dead_letters import DeadLetters
from wingsmith.adapters.store import StoreThread
from wingsmith.services.config import HealthLimits
from wingsmith.services.health import (
    Check,
    DeadLetterCounts,
    HealthReport,
    Stage,
    Status,
)
from wingsmith.services.hub.relay import Relay
from wingsmith.services.hub.supervisor import ChildState, Supervisor
from wingsmith.services.tasks import Backoff, supervise

log = logging.getLogger(__name__)

REFRESH = 1.0  # seconds between looks at the stages
HEALTH_RETRY = Backoff(first=REFRESH, cap=5.0)  # after a look that failed
PROBE_EVERY = 5.0  # seconds between write probes of the store
STORE_TIMEOUT = 5.0  # a store call slower than this counts as a failure


@dataclass
class _Mover:
    """When a stage's position last moved, to tell a slow stage from a stuck one."""

    position: int = -1
    moved_at: float = field(default_factory=time.monotonic)

    def seen(self, position: int, now: float) -> None:
        if position != self.position:
            self.position, self.moved_at = position, now


@dataclass
class Stages:
    """What a hub runs; a hub without the relay has only its store."""

    store: StoreThread
    relay: Relay | None = None
    scheduler_position: Callable[[], int] | None = None
    projector: Supervisor | None = None
    projector_progress: Callable[[], Awaitable[dict[str, Any] | None]] | None = None
    dead_letters_stored: Callable[[], Awaitable[dict[str, int]]] | None = None
    dead_letters: DeadLetters | None = None  # this hub's own, for the latest one
    lease: Callable[[], tuple[Status, str]] | None = None  # whether this hub holds it


@dataclass
class _Samples:
    at: float = 0.0  # monotonic time of the last complete look
    head: int = 0
    store_error: str | None = "not probed yet"
    probed_at: float = 0.0
    projected_seq: int | None = None  # the projector's stream sequence
    projected: int | None = None  # ... and the store position it has folded up to
    dead: dict[str, int] = field(default_factory=dict)


class HealthMonitor:
    def __init__(self, stages: Stages, limits: HealthLimits) -> None:
        self.stages, self.limits = stages, limits
        self._samples = _Samples()
        self._movers = {stage: _Mover() for stage in Stage}

    async def run(self) -> None:
        """Look at every stage each `REFRESH` seconds until cancelled. A look that fails never
        stops the hub: it is logged and looked again, and the report ages meanwhile."""
        await supervise("health", self._refreshes, HEALTH_RETRY, logger=log)

    async def _refreshes(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH)

    async def refresh(self) -> None:
        s = self._samples
        s.store_error = await self._look_at_store()
        if self.stages.projector_progress is not None:
            progress = await self.stages.projector_progress()
            s.projected_seq = int(progress["stream_seq"]) if progress else 0
            s.projected = int(progress["position"]) if progress else 0
        if self.stages.dead_letters_stored is not None:
            s.dead = await self.stages.dead_letters_stored()
        s.at = time.monotonic()
        for stage, position in self._positions().items():
            self._movers[stage].seen(position, s.at)

    async def _look_at_store(self) -> str | None:
        """Read the store's last position, and write to it every `PROBE_EVERY` seconds (at
        once while it is failing); what went wrong, if anything."""
        s, store = self._samples, self.stages.store
        try:
            async with asyncio.timeout(STORE_TIMEOUT):
                if time.monotonic() - s.probed_at >= PROBE_EVERY or s.store_error:
                    s.probed_at = time.monotonic()
                    await store.run(store.store.probe_write)
                s.head = await store.run(store.store.last_position)
        except TimeoutError:
            return f"the store did not answer within {STORE_TIMEOUT:g}s"
        except Exception as e:
            return str(e) or type(e).__name__
        return None

    def _positions(self) -> dict[Stage, int]:
        positions = {}
        if self.stages.relay is not None:
            positions[Stage.RELAY] = self.stages.relay.position
        if self._samples.projected_seq is not None:
            positions[Stage.PROJECTOR] = self._samples.projected_seq
        if self.stages.scheduler_position is not None:
            positions[Stage.SCHEDULER] = self.stages.scheduler_position()
        return positions

    def store_positions(self) -> dict[str, int]:
        """The store position each stage this hub runs has reached: relayed and scheduled as
        they are now, projected as of the last look, and stored (the last one written) as of
        the last look or, when a stage has gone further since, that far (what was relayed
        was stored)."""
        s, stages = self._samples, self.stages
        positions = {}
        if stages.relay is not None:
            positions["relayed"] = stages.relay.position
        if stages.scheduler_position is not None:
            positions["scheduled"] = stages.scheduler_position()
        if s.projected is not None:
            positions["projected"] = s.projected
        return {"stored": max([s.head, *positions.values()])} | positions

    def report(self) -> HealthReport:
        checks = [self._monitor(), self._store()]
        if self.stages.lease is not None:
            status, detail = self.stages.lease()
            checks.append(Check(stage=Stage.LEASE, status=status, detail=detail))
        relay = self.stages.relay
        if relay is not None:
            checks.append(self._relay(relay))
        if self.stages.projector is not None:
            checks.append(self._projector(self.stages.projector))
        if self.stages.scheduler_position is not None:
            checks.append(self._scheduler(self.stages.scheduler_position()))
        dead = self._dead_letters()
        checks.append(_dead_check(dead))
        return HealthReport(
            healthy=all(c.status is not Status.FAILING for c in checks),
            checks=checks,
            dead_letters=dead,
            store_position=self._samples.head,
            at=datetime.now(UTC),
        )

    def _monitor(self) -> Check:
        age = time.monotonic() - self._samples.at
        if not self._samples.at:
            detail = "no complete look at the stages yet"
            return Check(stage=Stage.MONITOR, status=Status.FAILING, detail=detail)
        if age > 3 * REFRESH + STORE_TIMEOUT:  # the store or NATS hangs
            detail = f"the last complete look at the stages was {age:.0f}s ago"
            return Check(stage=Stage.MONITOR, status=Status.FAILING, detail=detail)
        return Check(stage=Stage.MONITOR, status=Status.OK, detail=f"looked {age:.1f}s ago")

    def _store(self) -> Check:
        s = self._samples
        if s.store_error is not None:
            return Check(
                stage=Stage.STORE,
                status=Status.FAILING,
                detail=f"cannot be written: {s.store_error}",
                position=s.head,
            )
        return Check(stage=Stage.STORE, status=Status.OK, detail="writable", position=s.head)

    def _lagging(self, stage: Stage, position: int, lag: int, limit: int, unit: str) -> Check:
        """A stage `lag` behind: failing past `limit`, or when it has not moved for a while."""
        lag = max(lag, 0)
        mover = self._movers[stage]
        still = 0.0 if position != mover.position else time.monotonic() - mover.moved_at
        status, detail = Status.OK, f"{lag:,} {unit} behind"
        if lag > limit:
            status, detail = Status.FAILING, f"{detail} (limit {limit:,})"
        elif lag and still >= self.limits.stall_seconds:
            status, detail = Status.FAILING, f"{detail}, not moving for {still:.0f}s"
        return Check(stage=stage, status=status, detail=detail, position=position, lag=lag)

    def _relay(self, relay: Relay) -> Check:
        if relay.mismatch is not None:
            return Check(stage=Stage.RELAY, status=Status.FAILING, detail=relay.mismatch)
        if not relay.synced.is_set():
            return Check(
                stage=Stage.RELAY,
                status=Status.FAILING,
                detail="not synchronised with WINGSMITH_EVENTS (is NATS reachable?)",
                position=relay.position,
            )
        lag = self._samples.head - relay.position
        return self._lagging(Stage.RELAY, relay.position, lag, self.limits.relay_lag, "positions")

    def _projector(self, supervisor: Supervisor) -> Check:
        status = supervisor.status
        restarts = (
            f"; restarts: {status.restarts} (last: {status.last_exit})" if status.restarts else ""
        )
        if status.state is not ChildState.RUNNING:
            since = (datetime.now(UTC) - status.since).total_seconds()
            return Check(
                stage=Stage.PROJECTOR,
                status=Status.FAILING,
                detail=f"process {status.state} for {since:.0f}s{restarts}",
            )
        relay, seq = self.stages.relay, self._samples.projected_seq
        if relay is None or seq is None:
            return Check(stage=Stage.PROJECTOR, status=Status.OK, detail=f"running{restarts}")
        check = self._lagging(
            Stage.PROJECTOR, seq, relay.seq - seq, self.limits.projector_lag, "events"
        )
        return check.model_copy(update={"detail": check.detail + restarts})

    def _scheduler(self, position: int) -> Check:
        lag = self._samples.head - position
        return self._lagging(Stage.SCHEDULER, position, lag, self.limits.scheduler_lag, "positions")

    def _dead_letters(self) -> DeadLetterCounts:
        stored = self._samples.dead
        own = self.stages.dead_letters.snapshot() if self.stages.dead_letters else None
        by_component = stored or (own["by_component"] if own else {})
        return DeadLetterCounts(
            total=sum(by_component.values()),
            by_component=dict(by_component),
            last=own["last"] if own else None,
        )


def _dead_check(dead: DeadLetterCounts) -> Check:
    if not dead.total:
        return Check(stage=Stage.DEAD_LETTERS, status=Status.OK, detail="none")
    parts = ", ".join(f"{c}: {n:,}" for c, n in sorted(dead.by_component.items()))
    detail = f"{dead.total:,} set aside ({parts}); see `wingsmith dead-letters`"
    return Check(stage=Stage.DEAD_LETTERS, status=Status.WARNING, detail=detail)
