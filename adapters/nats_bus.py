"""NATS: the connection, the JetStream streams of the public contract, command intake and the
event publisher the relay uses."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import nats.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import (
    BadRequestError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)
from nats.nuid import NUID

from wingsmith.adapters import tracing
from wingsmith.adapters.nats_auth import (
    operator_consumer,
    operator_inbox_prefix,
    render_filter,
    user_inbox_prefix,
)
from wingsmith.domain import names
from wingsmith.domain.names import (
    DEAD_STREAM,
    EVENTS_STREAM,
    HUB_CONSUMER,
    OBS_STREAM,
    PROGRESS_BUCKET,
    PROGRESS_KEY,
    RENDER_STREAM,
    VIEWS_STREAM,
    view_bucket,
)
from wingsmith.domain.subjects import key_subject, key_value
from wingsmith.domain.subjects import token as subject_token

log = logging.getLogger(__name__)

Connection = Client
NatsError = nats.errors.Error  # what the command line reports without a traceback
__all__ = ["Connection", "NatsError", "Subscription"]

POSITION_HEADER = "Wingsmith-Position"

# Waits, in seconds
CONNECT_TIMEOUT = 5.0
RECONNECT_WAIT = 0.2  # between attempts to reach a lost server, for as long as it takes
PEERS_POLL = 0.5  # between asks to a forming cluster for room for a replicated stream
NO_HUB_POLL = 0.2  # between resends of a request no hub answers yet
PROGRESS_POLL = 0.5  # between looks for the projector's bucket, before a projector has run
FETCH_WAIT = 1.0  # a pull for observations waits this long for one to arrive
ACK_TIMEOUT = 3.0  # for the stream's acknowledgement of a batch of events
RENDER_ACK_WAIT = 60.0  # a render object not acknowledged in this time is delivered again
CANCEL_AGAIN = 0.5  # a task that swallowed a cancellation is cancelled again after this

# Limits of every stream (docs/nats.md#limits). Each is a backstop sized so that nothing the
# system still needs is discarded: the server refuses a message over its stream's size, and a
# full stream drops its oldest messages (never the newest, which the relay resumes from).
MiB, GiB = 1024**2, 1024**3
MAX_MESSAGE = 1 * MiB  # the server's own max_payload: no message can be larger anyway
# An operator's report: half a message, so that the event it becomes (every default spelled
# out, plus the envelope) still fits on WINGSMITH_EVENTS. A larger one is refused at publish.
MAX_REPORT = 512 * 1024
OBS_PER_SUBJECT = 100_000  # one cluster's backlog of one kind: a runaway drops its own oldest
OBS_PENDING = 1_000_000  # reports delivered to the hub and not yet acknowledged
VIEWS_PER_SUBJECT = 1000  # changes kept per view key; its latest value is also in its KV bucket
DEFAULT_MAX_BYTES = {  # reserved on the server's disk when the stream is created
    EVENTS_STREAM: 4 * GiB,
    RENDER_STREAM: 256 * MiB,
    OBS_STREAM: 1 * GiB,
    VIEWS_STREAM: 1 * GiB,
    DEAD_STREAM: 1 * GiB,
}
DAY = 24 * 3600.0

STREAMS = [
    StreamConfig(
        name=EVENTS_STREAM,
        subjects=[names.every(names.EVENTS)],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_bytes=DEFAULT_MAX_BYTES[EVENTS_STREAM],
        max_msg_size=MAX_MESSAGE,
        max_age=0,  # none: the relay resumes from the last message, however quiet the fleet
        duplicate_window=120.0,
        description="Domain events, in event-store order, each exactly once",
    ),
    StreamConfig(
        name=RENDER_STREAM,
        subjects=[names.every(names.RENDER)],
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=1,
        max_bytes=DEFAULT_MAX_BYTES[RENDER_STREAM],
        max_msg_size=MAX_MESSAGE,
        max_age=0,  # none: a deployment's render object stands until it changes
        description="Desired state per deployment: the latest value per subject",
    ),
    StreamConfig(
        name=OBS_STREAM,
        subjects=[names.every(names.OBSERVATIONS)],
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=OBS_PER_SUBJECT,
        max_bytes=DEFAULT_MAX_BYTES[OBS_STREAM],
        max_msg_size=MAX_REPORT,
        max_age=7 * DAY,
        duplicate_window=120.0,
        description="Observations from cluster operators",
    ),
    StreamConfig(
        name=VIEWS_STREAM,
        subjects=[names.every(names.VIEWS)],
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=VIEWS_PER_SUBJECT,
        max_bytes=DEFAULT_MAX_BYTES[VIEWS_STREAM],
        max_msg_size=MAX_MESSAGE,
        max_age=0,  # none: an unchanged view's last change is how readers learn its value
        duplicate_window=120.0,
        description="Projection updates",
    ),
    StreamConfig(
        name=DEAD_STREAM,
        subjects=[names.every(names.DEAD)],
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=30 * DAY,
        max_bytes=DEFAULT_MAX_BYTES[DEAD_STREAM],
        max_msg_size=MAX_MESSAGE,
        duplicate_window=120.0,
        description="Messages and events set aside by the stage that could not handle them",
    ),
]


class _Client(Client):
    """nats-py's client, whose `close` does not raise the client's own stray cancellation.

    When the client cancels its reading task while that task waits for the socket to close (a
    reconnect under way, or a read error being handled), the cancellation cancels the socket's
    close waiter with it, and the next `close()` awaits that cancelled waiter and raises
    CancelledError although nobody cancelled the caller. A process closing its connection on
    the way out would stop there; so such a CancelledError is dropped, and one aimed at the
    calling task still goes through."""

    async def close(self) -> None:
        try:
            await super().close()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            log.debug("nats: the socket's close waiter was cancelled by the client itself")


async def connect(
    url: str,
    name: str,
    *,
    user: str | None = None,
    password: str | None = None,
    inbox_prefix: str | None = None,
) -> Client:
    """A connection that keeps reconnecting for as long as the process runs. `user` and
    `password` log in to a server that has users (else the URL's own `user:password@`, if any);
    `inbox_prefix` replaces `_INBOX` for the replies this connection receives, which is how a
    server can let each user subscribe to its own replies only. A user that logs in gets
    `_INBOX_<user>` unless told otherwise (adapters/nats_auth.py allows it no other)."""
    nc = _Client()
    login_user = user if user is not None else _url_user(url)
    if inbox_prefix is None and login_user is not None:
        inbox_prefix = user_inbox_prefix(login_user)
    shown = _without_secrets(url)

    async def on_error(e: Exception) -> None:
        log.warning("nats: %s", e)

    async def on_disconnect() -> None:
        if not nc.is_closed:
            log.warning("nats: disconnected from %s", shown)

    async def on_reconnect() -> None:
        log.info("nats: reconnected to %s", shown)

    login: dict[str, Any] = {}
    if user is not None:
        login = {"user": user, "password": password or ""}
    if inbox_prefix is not None:
        login["inbox_prefix"] = inbox_prefix
    await nc.connect(
        servers=[u.strip() for u in url.split(",")],  # a cluster: several comma-separated URLs
        name=name,
        **login,
        max_reconnect_attempts=-1,
        reconnect_time_wait=RECONNECT_WAIT,  # type: ignore[arg-type]  # a float is fine at run time
        connect_timeout=CONNECT_TIMEOUT,  # type: ignore[arg-type]
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        pending_size=64 * 1024 * 1024,
    )
    return nc


NO_PEERS_YET = 10005  # "no suitable peers for placement": a cluster still forming
NO_STORAGE = 10047  # "insufficient storage resources available": max_bytes is reserved


class NoStorage(RuntimeError):
    """The server's disk budget cannot hold a stream's size limit."""


VIEWS_DUPLICATE_WINDOW = 120.0  # seconds; only a second guard (see ViewPublisher)


async def ensure_streams(
    nc: Client,
    replicas: int = 1,
    wait_for_peers: float = 60.0,
    max_bytes: Mapping[str, int] | None = None,
    *,
    views_duplicate_window: float = VIEWS_DUPLICATE_WINDOW,
) -> None:
    """Create the contract's streams, or bring existing ones to this configuration. A NATS
    cluster that is still forming has too few peers for replicated streams: ask again, for up to
    `wait_for_peers` seconds. `max_bytes` overrides the size limit of the streams it names."""
    js = nc.jetstream()
    deadline = asyncio.get_running_loop().time() + wait_for_peers
    sizes = max_bytes or {}
    for config in STREAMS:
        size = sizes.get(config.name or "") or config.max_bytes
        config = dataclasses.replace(config, num_replicas=replicas, max_bytes=size)
        if config.name == VIEWS_STREAM:
            config = dataclasses.replace(config, duplicate_window=views_duplicate_window)
        while True:
            try:
                await _add_or_update(js, config)
                break
            except BadRequestError as e:
                if e.err_code != NO_PEERS_YET or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(PEERS_POLL)
            except ServerError as e:
                if e.err_code != NO_STORAGE:
                    raise
                raise NoStorage(
                    f"the NATS server cannot reserve {config.max_bytes} bytes for stream "
                    f"{config.name}: give it more disk (jetstream max_file_store) or set "
                    f"WINGSMITH_STREAM_MAX_BYTES (e.g. {config.name}=1G)"
                ) from None


async def _add_or_update(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError as e:
        if e.err_code == NO_PEERS_YET:
            raise
        await js.update_stream(config)  # exists with another config: bring it to ours


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
        with tracing.continued(msg.headers):  # the sender's trace, for the command's span
            await handle(msg.subject, msg.data, msg.reply or None)

    subscription = await nc.subscribe(
        names.every(names.COMMANDS),
        queue=names.HUB_QUEUE,
        cb=on_message,
        pending_msgs_limit=1_000_000,
    )
    await nc.flush()  # the server knows the subscription before anyone is told the hub is up
    return subscription


async def answer_requests(
    nc: Client, subject: str, answer: Callable[[bytes], Awaitable[bytes]]
) -> None:
    """Answer each request on `subject` with what `answer` makes of its payload, until cancelled."""

    async def on_request(msg: Msg) -> None:
        await msg.respond(await answer(msg.data))

    subscription = await nc.subscribe(subject, cb=on_request)
    try:
        await asyncio.Future()  # until cancelled
    finally:
        with contextlib.suppress(nats.errors.Error):
            await subscription.unsubscribe()


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
    trace: Mapping[str, str] | None = None  # the `traceparent` of the command that stored it


class EventPublisher:
    """Publishes batches to a stream, pipelined, each message naming the stream sequence that
    must precede it. The chain makes one acknowledgement per batch enough: if any message is not
    stored, every later one is refused, so the last one's ack proves the whole batch landed, and
    the stream always holds a gap-free prefix of what was sent."""

    def __init__(self, nc: Client, stream: str = EVENTS_STREAM, ack_timeout: float = ACK_TIMEOUT):
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
            if m.trace:
                headers.update(m.trace)
            payload = m.payload
            if len(payload) + _header_bytes(headers) > self._nc.max_payload:
                payload = _oversized(m)
            is_last = i == len(messages) - 1
            await self._nc.publish(
                m.subject, payload, reply=reply if is_last else "", headers=headers
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


def _oversized(m: OutMessage) -> bytes:
    """What stands on the stream for an event larger than the server takes: its envelope
    without the event body, marked `oversized` (its size), so the stream still holds one message
    per stored event in store order. Readers set it aside; the store keeps the event."""
    try:
        envelope = orjson.loads(m.payload)
    except orjson.JSONDecodeError:
        envelope = None
    head = envelope if isinstance(envelope, dict) else {"position": m.position}
    return orjson.dumps(
        {k: v for k, v in head.items() if k != "event"} | {"oversized": len(m.payload)}
    )


async def request(nc: Client, subject: str, payload: bytes, timeout: float) -> bytes:
    """Request/reply that waits out a hub that is starting (no responders yet) until `timeout`;
    resending is safe because every command carries its command_id."""
    with tracing.span(f"send {subject}", subject=subject):
        return await _request(nc, subject, payload, timeout, tracing.inject({}) or None)


async def _request(
    nc: Client, subject: str, payload: bytes, timeout: float, headers: dict[str, str] | None
) -> bytes:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            wait = max(deadline - loop.time(), 0.1)
            msg = await nc.request(subject, payload, timeout=wait, headers=headers)
            return bytes(msg.data)
        except nats.errors.NoRespondersError:
            if loop.time() + NO_HUB_POLL > deadline:
                raise TimeoutError(
                    f"no hub answers on {subject}; is `wingsmith up` running?"
                ) from None
            await asyncio.sleep(NO_HUB_POLL)
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
) -> tuple[JetStreamContext.PushSubscription, asyncio.Queue[Msg], Callable[[StreamMessage], bool]]:
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
    if subject == ">":
        raise ValueError("read a stream through a subject filter narrower than `>`")
    config.name = _reader_name()  # with its filter, created through the subject naming both
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

    _renamed_when_recreated(sub)

    def early(m: StreamMessage) -> bool:
        if isinstance(start, datetime):
            return m.time < start
        return isinstance(start, int) and m.seq < start

    return sub, arrived, early


def _reader_name() -> str:
    """A name for one ordered consumer: unique, and never one of a durable consumer's."""
    return f"reader-{NUID().next().decode()}"


def _renamed_when_recreated(sub: JetStreamContext.PushSubscription) -> None:
    """Ordered consumers are named so that the server's permissions can keep clients away from
    durable ones (adapters/nats_auth.py). After a gap or a lost server nats-py recreates the
    consumer from the request it first sent, starting after the last message delivered; under
    the same name that would be an update the server refuses (a start position is fixed), so
    each recreation takes a new name. The old consumer lapses once nobody listens to it."""
    state = sub._sub._jsi  # nats-py keeps the ordered consumer's state here
    if state is None:
        raise TypeError("not a JetStream subscription")
    recreate = state.recreate_consumer
    recreating: set[asyncio.Task[Any]] = set()  # nats-py's own tasks: `_close_ordered` ends them

    async def recreate_renamed() -> None:
        task = asyncio.current_task()
        if task is not None:
            recreating.add(task)
        try:
            state._ccreq.name = _reader_name()
            await recreate()
        finally:
            recreating.discard(task)

    setattr(state, "recreate_consumer", recreate_renamed)  # noqa: B010  # one instance only
    setattr(state, "wingsmith_recreating", recreating)  # noqa: B010


async def _close_ordered(sub: JetStreamContext.PushSubscription) -> None:
    """Unsubscribe an ordered consumer, and end a recreation of it nats-py may have started."""
    with contextlib.suppress(nats.errors.ConnectionClosedError):
        await sub.unsubscribe()
    for task in list(getattr(sub._sub._jsi, "wingsmith_recreating", ())):
        await _cancel_and_wait(task)


async def read_stream(
    nc: Client, stream: str, subject: str, *, follow: bool, start: Start = 1
) -> AsyncGenerator[StreamMessage, None]:
    """Messages of `stream` matching `subject` from `start`; without `follow` it ends once it
    has caught up with the stream."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    if not follow and info.state.messages == 0:
        return
    sub, arrived, early = await _ordered(nc, stream, subject, start)
    try:
        if not follow:  # nothing to come: say so now rather than after waiting for it
            consumer = await sub.consumer_info()
            delivered = consumer.delivered.consumer_seq if consumer.delivered else 0
            if consumer.num_pending == 0 and delivered == 0:
                return
        while True:
            try:
                async with asyncio.timeout(None if follow else 1.0):
                    msg = await arrived.get()
            except TimeoutError:
                # slow, or gone: a message still pending (a busy server) is waited for; one
                # that went meanwhile (a newer one on its subject replaced it) is not
                if (await sub.consumer_info()).num_pending == 0:
                    return
                continue
            message = _message(msg)
            if not early(message):
                yield message
            if not follow and msg.metadata.num_pending == 0:
                return
    finally:
        await _close_ordered(sub)


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel one of nats-py's own tasks and wait until it has ended: nats-py waits with
    asyncio.wait_for, which on Python 3.11 can swallow a cancellation that lands while it
    completes. Everyone else's tasks end with `services.tasks.cancel_and_wait`, the same
    loop, which this layer cannot import."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=CANCEL_AGAIN)
    with contextlib.suppress(BaseException):
        task.result()


async def last_seq(nc: Client, stream: str) -> int:
    """The sequence of the stream's latest message."""
    return int((await nc.jetstream().stream_info(stream)).state.last_seq)


async def event_batches(
    nc: Client, after_seq: int, limit: int = 1000
) -> AsyncIterator[list[StreamMessage]]:
    """WINGSMITH_EVENTS from after `after_seq`, forever, in batches of what has arrived."""
    sub, arrived, early = await _ordered(
        nc, EVENTS_STREAM, names.every(names.EVENTS), after_seq + 1
    )
    try:
        while True:
            batch = [await arrived.get()]
            while not arrived.empty() and len(batch) < limit:
                batch.append(arrived.get_nowait())
            messages = [m for m in map(_message, batch) if not early(m)]
            if messages:
                yield messages
    finally:
        await _close_ordered(sub)


DELETED_HEADER = "Wingsmith-Deleted"


def view_stream(projection: str) -> tuple[str, str]:
    """The stream a projection's changes go to, and their subject prefix: render objects go
    to the operators' stream, every other view to the projection stream."""
    if projection == "render":
        return RENDER_STREAM, names.RENDER
    return VIEWS_STREAM, names.view_prefix(projection)


def _kv_subject(bucket: str, key: str) -> str:
    """The subject the server keeps `key` of `bucket` under (`>`: every key)."""
    return f"$KV.{bucket}.{key}"


class Unpublishable(Exception):
    """A message NATS can never take: larger than the server allows."""


def _header_bytes(headers: dict[str, str]) -> int:
    """What headers add to a message's size as the server counts it (`NATS/1.0` and CRLFs)."""
    return 12 + sum(len(k) + len(v.encode()) + 4 for k, v in headers.items())


@dataclass
class StreamEnd:
    """What a stream holds of the projector's changes: its last sequence, the store position of
    its last change, and the message ids of the changes at that position. Changes are sent in
    position order, each expecting the previous one's sequence, so the stream holds a gap-free
    prefix of them: everything below `position`, and at `position` exactly `ids`."""

    seq: int = 0
    position: int = 0
    ids: set[str] = dataclasses.field(default_factory=set)
    created: str = ""  # when the stream was created: which stream of that name it is

    def holds(self, position: int, msg_id: str) -> bool:
        return position < self.position or (position == self.position and msg_id in self.ids)

    def append(self, position: int, msg_id: str) -> int:
        """Count one more change on the stream; the sequence it must follow."""
        if position != self.position:
            self.position, self.ids = position, set()
        self.ids.add(msg_id)
        self.seq += 1
        return self.seq - 1


async def stream_end(js: JetStreamContext, stream: str) -> StreamEnd:
    """Read the stream's last messages back to the first of the last store position."""
    info = await js.stream_info(stream)
    state = info.state
    end = StreamEnd(seq=state.last_seq, created=info.created.isoformat() if info.created else "")
    for seq in range(state.last_seq, max(state.first_seq, 1) - 1, -1):
        try:
            msg = await js.get_msg(stream, seq=seq)
        except NotFoundError:  # removed by a per-subject limit: older than the end we seek
            break
        headers = msg.headers or {}
        if not headers.get(POSITION_HEADER, "").isdigit():
            continue  # not a projector's message
        position = int(headers[POSITION_HEADER])
        if end.ids and position != end.position:
            break
        end.position = position
        end.ids.add(headers.get("Nats-Msg-Id", ""))
    return end


class ViewPublisher:
    """Publishes every view change on `wingsmith.proj.<projection>.<key>` (stream WINGSMITH_PROJ),
    the key's parts encoded as subject tokens (`domain/subjects.py`), keeps the latest value per
    key in the KV bucket `wingsmith_<projection>` (under the same encoded key), and the
    projector's progress in the bucket `wingsmith_projector`. Pipelined: call `flush` to wait for
    every acknowledgement. Each message carries the store position of the event behind it.

    Every change is published at most once, whatever the time since it was first sent: `resume`
    reads where each stream ends, a change the stream already holds is not sent again, and each
    change sent must directly follow the one before it on its stream (a message lost in between
    makes every later one refused, and `flush` fails: resume again). The stream's duplicate
    window is only a second guard."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._js = nc.jetstream(publish_async_max_pending=20_000)
        self._ends: dict[str, StreamEnd] = {}
        self._resumed_at: dict[str, int] = {}  # stream -> its end's position at `resume`
        self._acks: list[asyncio.Future[Any]] = []

    async def start(self, projections: list[str], replicas: int = 1) -> None:
        for bucket in [*map(view_bucket, projections), PROGRESS_BUCKET]:
            await self._js.create_key_value(  # one value per key: bounded by the keys
                KeyValueConfig(
                    bucket=bucket, history=1, replicas=replicas, max_value_size=MAX_MESSAGE
                )
            )

    async def resume(self) -> None:
        """Learn where the projection and render streams end; call before the first change and
        after any failure."""
        self._acks = []
        self._ends = {s: await stream_end(self._js, s) for s in (VIEWS_STREAM, RENDER_STREAM)}
        self._resumed_at = {s: end.position for s, end in self._ends.items()}

    def published(self, projection: str) -> int:
        """The store position of the last change on the projection's stream at `resume`."""
        return self._resumed_at.get(view_stream(projection)[0], 0)

    def streams(self) -> str:
        """Which projection and render streams these are (their creation times), as learnt at
        `resume`: a stream deleted and created again, or a new server's, is another one."""
        return " ".join(f"{s}@{end.created}" for s, end in sorted(self._ends.items()))

    async def change(
        self, projection: str, key: str, view: bytes | None, position: int, *, again: int = 0
    ) -> None:
        """One change of one view, on the projection stream (the render stream for `render`);
        None: the view was removed. A change the stream already holds is skipped;
        `Unpublishable` when NATS can never take it. `again`: the view republished whole by
        version `again` of its projection, under an id of its own (`…:<position>:v<again>`),
        which the change made at that position by the version before does not hold."""
        stream, prefix = view_stream(projection)
        token = key_subject(key)
        end = self._ends.get(stream)
        if end is None:
            raise RuntimeError("ViewPublisher.resume() must come before the first change")
        if end.holds(position, _msg_id(projection, token, position, again)):
            return
        ack = await self._publish(prefix, projection, token, view, position, chain=end, again=again)
        self._acks.append(ack)

    async def latest(
        self, projection: str, key: str, view: bytes | None, position: int, *, again: int = 0
    ) -> None:
        """The view's value now, in its KV bucket (the key encoded as in its subject)."""
        prefix = f"$KV.{view_bucket(projection)}"
        await self._publish(
            prefix, projection, key_subject(key), view, position, kv=True, again=again
        )

    async def _publish(
        self,
        prefix: str,
        projection: str,
        token: str,
        view: bytes | None,
        position: int,
        *,
        kv: bool = False,
        chain: StreamEnd | None = None,
        again: int = 0,
    ) -> asyncio.Future[Any]:
        """Publish under `<prefix>.<token>`, `token` being the view's key as subject tokens;
        with `chain`, as the next message of that stream. The acknowledgement to come."""
        msg_id = _msg_id(projection, token, position, again)
        headers = {"Nats-Msg-Id": msg_id, POSITION_HEADER: str(position)}
        tracing.inject(headers)  # the trace of the event behind the change, if it has one
        if chain is not None:
            headers["Nats-Expected-Last-Sequence"] = str(chain.seq)
        if view is None:
            headers.update({"KV-Operation": "DEL"} if kv else {DELETED_HEADER: "true"})
        payload = view or b""
        # checked here: nats-py would leave a refused message's acknowledgement pending for ever
        if len(payload) + _header_bytes(headers) > self._nc.max_payload:
            raise Unpublishable(
                f"{len(payload)} bytes: more than the server's max_payload {self._nc.max_payload}"
            )
        if chain is not None:  # only once it is sure to be sent: the chain counts it
            chain.append(position, msg_id)
        return await self._js.publish_async(f"{prefix}.{token}", payload, headers=headers)

    async def progress(self, progress: dict[str, Any]) -> None:
        await self._js.publish_async(
            _kv_subject(PROGRESS_BUCKET, PROGRESS_KEY), orjson.dumps(progress)
        )

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait for every acknowledgement; `PublishFailed` if a change was refused or an
        acknowledgement did not come. Acks lost to a server restart never come, nor does the
        refusal of a message that breaks the chain (nats-py fails to decode it): after a
        timeout, start a fresh context (nats-py would wait on the missing ones forever)."""
        try:
            async with asyncio.timeout(timeout):
                await self._js.publish_async_completed()
        except TimeoutError:
            self._js = self._nc.jetstream(publish_async_max_pending=20_000)
            raise PublishFailed(
                f"views: acknowledgements missing after {timeout:g}s (refused or lost)"
            ) from None
        acks, self._acks = self._acks, []
        refused = [a.exception() for a in acks if a.exception() is not None]
        duplicates = sum(1 for a in acks if a.exception() is None and a.result().duplicate)
        if refused or duplicates:
            raise PublishFailed(
                f"{len(refused)} view changes refused ({refused[0] if refused else ''}), "
                f"{duplicates} duplicates; resume from where the streams end"
            )


def _msg_id(projection: str, token: str, position: int, again: int = 0) -> str:
    """A view change's `Nats-Msg-Id`: `<projection>:<key>:<position>`, and `:v<version>` for
    a view republished whole by a new version of its projection."""
    msg_id = f"{projection}:{token}:{position}"
    return f"{msg_id}:v{again}" if again else msg_id


async def latest_views(nc: Client, projection: str) -> dict[str, tuple[int, bytes | None]]:
    """Every key's latest value in a projection's KV bucket, with the store position it was
    computed at; None for a removed view."""
    bucket = view_bucket(projection)
    views: dict[str, tuple[int, bytes | None]] = {}
    try:
        stream = read_stream(
            nc, names.bucket_stream(bucket), _kv_subject(bucket, ">"), follow=False, start="last"
        )
        messages = [m async for m in stream]
    except NotFoundError:  # no projector has run yet
        return views
    for m in messages:
        key = key_value(m.subject.removeprefix(_kv_subject(bucket, "")))
        deleted = m.headers.get("KV-Operation") in {"DEL", "PURGE"}
        views[key] = (int(m.headers.get(POSITION_HEADER, 0)), None if deleted else m.data)
    return views


async def follow_progress(nc: Client) -> AsyncGenerator[dict[str, Any], None]:
    """The projector's progress now, then each time it moves; before a projector has run,
    nothing until one does."""
    bucket = names.bucket_stream(PROGRESS_BUCKET)
    while True:
        try:
            await nc.jetstream().stream_info(bucket)
            break
        except NotFoundError:
            await asyncio.sleep(PROGRESS_POLL)
    subject = _kv_subject(PROGRESS_BUCKET, PROGRESS_KEY)
    stream = read_stream(nc, bucket, subject, follow=True, start="last")
    async with contextlib.aclosing(stream):
        async for message in stream:
            if message.data:
                yield orjson.loads(message.data)


async def projector_progress(nc: Client) -> dict[str, Any] | None:
    """What the projector last reported: store position, stream sequence, event time."""
    try:
        kv = await nc.jetstream().key_value(PROGRESS_BUCKET)
        entry = await kv.get(PROGRESS_KEY)
    except NotFoundError:  # no projector has run yet
        return None
    return orjson.loads(entry.value) if entry.value else None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message from a durable consumer (an observation, a render object), to settle once
    it has been handled."""

    subject: str
    data: bytes
    msg_id: str  # the operator's Nats-Msg-Id, else `<stream>:<sequence>`
    position: int  # the store position a render object was computed at (0: none)
    _msg: Msg

    @property
    def headers(self) -> dict[str, str]:
        return self._msg.headers or {}

    async def ack(self) -> None:
        await self._msg.ack()

    async def retry(self, delay: float = 1.0) -> None:
        await self._msg.nak(delay=delay)

    async def reject(self) -> None:
        """Never deliver again: it can never be handled."""
        await self._msg.term()


def observation_consumer_config(durable: str = HUB_CONSUMER) -> ConsumerConfig:
    """The hub's durable pull consumer on every cluster's observations."""
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        filter_subject=names.every(names.OBSERVATIONS),
        ack_wait=30.0,
        # Reports a cluster's rate holds back wait for redelivery, outstanding: the window is
        # large so that a runaway's backlog never fills it and holds back the other clusters.
        max_ack_pending=OBS_PENDING,
        max_deliver=-1,
    )


