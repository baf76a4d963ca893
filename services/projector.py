"""The projector: keeps every projection current from WINGSMITH_EVENTS, publishes each view
change, and checkpoints all projections together.

A checkpoint holds each projection's state with the store position and the stream sequence it
reached, written in one transaction. On start the projector restores the latest checkpoint and
reads the stream from the sequence after it, so every event is applied exactly once to the
state that is kept; projections also skip any event at or below their position, so a message
delivered twice changes nothing. Rebuilding from zero reads the event store instead of the
stream and must reach the same views.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import orjson

from adapters.checkpoints import Checkpoint, CheckpointStore
from adapters.nats_bus import StreamMessage
from adapters.store import Notification, StoreThread
from projections.base import Projection
from projections.fleet import PROJECTIONS
from services.relay import envelope

log = logging.getLogger(__name__)

CHECKPOINT_EVENTS = 20_000
CHECKPOINT_SECONDS = 10.0
READ_PAGE = 5_000


class ViewSink(Protocol):
    async def change(self, projection: str, key: str, view: bytes | None, position: int) -> None:
        """Publish one change of one view (None: removed)."""

    async def latest(self, projection: str, key: str, view: bytes | None, position: int) -> None:
        """Keep a view's latest value."""

    async def progress(self, progress: dict[str, Any]) -> None:
        """Report how far the projector has got."""

    async def flush(self, timeout: float = ...) -> None: ...


Source = Callable[[int], AsyncIterator[list[StreamMessage]]]
StoreRead = Callable[[int, int], list[Notification]]


class Projector:
    def __init__(
        self,
        store: StoreThread,
        checkpoints: CheckpointStore,
        source: Source,
        sink: ViewSink,
        kinds: Iterable[type[Projection]] = PROJECTIONS,
    ) -> None:
        self._store, self.checkpoints = store, checkpoints
        self._source, self._sink = source, sink
        self.projections = [kind() for kind in kinds]
        self.seq = 0  # the last stream sequence applied
        self._event_time: datetime | None = None
        self._since_checkpoint = 0
        self._checkpointed_at = time.monotonic()
        self._busy: asyncio.Future[None] | None = None

    async def run(self) -> None:
        """Follow the stream until cancelled; a batch being applied is never cut in half. After
        a failure (a server restart losing acknowledgements), start again from the checkpoint:
        changes since then are published again, and the stream drops the repeats."""
        while True:
            try:
                await self._restore()
                async for batch in self._source(self.seq):
                    self._busy = asyncio.ensure_future(self._step(batch))
                    await asyncio.shield(self._busy)
            except Exception as e:
                log.warning("projector: %s: %s; resuming from the checkpoint", type(e).__name__, e)
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        """After `run` is cancelled: finish the batch in hand and checkpoint."""
        if self._busy is not None:
            await asyncio.gather(self._busy, return_exceptions=True)
        await self.checkpoint()

    async def _step(self, batch: list[StreamMessage]) -> None:
        await self._apply(batch)
        if self._due():
            await self.checkpoint()

    async def _restore(self) -> None:
        self.projections = [type(p)() for p in self.projections]
        self.seq, self._event_time, self._busy = 0, None, None
        for projection in self.projections:
            saved = await self._store.run(self.checkpoints.latest, projection.name)
            if saved is not None:
                projection.restore(saved.state)
                self.seq = saved.stream_seq  # written together: the same for all
                self._event_time = saved.event_time

    async def _apply(self, batch: list[StreamMessage]) -> None:
        """Fold a batch: every view change goes on the projection stream as it happens; the
        latest value of each view changed, and the projector's progress, once per batch."""
        latest: dict[tuple[int, str], tuple[bytes | None, int]] = {}
        for message in batch:
            event = orjson.loads(message.data)
            position = event["position"]
            for i, projection in enumerate(self.projections):
                for key in projection.apply(event):
                    view = projection.view(key)
                    payload = None if view is None else orjson.dumps(view)
                    await self._sink.change(projection.name, key, payload, position)
                    latest[(i, key)] = (payload, position)
            self.seq = message.seq
            self._event_time = datetime.fromisoformat(event["event"]["timestamp"])
        for (i, key), (payload, position) in latest.items():
            await self._sink.latest(self.projections[i].name, key, payload, position)
        assert self._event_time is not None
        await self._sink.progress(
            {
                "position": max(p.position for p in self.projections),
                "stream_seq": self.seq,
                "event_time": self._event_time.isoformat(),
            }
        )
        self._since_checkpoint += len(batch)
        await self._sink.flush()

    def _due(self) -> bool:
        if self._since_checkpoint >= CHECKPOINT_EVENTS:
            return True
        stale = time.monotonic() - self._checkpointed_at > CHECKPOINT_SECONDS
        return stale and self._since_checkpoint > 0

    async def checkpoint(self) -> None:
        if self._event_time is None:
            return
        saved = [
            Checkpoint(p.name, p.position, self.seq, self._event_time, p.state())
            for p in self.projections
        ]
        await self._store.run(self.checkpoints.save, saved)
        self._since_checkpoint, self._checkpointed_at = 0, time.monotonic()


