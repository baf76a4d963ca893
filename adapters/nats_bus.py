"""NATS: the connection, the JetStream streams of the public contract, command intake and the
event publisher the relay uses."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import nats.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError
from nats.nuid import NUID

log = logging.getLogger(__name__)

Connection = Client
NatsError = nats.errors.Error  # what the command line reports without a traceback
__all__ = ["Connection", "NatsError", "Subscription"]  # re-exported for the wiring

EVENTS_STREAM = "WINGSMITH_EVENTS"
VIEWS_STREAM = "WINGSMITH_PROJ"
VIEWS_PREFIX = "wingsmith.proj"
RENDER_STREAM = "WINGSMITH_RENDER"
RENDER_PREFIX = "wingsmith.render"
OBS_STREAM = "WINGSMITH_OBS"
OBS_PREFIX = "wingsmith.obs"
POSITION_HEADER = "Wingsmith-Position"

STREAMS = [
    StreamConfig(
        name=EVENTS_STREAM,
        subjects=["wingsmith.evt.>"],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        duplicate_window=120.0,
        description="Domain events, in event-store order, each exactly once",
    ),
    StreamConfig(
        name=RENDER_STREAM,
        subjects=["wingsmith.render.>"],
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        description="Desired state per deployment: the latest value per subject",
    ),
    StreamConfig(
        name=OBS_STREAM,
        subjects=[f"{OBS_PREFIX}.>"],
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=7 * 24 * 3600.0,
        description="Observations from cluster operators",
    ),
    StreamConfig(
        name=VIEWS_STREAM,
        subjects=["wingsmith.proj.>"],
        storage=StorageType.FILE,
        description="Projection updates",
    ),
]


async def connect(url: str, name: str) -> Client:
    """A connection that keeps reconnecting for as long as the process runs."""
    nc = Client()

    async def on_error(e: Exception) -> None:
        log.warning("nats: %s", e)

    async def on_disconnect() -> None:
        if not nc.is_closed:
            log.warning("nats: disconnected from %s", url)

    async def on_reconnect() -> None:
        log.info("nats: reconnected to %s", url)

    await nc.connect(
        servers=[u.strip() for u in url.split(",")],  # a cluster: several comma-separated URLs
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,  # type: ignore[arg-type]  # a float is fine at run time
        connect_timeout=5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        pending_size=64 * 1024 * 1024,
    )
    return nc


async def ensure_streams(nc: Client, replicas: int = 1) -> None:
    """Create the contract's streams, or bring existing ones to this configuration."""
    js = nc.jetstream()
    for config in STREAMS:
        config = dataclasses.replace(config, num_replicas=replicas)
        try:
            await js.add_stream(config)
        except BadRequestError:  # exists with another config: bring it to ours
            await js.update_stream(config)


