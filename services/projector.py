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
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any, Protocol

import orjson

from adapters.checkpoints import Checkpoint, CheckpointStore
from adapters.nats_bus import StreamMessage
from adapters.store import StoreThread
from projections.base import Projection
from projections.fleet import PROJECTIONS
from services.relay import envelope

log = logging.getLogger(__name__)

CHECKPOINT_EVENTS = 20_000
CHECKPOINT_SECONDS = 10.0
READ_PAGE = 5_000


class ViewSink(Protocol):
    async def publish(
        self, projection: str, key: str, view: bytes | None, position: int
    ) -> None: ...

    async def flush(self, timeout: float = ...) -> None: ...


Source = Callable[[int], AsyncIterator[list[StreamMessage]]]


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
        """Fold a batch, then publish each view it changed once, as the batch left it: under
        load, changes within one batch are coalesced; an idle stream gives batches of one."""
        changed: dict[tuple[int, str], int] = {}
        for message in batch:
            event = orjson.loads(message.data)
            for i, projection in enumerate(self.projections):
                for key in projection.apply(event):
                    changed[(i, key)] = event["position"]
            self.seq = message.seq
            self._event_time = datetime.fromisoformat(event["event"]["timestamp"])
        for (i, key), position in changed.items():
            projection = self.projections[i]
            view = projection.view(key)
            payload = None if view is None else orjson.dumps(view)
            await self._sink.publish(projection.name, key, payload, position)
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
    store_read: Callable[[int, int], list[Any]], kinds: Iterable[type[Projection]] = PROJECTIONS
) -> list[Projection]:
    """Fold the whole event store into fresh projections: what the live views must equal."""
    projections = [kind() for kind in kinds]
    position = 0
    while notes := store_read(position, READ_PAGE):
        for note in notes:
            event = envelope(note)
            if event is not None:
                for projection in projections:
                    projection.apply(event)
        position = notes[-1].id
    return projections
