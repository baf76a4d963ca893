"""The outbox relay: every stored event onto `WINGSMITH_EVENTS`, in store order, exactly once.

The stream itself is the relay's persisted position: each message carries its store position,
and the last message tells where to resume. Messages are appended with an expected last stream
sequence, so the stream is always a gap-free prefix of the store. Committed batches are handed
over in memory (no re-read of the store); the store is read only to resynchronise, to fill a gap
(another writer's events), when idle, and when more was handed over than it keeps waiting in
memory (`FED_LIMIT`: a stream that cannot keep up, or is down, costs no memory).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Protocol

import orjson

from wingsmith.adapters import tracing
from wingsmith.adapters.nats_bus import OutMessage, StreamTail
from wingsmith.adapters.store import Notification, StoreThread
from wingsmith.domain import subjects
from wingsmith.domain.base import split_id
from wingsmith.domain.receipt import CommandReceipt
from wingsmith.services.tasks import Backoff, supervise

log = logging.getLogger(__name__)

READ_LIMIT = 1000
PUBLISH_LIMIT = 1000
IDLE_POLL = 1.0
FED_LIMIT = 20_000  # records handed over and not published yet; beyond, read the store
# a server restarting, a refused batch: from the tail, soon (clients wait on the relay)
RESYNC = Backoff(first=0.25, cap=1.0, jitter=0.1)
MISMATCH_PAUSE = 5.0  # seconds between looks at a stream of another store


class StreamMismatch(Exception):
    """The stream's last event is not this store's event at that position."""


class StreamPublisher(Protocol):
    async def tail(self) -> StreamTail: ...

    async def publish(self, messages: list[OutMessage], after_seq: int) -> int: ...


@lru_cache(maxsize=512)
def event_type(topic: str) -> str:
    """`domain.deployment:DeploymentScaled` -> `DeploymentScaled`."""
    return topic.rpartition(":")[2].rpartition(".")[2]


def _head(n: Notification) -> dict[str, Any] | None:
    """What the stream says of a stored event besides its body; None for records that are not
    published (command receipts)."""
    kind, key = split_id(str(n.originator_id))
    if kind == CommandReceipt.kind:
        return None
    return {
        "position": n.id,
        "aggregate": kind,
        "aggregate_id": key,
        "version": n.originator_version,
        "type": event_type(n.topic),
    }


def to_message(n: Notification, trace: dict[str, str] | None = None) -> OutMessage | None:
    """The stream message for a stored event; its body embeds the stored bytes unchanged.
    `trace`: headers carrying the trace of the command that stored it."""
    head = _head(n)
    if head is None:
        return None
    return OutMessage(
        # ids are encoded as subject tokens (domain/subjects.py): a stored id that is not a
        # valid token (old history, a bug) must not stop the relay
        subject=subjects.event_subject(head["aggregate"], head["aggregate_id"], head["type"]),
        payload=orjson.dumps(head | {"event": orjson.Fragment(n.state)}),
        msg_id=subjects.event_msg_id(head["aggregate"], head["aggregate_id"], head["version"]),
        position=n.id,
        trace=trace,
    )


def _trace_of(n: Notification) -> dict[str, str] | None:
    """The `traceparent` of the command that stored the event, if this process traced it."""
    if not tracing.enabled():
        return None
    parent = tracing.of_command(orjson.loads(n.state).get("command_id"))
    return tracing.inject({}, parent) if parent is not None else None


def _relay_span(batch: list[OutMessage]) -> Any:
    """The span of one published batch: a child of its first traced event's command, linked to
    the others'."""
    contexts = (tracing.extract(m.trace) for m in batch) if tracing.enabled() else ()
    traced = [c for c in contexts if c is not None]
    parent = traced[0] if traced else None
    return tracing.span("relay batch", parent, traced[1:], events=len(batch))