async def observation_batches(
    nc: Client, durable: str = HUB_CONSUMER, batch: int = 512
) -> AsyncIterator[list[Delivery]]:
    """Observations from every cluster, through a durable consumer: a hub that was down
    resumes after the last one it acknowledged, within the stream's seven days."""
    js = nc.jetstream()
    config = observation_consumer_config(durable)
    subject = names.every(names.OBSERVATIONS)
    sub = await js.pull_subscribe(subject, durable, stream=OBS_STREAM, config=config)
    await _widen_window(js, durable)
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=FETCH_WAIT)
            except TimeoutError:  # nothing new (nats-py raises its own or asyncio's)
                continue
            yield [_delivery(OBS_STREAM, m) for m in msgs]
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def _widen_window(js: JetStreamContext, durable: str) -> None:
    """A consumer an older hub made keeps its smaller window unless told: tell it."""
    try:
        info = await js.consumer_info(OBS_STREAM, durable)
        if info.config.max_ack_pending != OBS_PENDING:
            config = dataclasses.replace(info.config, max_ack_pending=OBS_PENDING)
            await js.add_consumer(OBS_STREAM, config)  # an update: the rest is unchanged
    except nats.errors.Error as e:  # intake works with the old window: slower to recover
        log.warning("could not widen the observation consumer %s: %s", durable, e)