class NatsPublisher:
    """Core NATS publish, for replies."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc

    async def publish(self, subject: str, payload: bytes) -> None:
        await self._nc.publish(subject, payload)


async def subscribe_commands(
    nc: Client, handle: Callable[[str, bytes, str | None], Awaitable[None]]
) -> Subscription:
    """All hubs share one queue group, so each command reaches one of them."""

    async def on_message(msg: Msg) -> None:
        await handle(msg.subject, msg.data, msg.reply or None)

    subscription = await nc.subscribe(
        "wingsmith.cmd.>", queue="wingsmith-hub", cb=on_message, pending_msgs_limit=1_000_000
    )
    await nc.flush()  # the server knows the subscription before anyone is told the hub is up
    return subscription


class PublishFailed(Exception):
    """The stream did not take a batch as a whole, in order; resynchronise from its tail."""


class StreamTail(NamedTuple):
    seq: int  # the stream's last sequence
    position: int  # the store position of the event at that sequence
    msg_id: str  # its Nats-Msg-Id


@dataclass(frozen=True, slots=True)
class OutMessage:
    subject: str
    payload: bytes
    msg_id: str
    position: int


class EventPublisher:
    """Publishes batches to a stream, pipelined, each message naming the stream sequence that
    must precede it. The chain makes one acknowledgement per batch enough: if any message is not
    stored, every later one is refused, so the last one's ack proves the whole batch landed, and
    the stream always holds a gap-free prefix of what was sent."""

    def __init__(self, nc: Client, stream: str = EVENTS_STREAM, ack_timeout: float = 3.0):
        self._nc, self._js = nc, nc.jetstream()
        self.stream, self.ack_timeout = stream, ack_timeout
        self._inbox = f"_WS_RELAY.{NUID().next().decode()}"
        self._batches = itertools.count()
        self._waiting: tuple[str, int, asyncio.Future[None]] | None = None
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_ack)

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def tail(self) -> StreamTail:
        info = await self._js.stream_info(self.stream)
        last = info.state.last_seq
        if not last:
            return StreamTail(0, 0, "")
        msg = await self._js.get_msg(self.stream, seq=last)
        headers = msg.headers or {}
        position = headers.get(POSITION_HEADER, "")
        return StreamTail(
            last, int(position) if position.isdigit() else 0, headers.get("Nats-Msg-Id", "")
        )

    async def publish(self, messages: list[OutMessage], after_seq: int) -> int:
        """Append `messages` right after stream sequence `after_seq`; returns the new last
        sequence once the stream has them all, or raises `PublishFailed`."""
        last_seq = after_seq + len(messages)
        reply = f"{self._inbox}.{next(self._batches)}"
        done = asyncio.get_running_loop().create_future()
        self._waiting = (reply, last_seq, done)
        for i, m in enumerate(messages):
            headers = {
                "Nats-Msg-Id": m.msg_id,
                "Nats-Expected-Last-Sequence": str(after_seq + i),
                POSITION_HEADER: str(m.position),
            }
            is_last = i == len(messages) - 1
            await self._nc.publish(
                m.subject, m.payload, reply=reply if is_last else "", headers=headers
            )
        try:
            async with asyncio.timeout(self.ack_timeout):
                await done
        except TimeoutError:
            raise PublishFailed(f"no acknowledgement within {self.ack_timeout}s") from None
        finally:
            self._waiting = None
        return last_seq

    async def _on_ack(self, msg: Msg) -> None:
        if self._waiting is None or msg.subject != self._waiting[0]:
            return  # the acknowledgement of an abandoned batch
        _, last_seq, done = self._waiting
        ack: dict[str, Any] = orjson.loads(msg.data)
        if done.done():
            return
        if "error" in ack or ack.get("duplicate") or ack.get("seq") != last_seq:
            done.set_exception(PublishFailed(f"stream refused the batch: {ack}"))
        else:
            done.set_result(None)


async def request(nc: Client, subject: str, payload: bytes, timeout: float) -> bytes:
    """Request/reply that waits out a hub that is starting (no responders yet) until `timeout`;
    resending is safe because every command carries its command_id."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            msg = await nc.request(subject, payload, timeout=max(deadline - loop.time(), 0.1))
            return bytes(msg.data)
        except nats.errors.NoRespondersError:
            if loop.time() + 0.2 > deadline:
                raise TimeoutError(
                    f"no hub answers on {subject}; is `wingsmith up` running?"
                ) from None
            await asyncio.sleep(0.2)
        except nats.errors.TimeoutError:
            raise TimeoutError(f"no reply on {subject} within {timeout}s") from None


@dataclass(frozen=True, slots=True)
class StreamMessage:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: datetime


Start = int | datetime | Literal["new", "last"]
"""Where reading starts: a stream sequence, a time, only messages published from now on
(`new`), or the last message of each subject and everything after it (`last`)."""


def _message(msg: Msg) -> StreamMessage:
    meta = msg.metadata
    return StreamMessage(
        meta.sequence.stream, msg.subject, bytes(msg.data), dict(msg.headers or {}), meta.timestamp
    )


