"""The projector: keeps every projection current from WINGSMITH_EVENTS, publishes each view
change, and checkpoints all projections together.

A checkpoint holds each projection's state with the store position and the stream sequence it
reached, written in one transaction: every `checkpoint_every` seconds while events arrive, and
once more when they stop (an idle projector keeps nothing unsaved for long). On start the
projector restores the latest checkpoint and reads the stream from the sequence after it, so
every event is applied exactly once to the state that is kept; the fold also skips any event at
or below the position it has reached, so a message delivered twice changes nothing. The changes
it folds again after a crash were perhaps published already: the sink learns where its streams
end on every (re)start and does not publish them twice, however long ago that was. Rebuilding
from zero, and answering as of a past time, read the event store instead of the stream and must
reach the same views.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

import orjson

from wingsmith.adapters import tracing
from wingsmith.adapters.checkpoints import Checkpoint, CheckpointStore
from wingsmith.adapters.dead_letters import Component, DeadLetters
from wingsmith.adapters.nats_bus import POSITION_HEADER, OutMessage, StreamMessage, Unpublishable
from wingsmith.adapters.store import Notification, StoreThread
from wingsmith.domain.subjects import key_subject
from wingsmith.projections.base import Fold, Keys, Projection, failure
from wingsmith.projections.fleet import PROJECTIONS
from wingsmith.services.hub.relay import event_type, to_message
from wingsmith.services.tasks import supervise

log = logging.getLogger(__name__)

CHECKPOINT_EVENTS = 20_000
CHECKPOINT_SECONDS = 10.0
READ_PAGE = 5_000


def envelope_problem(event: Any) -> str | None:
    """What keeps a stream message from being folded as an event, if anything."""
    if not isinstance(event, dict):
        return "the message is not a JSON object"
    for name, kind in (("position", int), ("type", str), ("aggregate_id", str), ("event", dict)):
        if not isinstance(event.get(name), kind) or isinstance(event.get(name), bool):
            return f"{name}: missing or not {kind.__name__}"
    stamp = event["event"].get("timestamp")
    try:
        when = datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        return f"event.timestamp: not a time with its zone: {stamp!r}"
    return None


class ViewSink(Protocol):
    async def resume(self) -> None:
        """Learn what the streams already hold: changes up to there are not published again."""

    async def change(
        self, projection: str, key: str, view: bytes | None, position: int, *, again: int = 0
    ) -> None:
        """Publish one change of one view (None: removed); `again`: the view republished
        whole by that version of its projection, under an id of its own."""

    async def latest(
        self, projection: str, key: str, view: bytes | None, position: int, *, again: int = 0
    ) -> None:
        """Keep a view's latest value."""

    def published(self, projection: str) -> int:
        """The store position of the last change the projection's stream held at `resume`
        (0: none)."""

    def streams(self) -> str:
        """Which streams the views go to, as learnt at `resume`; a checkpoint records it."""

    async def progress(self, progress: dict[str, Any]) -> None:
        """Report how far the projector has got."""

    async def flush(self, timeout: float = ...) -> None: ...


Source = Callable[[int], AsyncIterator[list[StreamMessage]]]
StoreRead = Callable[[int, int], list[Notification]]
# a stored topic's handlers and where its ids' keys start; None: no projection folds it
Routed = tuple[list[Callable[[str, Any], Keys]], int] | None