async def publish_observation(
    nc: Client, cluster_id: str, kind: str, payload: dict[str, Any], msg_id: str
) -> None:
    """What an operator reports, on `wingsmith.obs.<cluster>.<kind>`; `msg_id` makes a resend
    harmless."""
    await nc.jetstream().publish(
        names.observation_subject(cluster_id, kind),
        orjson.dumps(payload),
        stream=OBS_STREAM,
        headers=tracing.inject({"Nats-Msg-Id": msg_id}),  # the trace of the operator's action
    )


async def publish_node_devices(
    nc: Client, cluster_id: str, node_id: str, payload: dict[str, Any], msg_id: str
) -> None:
    """A node agent's report, on `wingsmith.obs.<cluster>.devices.<node>`, through the
    observation stream (kept there for audit; the same `msg_id` within the stream's duplicate
    window is stored once, and still heard by the operator)."""
    await nc.jetstream().publish(
        names.node_devices_subject(cluster_id, subject_token(node_id)),
        orjson.dumps(payload),
        stream=OBS_STREAM,
        headers={"Nats-Msg-Id": msg_id},
    )


async def node_devices(nc: Client, cluster_id: str) -> AsyncIterator[bytes]:
    """Every node agent report of a cluster from now on, as published (core NATS: the
    agents publish again every refresh, so nothing older is needed)."""
    sub = await nc.subscribe(names.node_devices_subject(cluster_id, "*"), pending_msgs_limit=10_000)
    try:
        async for msg in sub.messages:
            yield msg.data
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