def rebuild(
    read: StoreRead,
    kinds: Iterable[type[Projection]] = PROJECTIONS,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[Projection]:
    """Fold the whole event store into fresh projections: what the live views must equal.
    `progress` is told the position reached after every page."""
    projections = [kind() for kind in kinds]
    fold(read, projections, 0, progress=progress)
    return projections


def as_of(
    read: StoreRead,
    checkpoints: CheckpointStore,
    when: datetime,
    kinds: Iterable[type[Projection]] = PROJECTIONS,
) -> list[Projection]:
    """Every projection as it stood at `when`: the fold of the store's events up to the first
    one stamped after `when`, starting from the latest checkpoint before it."""
    projections = [kind() for kind in kinds]
    for projection in projections:
        saved = checkpoints.before(projection.name, when)
        if saved is not None:
            projection.restore(saved.state)
    fold(read, projections, min(p.position for p in projections), until=when)
    return projections


def fold(
    read: StoreRead,
    projections: list[Projection],
    after: int,
    *,
    until: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Apply the store's events after position `after` to `projections`, stopping before the
    first event stamped after `until`. Each projection skips events it has already seen."""
    position = after
    while notes := read(position, READ_PAGE):
        for note in notes:
            event = envelope(note)
            if event is None:
                continue
            if until is not None and datetime.fromisoformat(event["event"]["timestamp"]) > until:
                return
            for projection in projections:
                projection.apply(event)
        position = notes[-1].id
        if progress is not None:
            progress(position)


@dataclass
class Verdict:
    """How a rebuilt projection compares with its live views."""

    projection: str
    equal: int = 0
    newer: int = 0  # keys the live view has changed since the rebuild's position
    mismatched: list[str] = field(default_factory=list)


def compare(rebuilt: Projection, live: Mapping[str, tuple[int, bytes | None]]) -> Verdict:
    """Every live view computed at or before the rebuild's position must equal the rebuilt one
    (a removed view must be absent from both); views changed later are counted, not compared."""
    verdict = Verdict(rebuilt.name)
    for key in sorted(rebuilt.views.keys() | live.keys()):
        position, payload = live.get(key, (0, None))
        if position > rebuilt.position:
            verdict.newer += 1
            continue
        expected = rebuilt.views.get(key)
        actual = None if payload is None else orjson.loads(payload)
        if expected == actual:
            verdict.equal += expected is not None
        elif actual is None:
            verdict.mismatched.append(f"{key}: missing from the live view")
        elif expected is None:
            verdict.mismatched.append(f"{key}: live view has a key the rebuild does not")
        else:
            fields = sorted(
                k for k in expected.keys() | actual.keys() if expected.get(k) != actual.get(k)
            )
            verdict.mismatched.append(f"{key}: differs in {', '.join(fields)}")
    return verdict