class Projector:
    def __init__(
        self,
        store: StoreThread,
        checkpoints: CheckpointStore,
        source: Source,
        sink: ViewSink,
        kinds: Iterable[type[Projection]] = PROJECTIONS,
        dead_letters: DeadLetters | None = None,
        *,
        checkpoint_every: float = CHECKPOINT_SECONDS,
    ) -> None:
        self._store, self.checkpoints = store, checkpoints
        self.checkpoint_every = checkpoint_every
        self._source, self._sink = source, sink
        self._kinds = list(kinds)
        self.fold = Fold(kind() for kind in self._kinds)
        self.seq = 0  # the last stream sequence applied
        self._event_time: datetime | None = None
        self._since_checkpoint = 0
        self._checkpointed_at = time.monotonic()
        self._busy: asyncio.Future[None] | None = None
        # projections folded again from zero for want of a checkpoint of their version: their
        # views go out whole once the fold has passed what the streams hold
        self._stale: list[Projection] = []
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters(None)

    async def run(self) -> None:
        """Follow the stream until cancelled; a batch being applied is never cut in half. After
        a failure (a server restart losing acknowledgements), start again from the checkpoint:
        the changes folded again are published only where the streams do not hold them yet."""
        await supervise("projector", self._follow, on_failure=self._failed, logger=log)

    async def _follow(self) -> None:
        while True:  # the source never ends but by failing; should it, resume at once
            await self._restore()
            batches = _with_pauses(self._source(self.seq), self.checkpoint_every)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    self._busy = asyncio.ensure_future(self._step(batch))
                    await asyncio.shield(self._busy)

    def _failed(self, _: Exception) -> None:
        """Resume from the checkpoint: what was folded may be unpublished, so it is never
        checkpointed."""
        self._event_time = None

    async def close(self) -> None:
        """After `run` is cancelled: finish the batch in hand and checkpoint."""
        if self._busy is not None:
            await asyncio.gather(self._busy, return_exceptions=True)
        await self.checkpoint()

    async def _step(self, batch: list[StreamMessage]) -> None:
        if batch:  # an empty batch: nothing arrived for a while
            if batch[0].seq > self.seq + 1:
                await self._fill_gap(batch[0])
            await self._apply(batch)
            if self._stale:
                await self._republish()
        if self._due():
            await self.checkpoint()

    async def _republish(self) -> None:
        """Every view of a projection folded again from zero for want of a checkpoint of its
        version, once the fold has passed the last change the streams held: its changes up to
        there were not sent again (the streams held changes at those positions), so readers
        still have the views as the previous version made them. A projection whose stream held
        nothing has nothing to replace."""
        position, stale = self.fold.position, []
        for projection in self._stale:
            published = self._sink.published(projection.name)
            if not published:
                continue  # nothing to replace
            if position < published:
                stale.append(projection)  # not there yet
                continue
            again = projection.version
            for key, view in list(projection.views.items()):
                try:
                    payload = orjson.dumps(view)
                    await self._sink.change(projection.name, key, payload, position, again=again)
                    await self._sink.latest(projection.name, key, payload, position, again=again)
                except (TypeError, Unpublishable) as e:
                    log.warning("projector: %s %r not republished: %s", projection.name, key, e)
            log.info("projector: %s republished at %d", projection.name, position)
        await self._sink.flush()
        self._stale = stale

    async def _restore(self) -> None:
        """The latest checkpoint, or zero when any projection has none of its version (a new
        one, or one whose views changed shape): all projections are checkpointed together and
        move together."""
        self.fold = Fold(kind() for kind in self._kinds)
        self.seq, self._event_time, self._busy = 0, None, None
        self._since_checkpoint = 0
        await self._sink.resume()
        saved = [
            await self._store.run(self.checkpoints.latest, p.name) for p in self.fold.projections
        ]
        if any(c is not None and not self._published_here(c) for c in saved):
            saved = [None] * len(saved)  # fold from zero: every view goes out again
        # With no checkpoint at all (a first start, or none taken before a crash) the streams
        # hold what this fold publishes again: nothing to replace.
        checkpointed = any(c is not None for c in saved)
        self._stale = [
            p
            for p, c in zip(self.fold.projections, saved, strict=True)
            if checkpointed and not _resumes(p, c)
        ]
        if self._stale or len({c.position for c in saved if c}) != 1:
            return
        for projection, checkpoint in zip(self.fold.projections, saved, strict=True):
            assert checkpoint is not None
            projection.restore(checkpoint.state)
        any_one = saved[0]
        assert any_one is not None  # written together: position, sequence and time are shared
        self.fold.position, self.seq = any_one.position, any_one.stream_seq
        self._event_time = any_one.event_time

    def _published_here(self, checkpoint: Checkpoint) -> bool:
        """Whether the checkpoint's views went to the streams the sink has now (unknown for
        checkpoints that did not record it: taken to be). A store restored beside new streams
        holds checkpoints of streams that are gone: resuming from one would leave the views
        that did not change since missing from the new streams."""
        here = self._sink.streams()
        if not checkpoint.streams or checkpoint.streams == here:
            return True
        log.warning(
            "projector: the checkpoint at position %d was taken while publishing to other "
            "streams (%s, now %s); folding every event again to publish every view",
            checkpoint.position,
            checkpoint.streams,
            here,
        )
        return False

    async def _apply(self, batch: list[StreamMessage]) -> None:
        """Fold a batch: every view change goes on the projection stream as it happens; the
        latest value of each view changed, and the projector's progress, once per batch. The
        progress follows the changes' acknowledgements, so a reader that sees it can count on
        every change up to it being in the projection stream (they are separate streams).
        What cannot be folded or published is set aside, and the rest goes on."""
        latest: dict[tuple[str, str], tuple[bytes | None, int]] = {}
        for message in batch:
            event = await self._envelope(message)
            if event is None:
                continue
            position = event["position"]
            for projection, key in self.fold.apply_envelope(event):
                with tracing.continued(message.headers):  # a render object carries it on
                    view = await self._publish_change(message, projection, key, position)
                if view is not False:
                    latest[(projection.name, str(key))] = (view, position)
            for name, reason in self.fold.take_failures():
                await self._set_aside(message, f"{name}: {reason}", name)
        self.seq = batch[-1].seq
        for (name, key), (payload, position) in latest.items():
            try:
                await self._sink.latest(name, key, payload, position)
            except Unpublishable as e:  # its change fitted, its KV entry (a few bytes more) not
                reason = f"{name} {key!r}: KV entry: {e}"
                await self.dead_letters.set_aside(Component.PROJECTOR, reason, name, payload or b"")
        await self._sink.flush()  # the changes are stored before the progress that covers them
        if self._event_time is not None:  # else nothing was folded yet: no progress to tell
            await self._sink.progress(
                {
                    "position": self.fold.position,
                    "stream_seq": self.seq,
                    "event_time": self._event_time.isoformat(),
                }
            )
        self._since_checkpoint += len(batch)

    async def _fill_gap(self, first: StreamMessage) -> None:
        """The stream no longer holds the events between the last one applied and `first`: its
        size limit discarded them while the projector was away. The stream is a gap-free
        prefix of the store, so they are the store's events up to `first`'s: fold those, and
        publish their changes, as if they had come from the stream."""
        try:
            upto = int(orjson.loads(first.data)["position"]) - 1
        except (orjson.JSONDecodeError, LookupError, TypeError, ValueError):
            return  # not an event: it cannot say where the gap ends, and `_apply` sets it aside
        log.warning(
            "projector: stream sequences %d to %d are gone from the stream; reading positions "
            "%d to %d from the store",
            self.seq + 1,
            first.seq - 1,
            self.fold.position + 1,
            upto,
        )
        while self.fold.position < upto:
            notes = await self._store.run(
                self._store.store.read, self.fold.position, READ_PAGE, upto
            )
            if not notes:
                break
            stand_ins = [
                StreamMessage(first.seq - 1, m.subject, m.payload, _headers(m), first.time)
                for m in map(to_message, notes)
                if m is not None
            ]
            if stand_ins:
                await self._apply(stand_ins)
            self.fold.position = max(self.fold.position, notes[-1].id)
        self.seq = first.seq - 1

    async def _envelope(self, message: StreamMessage) -> dict[str, Any] | None:
        """The message's event in the stream's shape, with its time taken as the projector's;
        None (the message set aside) when it is not one."""
        try:
            event = orjson.loads(message.data)
            problem = envelope_problem(event)
        except orjson.JSONDecodeError as e:
            problem = f"not JSON: {e}"
        if problem is not None:
            await self._set_aside(message, f"not an event: {problem}")
            return None
        self._event_time = datetime.fromisoformat(event["event"]["timestamp"])
        return dict(event)

    async def _publish_change(
        self, message: StreamMessage, projection: Projection, key: str, position: int
    ) -> bytes | Literal[False] | None:
        """Publish one view change; the view as published, or False when it was set aside."""
        try:
            view = projection.view(key)
            payload = None if view is None else orjson.dumps(view)
            # str(): a key made from a field of the wrong type (old history) is still a key
            await self._sink.change(projection.name, str(key), payload, position)
        except (TypeError, Unpublishable) as e:  # orjson's JSONEncodeError is a TypeError
            await self._set_aside(message, f"{projection.name} {key!r}: {failure(e)}", str(key))
            return False
        return payload

    async def _set_aside(self, message: StreamMessage, reason: str, part: str = "") -> None:
        # the event's own id where it has one: stand-ins read from the store share a sequence
        event_id = message.headers.get("Nats-Msg-Id") or str(message.seq)
        msg_id = f"{event_id}:{key_subject(part)}" if part else event_id
        await self.dead_letters.set_aside(
            Component.PROJECTOR, reason, message.subject, message.data, message.headers, msg_id
        )

    def _due(self) -> bool:
        if self._stale:  # a checkpoint now would let a crash skip the republishing
            return False
        if self._since_checkpoint >= CHECKPOINT_EVENTS:
            return True
        stale = time.monotonic() - self._checkpointed_at >= self.checkpoint_every
        return stale and self._since_checkpoint > 0

    async def checkpoint(self) -> None:
        if self._event_time is None or self._stale:
            return
        position, streams = self.fold.position, self._sink.streams()
        saved = [
            Checkpoint(p.name, position, self.seq, self._event_time, p.state(), streams)
            for p in self.fold.projections
        ]
        await self._store.run(self.checkpoints.save, saved)
        self._since_checkpoint, self._checkpointed_at = 0, time.monotonic()