# Operators: logging in with their own credentials and reading their cluster's render objects.
# adapters/nats_auth.py writes the server configuration that lets an operator do what this
# section does and nothing more; keep the two in step.


def _without_secrets(url: str) -> str:
    """The URLs as a log line may show them: without a `user:password@` part."""
    shown = []
    for server in url.split(","):
        scheme, sep, rest = server.strip().partition("://")
        if not sep:  # `host:port`, nats-py's default scheme
            scheme, rest = "", scheme
        authority = rest.split("/", 1)[0]
        if "@" in authority:  # a password may hold an `@` too: the last one ends it
            rest = rest[authority.rindex("@") + 1 :]
        shown.append(f"{scheme}{sep}{rest}")
    return ",".join(shown)


def _url_user(url: str) -> str | None:
    """The user of the first server URL's `user:password@`, if it has one."""
    _, sep, rest = url.split(",", 1)[0].strip().partition("://")
    authority = (rest if sep else url.split(",", 1)[0].strip()).split("/", 1)[0]
    if "@" not in authority:
        return None
    return authority[: authority.rindex("@")].split(":", 1)[0] or None


async def connect_operator(
    url: str, cluster_id: str, *, user: str | None = None, password: str | None = None
) -> Client:
    """A cluster operator's connection. Its replies (JetStream API answers, publish acks,
    fetched render objects) come under `_INBOX_<cluster>`, the only subjects the server lets
    that operator subscribe to, so no operator can read another's replies."""
    return await connect(
        url,
        f"wingsmith-operator-{cluster_id}",
        user=user,
        password=password,
        inbox_prefix=operator_inbox_prefix(cluster_id),
    )


