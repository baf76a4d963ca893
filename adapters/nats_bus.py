"""NATS: the connection, the JetStream streams of the public contract, command intake and the
event publisher the relay uses."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

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
from nats.js.errors import BadRequestError
from nats.nuid import NUID

log = logging.getLogger(__name__)

Connection = Client
__all__ = ["Connection", "Subscription"]  # re-exported for the wiring

EVENTS_STREAM = "WINGSMITH_EVENTS"
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
        name="WINGSMITH_RENDER",
        subjects=["wingsmith.render.>"],
        storage=StorageType.FILE,
        max_msgs_per_subject=1,
        description="Desired state per deployment: the latest value per subject",
    ),
    StreamConfig(
        name="WINGSMITH_OBS",
        subjects=["wingsmith.obs.>"],
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=7 * 24 * 3600.0,
        description="Observations from cluster operators",
    ),
    StreamConfig(
        name="WINGSMITH_PROJ",
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


async def read_stream(
    nc: Client, stream: str, subject: str, *, follow: bool, start_seq: int = 1
) -> AsyncIterator[StreamMessage]:
    """Messages of `stream` matching `subject` from `start_seq`, through an ordered consumer;
    without `follow` it ends once it has caught up with the stream."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    if not follow and info.state.messages == 0:
        return
    sub = await js.subscribe(
        subject,
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(start_seq, 1)
        ),
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0 if not follow else 3600.0)
            except nats.errors.TimeoutError:
                if follow:
                    continue
                return
            meta = msg.metadata
            yield StreamMessage(
                meta.sequence.stream, msg.subject, bytes(msg.data), dict(msg.headers or {})
            )
            if not follow and meta.num_pending == 0:
                return
    finally:
        await sub.unsubscribe()


async def event_batches(
    nc: Client, after_seq: int, limit: int = 1000
) -> AsyncIterator[list[StreamMessage]]:
    """WINGSMITH_EVENTS from after `after_seq`, forever, in batches of what has arrived.
    An ordered consumer: it recreates itself on gaps and reconnects, so nothing is skipped."""
    # Our own queue rather than next_msg: nats-py waits with asyncio.wait_for, which on 3.11
    # can swallow the cancellation that stops this generator.
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_message(msg: Msg) -> None:
        arrived.put_nowait(msg)

    sub = await nc.jetstream().subscribe(
        "wingsmith.evt.>",
        stream=EVENTS_STREAM,
        cb=on_message,
        ordered_consumer=True,
        idle_heartbeat=2.0,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
        ),
        pending_msgs_limit=100_000,
    )
    try:
        while True:
            batch = [await arrived.get()]
            while not arrived.empty() and len(batch) < limit:
                batch.append(arrived.get_nowait())
            yield [
                StreamMessage(
                    m.metadata.sequence.stream, m.subject, bytes(m.data), dict(m.headers or {})
                )
                for m in batch
            ]
    finally:
        await sub.unsubscribe()


class ViewPublisher:
    """Publishes view changes on `wingsmith.proj.<projection>.<key>` (stream WINGSMITH_PROJ) and
    keeps the latest value per key in the KV bucket `wingsmith_<projection>`. Pipelined: call
    `flush` to wait for every acknowledgement."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._js = nc.jetstream(publish_async_max_pending=20_000)

    @staticmethod
    def bucket(projection: str) -> str:
        return f"wingsmith_{projection}"

    async def start(self, projections: list[str], replicas: int = 1) -> None:
        for name in projections:
            await self._js.create_key_value(
                KeyValueConfig(
                    bucket=self.bucket(name),
                    history=1,
                    replicas=replicas,
                    description=f"latest {name} view per key",
                )
            )

    async def publish(self, projection: str, key: str, view: bytes | None, position: int) -> None:
        msg_id = f"{projection}:{key}:{position}"
        headers = {"Nats-Msg-Id": msg_id, POSITION_HEADER: str(position)}
        if view is None:  # the view was removed
            headers["Wingsmith-Deleted"] = "true"
            await self._js.publish_async(f"wingsmith.proj.{projection}.{key}", b"", headers=headers)
            await self._js.publish_async(
                f"$KV.{self.bucket(projection)}.{key}",
                b"",
                headers={"KV-Operation": "DEL", "Nats-Msg-Id": msg_id},
            )
            return
        await self._js.publish_async(f"wingsmith.proj.{projection}.{key}", view, headers=headers)
        await self._js.publish_async(
            f"$KV.{self.bucket(projection)}.{key}", view, headers={"Nats-Msg-Id": msg_id}
        )

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait for every acknowledgement. Acks lost to a server restart never come: after a
        timeout, start a fresh context (nats-py would wait on the lost ones forever)."""
        try:
            async with asyncio.timeout(timeout):
                await self._js.publish_async_completed()
        except TimeoutError:
            self._js = self._nc.jetstream(publish_async_max_pending=20_000)
            raise