async def _with_pauses(
    batches: AsyncIterator[list[StreamMessage]], pause: float
) -> AsyncGenerator[list[StreamMessage], None]:
    """The batches, and an empty one after each `pause` seconds in which none arrived. The
    pending read is never cancelled: cancelling it would end the source."""
    pending: asyncio.Future[list[StreamMessage]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(batches))
            done, _ = await asyncio.wait([pending], timeout=pause)
            if not done:
                yield []
                continue
            try:
                batch = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield batch
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        close = getattr(batches, "aclose", None)
        if close is not None:
            await close()


def rebuild(
    read: StoreRead,
    kinds: Iterable[type[Projection]] = PROJECTIONS,
    *,
    progress: Callable[[int], None] | None = None,
) -> Fold:
    """Fold the whole event store into fresh projections: what the live views must equal.
    `progress` is told the position reached after every page."""
    target = Fold(kind() for kind in kinds)
    fold(read, target, progress=progress)
    return target


def as_of(
    read: StoreRead,
    checkpoints: CheckpointStore,
    when: datetime,
    kinds: Iterable[type[Projection]] = PROJECTIONS,
) -> list[Projection]:
    """Every projection as it stood at `when`: the fold of the store's events up to the first
    one stamped after `when`, starting from the latest checkpoint before it."""
    starts: dict[int, list[Projection]] = {}  # position -> projections starting there
    projections = []
    for kind in kinds:
        projection = kind()
        saved = checkpoints.before(kind.name, when)
        if not _resumes(projection, saved):  # none, or of a version before this one's
            saved = None
        if saved is not None:
            projection.restore(saved.state)
        starts.setdefault(saved.position if saved else 0, []).append(projection)
        projections.append(projection)
    for position, group in starts.items():  # checkpoints are taken together: normally one
        fold(read, Fold(group, position), until=when)
    return projections