def render_consumer_config(cluster_id: str, ack_wait: float = RENDER_ACK_WAIT) -> ConsumerConfig:
    """The operator's durable pull consumer: its cluster's subjects only, starting from the
    latest message of each (one per deployment)."""
    name = operator_consumer(cluster_id)
    return ConsumerConfig(
        name=name,  # with a filter, nats-py creates it through the API subject naming both
        durable_name=name,
        filter_subject=render_filter(cluster_id),
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,  # applying a render to a cluster may take a while
        max_deliver=-1,
    )


async def _fresh_render_consumer(
    js: JetStreamContext, cluster_id: str
) -> JetStreamContext.PullSubscription:
    """Delete the operator's consumer and create it anew, so that it starts again from the
    latest message of every subject: how an operator that (re)starts catches up."""
    name = operator_consumer(cluster_id)
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(RENDER_STREAM, name)
    await js.add_consumer(RENDER_STREAM, render_consumer_config(cluster_id))
    # Bind without asking for consumer info first: nothing but this consumer is reachable.
    return await js.pull_subscribe_bind(name, stream=RENDER_STREAM)


async def _consumer_gone(js: JetStreamContext, cluster_id: str) -> bool:
    """Whether the operator's consumer no longer exists (deleted by someone, or lost with the
    server's state); a server that does not answer now is asked again next time."""
    try:
        await js.consumer_info(RENDER_STREAM, operator_consumer(cluster_id))
    except NotFoundError:
        return True
    except (
        nats.errors.TimeoutError,
        TimeoutError,
        nats.errors.NoRespondersError,
        ServiceUnavailableError,
    ):
        return False
    return False