class Relay:
    def __init__(self, store: StoreThread, publisher: StreamPublisher) -> None:
        self._store, self._publisher = store, publisher
        # handed every stored record once the stream has it, in order, including records the
        # stream took while an acknowledgement was lost (found on resynchronising)
        self.on_published: Callable[[list[Notification]], None] | None = None
        self._fed: list[Notification] = []
        self._wake = asyncio.Event()
        self.position = 0  # the last store position handled (published or skipped)
        self.seq = 0  # the stream's last sequence
        self.synced = asyncio.Event()
        self.mismatch: str | None = None  # why the relay refuses to publish, if it does
        self._fed_upto = 0
        self.fed_limit = FED_LIMIT

    def feed(self, notifications: list[Notification]) -> None:
        """Hand over a committed batch (called by the command service)."""
        if len(self._fed) + len(notifications) > self.fed_limit:
            self._fed = []  # the store has them: `_follow` reads them from there
        else:
            self._fed += notifications
        self._fed_upto = max(self._fed_upto, notifications[-1].id)
        self._wake.set()

    async def run(self) -> None:
        """Publish until cancelled; after a failure, resynchronise from the stream's tail."""
        await supervise("relay", self._sync_and_follow, RESYNC, on_failure=self._failed, logger=log)

    async def _sync_and_follow(self) -> None:
        await self._sync()
        await self._follow()

    def _failed(self, e: Exception) -> float | None:
        self.synced.clear()
        if not isinstance(e, StreamMismatch):
            return None
        self.mismatch = str(e)  # never publish onto a stream of another store
        log.error("relay: %s; not publishing until this is resolved", e)
        return MISMATCH_PAUSE

    async def _sync(self) -> None:
        """Resume from the stream's tail and publish everything stored after it."""
        tail = await self._publisher.tail()
        if tail.seq:
            await self._check_tail(tail)
        if self.on_published is not None and 0 < self.position < tail.position:
            await self._hand_over(tail.position)  # the stream took them; we never heard
        self.seq, self.position = tail.seq, tail.position
        self.mismatch = None
        while await self._catch_up():
            pass
        self.synced.set()

    async def _hand_over(self, upto: int) -> None:
        """Hand `on_published` what the stream holds up to `upto` beyond our position."""
        assert self.on_published is not None
        after = self.position
        while notes := await self._store.run(self._store.store.read, after, READ_LIMIT, upto):
            self.on_published(notes)
            after = notes[-1].id

    async def _check_tail(self, tail: StreamTail) -> None:
        stored = await self._store.run(self._store.store.read, tail.position - 1, 1, tail.position)
        expected = to_message(stored[0]) if stored else None
        # a stream published before ids were encoded may end in an event whose raw id had a
        # control character (whitespace never got onto it: its subject was refused)
        raw = f"{stored[0].originator_id}:{stored[0].originator_version}" if stored else ""
        if expected is None or tail.msg_id not in (expected.msg_id, raw):
            raise StreamMismatch(
                f"the stream's last event {tail.msg_id!r} (position {tail.position}) is not "
                f"this store's event at that position"
            )

    async def _catch_up(self, stop: int | None = None) -> bool:
        notes = await self._store.run(self._store.store.read, self.position, READ_LIMIT, stop)
        await self._publish(notes)
        return len(notes) == READ_LIMIT

    async def _follow(self) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                async with asyncio.timeout(IDLE_POLL):
                    await self._wake.wait()
            except TimeoutError:
                await self._catch_up()  # events another writer stored
                continue
            self._wake.clear()
            fed, self._fed = self._fed, []
            fresh = [n for n in fed if n.id > self.position]
            if fresh and all(n.id == self.position + 1 + i for i, n in enumerate(fresh)):
                await self._publish(fresh)
            elif self.position < self._fed_upto:
                # another writer's events lie in between, or what was handed over did not
                # fit in memory: the store has the order
                while await self._catch_up(stop=self._fed_upto):
                    pass

    async def _publish(self, notifications: list[Notification]) -> None:
        batch: list[OutMessage] = []
        handled: list[Notification] = []
        for n in notifications:
            handled.append(n)
            message = to_message(n, _trace_of(n))
            if message is not None:
                batch.append(message)
            if len(batch) == PUBLISH_LIMIT:
                await self._published(batch, handled)
                batch, handled = [], []
        if batch:
            await self._published(batch, handled)
        elif handled and self.on_published is not None:  # receipts only: nothing to send
            self.on_published(handled)
        if notifications:
            self.position = notifications[-1].id

    async def _published(self, batch: list[OutMessage], handled: list[Notification]) -> None:
        with _relay_span(batch):
            self.seq = await self._publisher.publish(batch, self.seq)
        if self.on_published is not None:
            self.on_published(handled)

    async def idle(self) -> None:
        """Wait until everything fed so far is on the stream (for shutdown and tests)."""
        while self.mismatch is None and (  # noqa: ASYNC110 - three conditions set in many places
            self.position < self._fed_upto or not self.synced.is_set()
        ):
            await asyncio.sleep(0.01)