def _resumes(projection: Projection, checkpoint: Checkpoint | None) -> bool:
    """Whether the projection can resume from the checkpoint: there is one, of its version."""
    return checkpoint is not None and projection.restores(checkpoint.state)


def fold(
    read: StoreRead,
    target: Fold,
    *,
    until: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Apply the store's events after `target`'s position, stopping before the first event
    stamped after `until`. The hot loop of a rebuild: per stored topic it learns once which
    handlers fold it and where the aggregate id starts, and events no projection folds (and
    command receipts) are not even decoded."""
    with _cycle_collection_paused():
        _fold(read, target, until, progress)


@contextlib.contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """Folds make no reference cycles, yet they allocate so much (every event's body) that the
    cyclic collector would run every few hundred events and walk the whole state the fold
    keeps, again and again: a fifth of a rebuild. Reference counting frees all a fold drops;
    the collector runs again afterwards (if it ran before)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _fold(
    read: StoreRead,
    target: Fold,
    until: datetime | None,
    progress: Callable[[int], None] | None,
) -> None:
    topics: dict[str, Routed] = {}
    while notes := read(target.position, READ_PAGE):
        applied = 0  # the last event of the page some projection folded
        for note in notes:
            try:
                known = topics[note.topic]
            except KeyError:
                known = topics[note.topic] = _route(target, note)
            if known is None:
                continue
            event = orjson.loads(note.state)
            if not isinstance(event, dict):  # the live projector sets it aside: skip it too
                continue
            if until is not None and datetime.fromisoformat(event["timestamp"]) > until:
                if applied:
                    target.position = target.last_applied = applied
                return
            handlers, cut = known
            aggregate_id = note.originator_id[cut:]  # type: ignore[index]  # ids are text
            for handler in handlers:
                try:
                    handler(aggregate_id, event)
                except Exception:  # skipped as the live projector skips it (Fold.apply)
                    log.debug("rebuild: a handler could not fold %s", note.id, exc_info=True)
            applied = note.id
        if applied:
            target.last_applied = applied
        target.position = notes[-1].id
        if progress is not None:
            progress(target.position)


def _route(target: Fold, note: Notification) -> Routed:
    route = target.routes.get(event_type(note.topic))
    cut = str(note.originator_id).index(":") + 1
    bound = [handler.__get__(p) for p, handler in route or ()]
    return (bound, cut) if bound else None


@dataclass
class Verdict:
    """How a rebuilt projection compares with its live views."""

    projection: str
    equal: int = 0
    newer: int = 0  # keys the live view has changed since the rebuild's position
    mismatched: list[str] = field(default_factory=list)


def compare(
    rebuilt: Projection, upto: int, live: Mapping[str, tuple[int, bytes | None]]
) -> Verdict:
    """Every live view computed at or before `upto`, the rebuild's position, must equal the
    rebuilt one (a removed view must be absent from both); views changed later are counted, not
    compared."""
    verdict = Verdict(rebuilt.name)
    for key in sorted(rebuilt.views.keys() | live.keys()):
        position, payload = live.get(key, (0, None))
        if position > upto:
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


def _headers(message: OutMessage) -> dict[str, str]:
    """The headers the relay gives a message on the stream (its id and store position)."""
    return {"Nats-Msg-Id": message.msg_id, POSITION_HEADER: str(message.position)}