def _delivery(stream: str, msg: Msg) -> Delivery:
    headers = msg.headers or {}
    msg_id = headers.get("Nats-Msg-Id") or f"{stream}:{msg.metadata.sequence.stream}"
    said = headers.get(POSITION_HEADER, "")  # an operator's report may carry anything here
    position = int(said) if said.isdigit() else 0
    return Delivery(msg.subject, bytes(msg.data), msg_id, position, msg)


async def render_batches(
    nc: Client, cluster_id: str, *, batch: int = 256, idle: float = 5.0
) -> AsyncIterator[list[Delivery]]:
    """Render objects for one cluster, forever: first the latest render object of every one of
    its deployments, then each new one, in batches of what has arrived. Each delivery must be
    acknowledged once applied (`retry` to have it again later); an empty `data` is a removal
    (the message carries `Wingsmith-Deleted: true`).

    Starting recreates the durable consumer `operator-<cluster>`, so a restarted operator sees
    every deployment's latest message again. While idle it checks every `idle` seconds that the
    consumer still exists, and recreates it (delivering everything again) if it does not."""
    js = nc.jetstream()
    sub = await _fresh_render_consumer(js, cluster_id)
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=idle)
            except (nats.errors.TimeoutError, TimeoutError, ServiceUnavailableError) as e:
                # Idle (nats-py raises either timeout), or no one serves the consumer (503: it
                # was deleted, or JetStream is away for a moment).
                if await _consumer_gone(js, cluster_id):
                    log.warning("render consumer of %s vanished: recreating it", cluster_id)
                    with contextlib.suppress(nats.errors.Error):
                        await sub.unsubscribe()
                    sub = await _fresh_render_consumer(js, cluster_id)
                elif isinstance(e, ServiceUnavailableError):
                    await asyncio.sleep(idle)  # a 503 comes at once: don't spin while it lasts
                continue
            yield [_delivery(RENDER_STREAM, m) for m in msgs]
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