async def _ordered(
    nc: Client, stream: str, subject: str, start: Start
) -> tuple[Subscription, asyncio.Queue[Msg], Callable[[StreamMessage], bool]]:
    """An ordered consumer feeding our own queue, and a test for messages before `start`.

    The consumer recreates itself after a gap or a lost connection, from the sequence after the
    last message it delivered, so nothing is skipped. Before it has delivered anything it would
    start again from the stream's first message: the test drops what lies before `start`.
    (Our own queue rather than next_msg: nats-py waits with asyncio.wait_for, which on 3.11 can
    swallow the cancellation that stops a reader.)"""
    js = nc.jetstream()
    if start == "new":
        start = (await js.stream_info(stream)).state.last_seq + 1
    if start == "last":
        config = ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
    elif isinstance(start, datetime):
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start)
    else:
        first = max(int(start), 1)
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first)
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_message(msg: Msg) -> None:
        arrived.put_nowait(msg)

    sub = await js.subscribe(
        subject,
        stream=stream,
        cb=on_message,
        ordered_consumer=True,
        idle_heartbeat=2.0,
        config=config,
        pending_msgs_limit=100_000,
    )

    def early(m: StreamMessage) -> bool:
        if isinstance(start, datetime):
            return m.time < start
        return isinstance(start, int) and m.seq < start

    return sub, arrived, early


async def read_stream(
    nc: Client, stream: str, subject: str, *, follow: bool, start: Start = 1
) -> AsyncIterator[StreamMessage]:
    """Messages of `stream` matching `subject` from `start`; without `follow` it ends once it
    has caught up with the stream."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    if not follow and info.state.messages == 0:
        return
    sub, arrived, early = await _ordered(nc, stream, subject, start)
    try:
        while True:
            try:
                async with asyncio.timeout(None if follow else 1.0):
                    msg = await arrived.get()
            except TimeoutError:
                return  # nothing (more) matches
            message = _message(msg)
            if not early(message):
                yield message
            if not follow and msg.metadata.num_pending == 0:
                return
    finally:
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await sub.unsubscribe()


async def event_batches(
    nc: Client, after_seq: int, limit: int = 1000
) -> AsyncIterator[list[StreamMessage]]:
    """WINGSMITH_EVENTS from after `after_seq`, forever, in batches of what has arrived."""
    sub, arrived, early = await _ordered(nc, EVENTS_STREAM, "wingsmith.evt.>", after_seq + 1)
    try:
        while True:
            batch = [await arrived.get()]
            while not arrived.empty() and len(batch) < limit:
                batch.append(arrived.get_nowait())
            messages = [m for m in map(_message, batch) if not early(m)]
            if messages:
                yield messages
    finally:
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await sub.unsubscribe()


PROGRESS_BUCKET = "wingsmith_projector"
DELETED_HEADER = "Wingsmith-Deleted"


def view_bucket(projection: str) -> str:
    return f"wingsmith_{projection}"


def view_stream(projection: str) -> tuple[str, str]:
    """The stream a projection's changes go to, and their subject prefix: render commands go
    to the operators' stream, every other view to the projection stream."""
    if projection == "render":
        return RENDER_STREAM, RENDER_PREFIX
    return VIEWS_STREAM, f"{VIEWS_PREFIX}.{projection}"


class ViewPublisher:
    """Publishes every view change on `wingsmith.proj.<projection>.<key>` (stream WINGSMITH_PROJ),
    keeps the latest value per key in the KV bucket `wingsmith_<projection>`, and the projector's
    progress in the bucket `wingsmith_projector`. Pipelined: call `flush` to wait for every
    acknowledgement. Each message carries the store position of the event behind it."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._js = nc.jetstream(publish_async_max_pending=20_000)

    async def start(self, projections: list[str], replicas: int = 1) -> None:
        for bucket in [*map(view_bucket, projections), PROGRESS_BUCKET]:
            await self._js.create_key_value(
                KeyValueConfig(bucket=bucket, history=1, replicas=replicas)
            )

    async def change(self, projection: str, key: str, view: bytes | None, position: int) -> None:
        """One change of one view, on the projection stream (the render stream for `render`);
        None: the view was removed."""
        headers = {"Nats-Msg-Id": f"{projection}:{key}:{position}", POSITION_HEADER: str(position)}
        if view is None:
            headers[DELETED_HEADER] = "true"
        _, prefix = view_stream(projection)
        await self._js.publish_async(f"{prefix}.{key}", view or b"", headers=headers)

    async def latest(self, projection: str, key: str, view: bytes | None, position: int) -> None:
        """The view's value now, in its KV bucket."""
        headers = {"Nats-Msg-Id": f"{projection}:{key}:{position}", POSITION_HEADER: str(position)}
        if view is None:
            headers["KV-Operation"] = "DEL"
        await self._js.publish_async(
            f"$KV.{view_bucket(projection)}.{key}", view or b"", headers=headers
        )

    async def progress(self, progress: dict[str, Any]) -> None:
        await self._js.publish_async(f"$KV.{PROGRESS_BUCKET}.position", orjson.dumps(progress))

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait for every acknowledgement. Acks lost to a server restart never come: after a
        timeout, start a fresh context (nats-py would wait on the lost ones forever)."""
        try:
            async with asyncio.timeout(timeout):
                await self._js.publish_async_completed()
        except TimeoutError:
            self._js = self._nc.jetstream(publish_async_max_pending=20_000)
            raise


async def latest_views(nc: Client, projection: str) -> dict[str, tuple[int, bytes | None]]:
    """Every key's latest value in a projection's KV bucket, with the store position it was
    computed at; None for a removed view."""
    bucket = view_bucket(projection)
    views: dict[str, tuple[int, bytes | None]] = {}
    try:
        stream = read_stream(nc, f"KV_{bucket}", f"$KV.{bucket}.>", follow=False, start="last")
        messages = [m async for m in stream]
    except NotFoundError:  # no projector has run yet
        return views
    for m in messages:
        key = m.subject.removeprefix(f"$KV.{bucket}.")
        deleted = m.headers.get("KV-Operation") in {"DEL", "PURGE"}
        views[key] = (int(m.headers.get(POSITION_HEADER, 0)), None if deleted else m.data)
    return views


async def projector_progress(nc: Client) -> dict[str, Any] | None:
    """What the projector last reported: store position, stream sequence, event time."""
    try:
        kv = await nc.jetstream().key_value(PROGRESS_BUCKET)
        entry = await kv.get("position")
    except NotFoundError:  # no projector has run yet
        return None
    return orjson.loads(entry.value) if entry.value else None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One observation handed to the hub, to settle once it has been handled."""

    subject: str
    data: bytes
    msg_id: str  # the operator's Nats-Msg-Id, else `<stream>:<sequence>`
    _msg: Msg

    async def ack(self) -> None:
        await self._msg.ack()

    async def retry(self, delay: float = 1.0) -> None:
        await self._msg.nak(delay=delay)

    async def reject(self) -> None:
        """Never deliver again: it can never be handled."""
        await self._msg.term()


async def observation_batches(
    nc: Client, durable: str = "wingsmith-hub", batch: int = 512
) -> AsyncIterator[list[Delivery]]:
    """Observations from every cluster, through a durable consumer: a hub that was down
    resumes after the last one it acknowledged, within the stream's seven days."""
    js = nc.jetstream()
    config = ConsumerConfig(ack_wait=30.0, max_ack_pending=20_000, max_deliver=-1)
    sub = await js.pull_subscribe(f"{OBS_PREFIX}.>", durable, stream=OBS_STREAM, config=config)
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=1.0)
            except TimeoutError:  # nothing new (nats-py raises its own or asyncio's)
                continue
            yield [
                Delivery(
                    m.subject,
                    bytes(m.data),
                    (m.headers or {}).get("Nats-Msg-Id")
                    or f"{OBS_STREAM}:{m.metadata.sequence.stream}",
                    m,
                )
                for m in msgs
            ]
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def publish_observation(
    nc: Client, cluster_id: str, kind: str, payload: dict[str, Any], msg_id: str
) -> None:
    """What an operator reports, on `wingsmith.obs.<cluster>.<kind>`; `msg_id` makes a resend
    harmless."""
    await nc.jetstream().publish(
        f"{OBS_PREFIX}.{cluster_id}.{kind}",
        orjson.dumps(payload),
        stream=OBS_STREAM,
        headers={"Nats-Msg-Id": msg_id},
    )
