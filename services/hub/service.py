"""The hub's command service: validate at the edge, then apply commands in group commits.

Commands that arrive while the previous batch is being saved form the next batch. A batch runs in
arrival order against cached aggregates (commands on one aggregate apply one after another to the
same instance), all its events and command receipts are saved in one transaction, and only then
does any command in it get its reply. A conflict (another writer got there first) re-runs each of
the batch's commands on its own against fresh state; nothing is ever acknowledged unsaved.

Commands from inside the hub (the scheduler's decisions, observations) go first. Clients'
commands are held while `Backpressure` says the hub is behind, and answered `busy` with a retry
hint when too many wait or they have waited too long (services/hub/backpressure.py): intake
slows down instead of the hub's lag growing without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, cast

import orjson
from pydantic import ValidationError

from wingsmith.adapters import tracing
from wingsmith.adapters.store import Conflict, EventStore, Fenced, Notification, StoreThread
from wingsmith.domain import names
from wingsmith.domain.base import Aggregate, Cause, DomainError, Event, replay, split_id
from wingsmith.domain.commands import COMMANDS, Command, reserved_prefix
from wingsmith.domain.contracts.replies import Done, EventRef, Refused, Result
from wingsmith.domain.receipt import CommandReceipt
from wingsmith.services import logs
from wingsmith.services.hub.backpressure import Backpressure
from wingsmith.services.hub.classes import ReportedClasses
from wingsmith.services.hub.handlers import HANDLERS
from wingsmith.services.hub.metrics import UNKNOWN_SUBJECT, CommandMetrics
from wingsmith.services.wire import duplicate_key

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Aggregate)
SUBJECT_PREFIX = f"{names.COMMANDS}."
# Small enough that one batch's replies go out (and its clients send again) while the next
# batch is saved; large enough that a disk sync is shared by dozens of commands.
MAX_BATCH = 64
CONFLICT_RETRIES = 5
HELD_POLL = 0.01  # seconds between looks at a held intake


class Publisher(Protocol):
    async def publish(self, subject: str, payload: bytes) -> None: ...


def error_reply(code: str, message: str, **details: Any) -> bytes:
    reply: Refused = {"ok": False, "error": {"code": code, "message": message, "details": details}}
    return orjson.dumps(reply)


_CODE_AT = len(b'{"ok":false,"error":{"code":"')


def outcome(reply: bytes) -> str:
    """`ok`, or the refusal's error code, read from where `error_reply` and `_ok_reply` put
    it (orjson keeps a dict's keys in order): no decoding of the reply on the command path."""
    if reply.startswith(b'{"ok":true'):
        return "ok"
    return reply[_CODE_AT : reply.find(b'"', _CODE_AT)].decode()


def _ok_reply(result: Result, *, duplicate: bool = False, position: int | None = None) -> bytes:
    """`position`: where the command's last event is in the store, so a reader of the views
    can wait until they reflect it; none when it recorded none, or when the hub no longer knows
    (a resend answered from a receipt stored before this hub started)."""
    reply: Done = {"ok": True, "result": result}
    if duplicate:
        reply["duplicate"] = True
    if position is not None:
        reply["position"] = position
    return orjson.dumps(reply)


def _field(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc) or "(body)"


def validation_reply(error: ValidationError) -> bytes:
    problems = [
        {"field": _field(e["loc"]), "problem": e["msg"], "type": e["type"]} for e in error.errors()
    ]
    if any(p["type"] == "json_invalid" for p in problems):
        return error_reply("invalid_json", f"payload is not valid JSON: {problems[0]['problem']}")
    summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems[:5])
    return error_reply("validation_error", summary, errors=problems)


def parse(subject: str, data: bytes, max_bytes: int) -> Command | bytes:
    """The command a message carries, or the error reply that refuses it."""
    if len(data) > max_bytes:
        return error_reply(
            "payload_too_large",
            f"payload is {len(data)} bytes; commands are limited to {max_bytes}",
            limit=max_bytes,
            size=len(data),
        )
    verb = subject.removeprefix(SUBJECT_PREFIX)
    cls = COMMANDS.get(verb)
    if cls is None:
        return error_reply(
            "unknown_command", f"no command on subject {subject!r}", known=sorted(COMMANDS)
        )
    repeated = duplicate_key(data)
    if repeated is not None:
        return _problem_reply(
            repeated, f"key {repeated!r} is given more than once", "duplicate_key"
        )
    try:
        command = cls.model_validate_json(data, strict=True)
    except ValidationError as e:
        return validation_reply(e)
    prefix = reserved_prefix(command.command_id)
    if prefix is not None:
        return _problem_reply(
            "command_id",
            f"the prefix {prefix!r} is reserved for the hub's own commands; choose another",
            "reserved_prefix",
        )
    return command


def _problem_reply(field: str, problem: str, kind: str) -> bytes:
    """A validation error about one field, shaped as pydantic's are."""
    errors = [{"field": field, "problem": problem, "type": kind}]
    return error_reply("validation_error", f"{field}: {problem}", errors=errors)


@dataclass(slots=True)
class Chain:
    """Commands that must apply in order or not at all from the first refused one on: each
    admission decision of a pass may count on the devices an earlier one released. A refusal
    whose code is in `tolerated` does not break it (a deployment deleted meanwhile released
    its grant already)."""

    tolerated: frozenset[str] = frozenset()
    broken: bool = False

    def refused(self, code: str) -> None:
        if code not in self.tolerated:
            self.broken = True


@dataclass(slots=True)
class Submission:
    command: Command
    reply_to: str | None
    digest: str = ""
    answer: asyncio.Future[bytes] | None = None  # for commands from inside the hub
    chain: Chain | None = None
    fence: int | None = None  # saved only while the store's fence is at this token
    arrived: float = field(default_factory=time.perf_counter)
    span: Any = None  # its trace span, from its arrival to its reply (None: tracing is off)

    def __post_init__(self) -> None:
        # what the command asks for: its subject and fields, not the chain it is part of, so a
        # resend under a new correlation id is the same command, and another verb is not
        cmd = self.command
        said = cmd.subject + cmd.model_dump_json(exclude={"correlation_id"})
        self.digest = hashlib.sha256(said.encode()).hexdigest()[:32]

    def traced(self, parent: Any) -> Submission:
        """Start the command's span, a child of `parent` (what sent it)."""
        cmd = self.command
        self.span = tracing.start(
            f"command {cmd.subject}",
            parent,
            command_id=cmd.command_id,
            correlation_id=cmd.correlation_id,
        )
        tracing.remember(cmd.command_id, self.span, cmd.correlation_id)
        return self

    def log_fields(self) -> dict[str, str | None]:
        """What a log line written while it is handled says of it (services/logs.py)."""
        cmd = self.command
        kind = cmd.subject.partition(".")[0]
        key = getattr(cmd, f"{kind}_id", None) or getattr(cmd, kind, None)
        return {
            "command_id": cmd.command_id,
            "correlation_id": cmd.correlation_id or cmd.command_id,
            "aggregate": kind,
            "aggregate_id": None if key is None else str(key),
            "cluster_id": getattr(cmd, "cluster_id", None),
        }

    def cause(self) -> Cause:
        cmd = self.command
        return Cause(
            command_id=cmd.command_id,
            correlation_id=cmd.correlation_id or cmd.command_id,
            at=datetime.now(UTC),
            writer=cmd.writer,
        )


class LRU(OrderedDict[str, Any]):
    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        if value is not default:
            self.move_to_end(key)
        return value

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.maxsize:
            self.popitem(last=False)


class UnitOfWork:
    """The aggregates one batch touches and the events it recorded, in recording order, with a
    mark per command so a refused command's changes can be undone without losing the batch's
    earlier commands."""

    def __init__(
        self, store: EventStore, cache: LRU, classes: ReportedClasses | None = None
    ) -> None:
        self.store, self.cache = store, cache
        self.classes = ReportedClasses() if classes is None else classes
        self.touched: dict[str, Aggregate] = {}
        self._events: list[Event] = []
        self._event_mark = 0
        self._pending_marks: dict[str, int] = {}
        self._unverified: set[str] = set()  # taken from the cache, not checked against the store

    def get(self, cls: type[A], key: str) -> A | None:
        agg_id = cls.store_id(key)
        aggregate = self.touched.get(agg_id)
        if aggregate is None:
            aggregate = self.cache.get(agg_id)
            if aggregate is not None:
                self._unverified.add(agg_id)
            else:
                aggregate = self.store.load(agg_id)
        if aggregate is None:
            return None
        assert isinstance(aggregate, cls), f"{agg_id} is a {type(aggregate).__name__}"
        self._touch(aggregate)
        return aggregate

    def reported_device_classes(self) -> frozenset[str]:
        return self.classes.read(self.store)

    def add(self, aggregate: Aggregate) -> None:
        self._events += aggregate.pending
        self._touch(aggregate, mark=0)

    def _touch(self, aggregate: Aggregate, mark: int | None = None) -> None:
        self._pending_marks.setdefault(
            aggregate.id, len(aggregate.pending) if mark is None else mark
        )
        self.touched[aggregate.id] = aggregate
        aggregate.on_record = self._events.append

    def begin(self) -> None:
        self._event_mark = len(self._events)
        self._pending_marks = {}

    def command_events(self) -> list[Event]:
        return self._events[self._event_mark :]

    def stale_reads(self) -> list[str]:
        """Cached aggregates this command read that another writer has moved past. A command
        that records events on one finds out by a conflict; one that records nothing, or is
        refused, only here."""
        stale = []
        for agg_id in self._unverified.intersection(self._pending_marks):
            aggregate = self.touched[agg_id]
            if not aggregate.pending and self.store.version(agg_id) != aggregate.version:
                stale.append(agg_id)
            else:
                self._unverified.discard(agg_id)
        return stale

    def forget(self, agg_ids: list[str]) -> None:
        for agg_id in agg_ids:
            self.touched.pop(agg_id).on_record = None
            self.cache.pop(agg_id, None)
            self._unverified.discard(agg_id)

    def rollback(self) -> None:
        """Undo the current command: rebuild what it changed from the store plus the events
        that earlier commands in this batch recorded."""
        del self._events[self._event_mark :]
        for agg_id, mark in self._pending_marks.items():
            aggregate = self.touched[agg_id]
            if len(aggregate.pending) == mark:
                continue
            kept = aggregate.pending[:mark]
            self.cache.pop(agg_id, None)
            rebuilt = replay(kept, self.store.load(agg_id))
            if rebuilt is None:
                del self.touched[agg_id]
            else:
                rebuilt.pending = kept
                rebuilt.on_record = self._events.append
                self.touched[agg_id] = rebuilt
        self._pending_marks = {}

    def events(self) -> list[Event]:
        return self._events

    def committed(self) -> None:
        for agg_id, aggregate in self.touched.items():
            aggregate.pending, aggregate.on_record = [], None
            if aggregate.kind != CommandReceipt.kind:
                self.cache.put(agg_id, aggregate)
        self.store.take_snapshots(self.touched.values())

    def discard(self) -> None:
        for agg_id, aggregate in self.touched.items():
            aggregate.on_record = None
            self.cache.pop(agg_id, None)


@dataclass(slots=True)
class Outcome:
    reply: bytes  # empty when handled: the reply is made once saved, with the position
    receipt: tuple[str, Result] | None = None  # (payload digest, result) to remember
    digest: str = ""  # of the command decided


class Executor:
    """Runs batches of commands on the store's thread."""

    def __init__(self, store: EventStore, cache_size: int = 100_000) -> None:
        self.store = store
        self.cache = LRU(cache_size)
        self.receipts = LRU(cache_size)
        self.classes = ReportedClasses()
        self.conflicts = 0  # saves another writer beat us to

    def execute(self, batch: list[Submission]) -> tuple[list[bytes], list[Notification]]:
        uow = UnitOfWork(self.store, self.cache, self.classes)
        firsts: dict[str, int] = {}
        outcomes: list[Outcome | int] = []
        fences = {sub.fence for sub in batch if sub.fence is not None}
        if len(fences) > 1:  # a lease lost and taken again: each under its own token
            return self._one_by_one(batch)
        for i, sub in enumerate(batch):
            outcomes.append(self._decide_once(uow, sub, i, firsts, outcomes))
        try:
            notifications = self.store.save(uow.events(), fence=next(iter(fences), None))
        except Conflict:
            self.conflicts += 1
            uow.discard()
            return self._one_by_one(batch)
        except Fenced:  # the fenced commands are refused; the others are saved without them
            uow.discard()
            return self._one_by_one(batch)
        uow.committed()
        return self._replies(batch, outcomes, notifications), notifications

    def _decide_once(
        self,
        uow: UnitOfWork,
        sub: Submission,
        i: int,
        firsts: dict[str, int],
        outcomes: list[Outcome | int],
    ) -> Outcome | int:
        """Decide a command, or point at the same command_id earlier in the batch: identical
        commands share its reply; a different one after a handled one is a reuse."""
        if sub.chain is not None and sub.chain.broken:
            return Outcome(_BROKEN_CHAIN)
        j = firsts.get(sub.command.command_id)
        if j is not None:
            first = outcomes[j]
            assert isinstance(first, Outcome)
            if first.digest == sub.digest:
                return j
            if first.receipt is not None:
                return Outcome(_reused_reply(sub))
        firsts[sub.command.command_id] = i
        outcome = self._decide(uow, sub)
        outcome.digest = sub.digest
        return outcome

    def _replies(
        self,
        batch: list[Submission],
        outcomes: list[Outcome | int],
        saved: list[Notification],
    ) -> list[bytes]:
        positions = {(str(n.originator_id), n.originator_version): n.id for n in saved}
        replies: list[bytes] = []
        for sub, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, int):  # the same command_id earlier in this batch
                replies.append(self._known(sub) or replies[outcome])
                continue
            if outcome.receipt:
                digest, result = outcome.receipt
                position = max(
                    (
                        positions[(f"{e['aggregate']}:{e['id']}", e["version"])]
                        for e in result["events"]
                    ),
                    default=None,
                )
                self.receipts.put(sub.command.command_id, (digest, result, position))
                replies.append(_ok_reply(result, position=position))
                continue
            replies.append(outcome.reply)
        return replies

    def _decide(self, uow: UnitOfWork, sub: Submission, *, check_store: bool = False) -> Outcome:
        with logs.context(**sub.log_fields()):
            return self._decide_now(uow, sub, check_store)

    def _decide_now(self, uow: UnitOfWork, sub: Submission, check_store: bool) -> Outcome:
        known = self._known(sub) or (self._stored_reply(sub) if check_store else None)
        if known is not None:
            return Outcome(known)
        cause = sub.cause()
        handle = HANDLERS[type(sub.command)]
        for attempt in range(2):
            uow.begin()
            try:
                result = handle(uow, sub.command, cause)
            except DomainError as e:
                # refused on another writer's past ("already exists" of a workload another hub
                # has deleted since): decide again on fresh state, as a no-op is
                stale = [] if attempt else uow.stale_reads()
                uow.rollback()
                if stale:
                    uow.forget(stale)
                    continue
                stored = self._stored_reply(sub)
                if stored is None and sub.chain is not None:
                    sub.chain.refused(e.code)
                return Outcome(stored or _domain_reply(e))
            except Exception:
                log.exception("command %s failed", sub.command.command_id)
                uow.rollback()
                if sub.chain is not None:
                    sub.chain.refused("internal")
                return Outcome(error_reply("internal", "the hub failed to handle this command"))
            stale = [] if attempt or uow.command_events() else uow.stale_reads()
            if not stale:
                break
            uow.forget(stale)  # decided on another writer's past: decide again on fresh state
        events = uow.command_events()
        refs = [_event_ref(e) for e in events]
        result = {"command_id": cause.command_id, "events": refs} | result
        receipt = CommandReceipt.record(
            cause, subject=sub.command.subject, payload_digest=sub.digest, result=result
        )
        uow.add(receipt)
        # the handlers' results are loose dicts (services/hub/handlers.py); `Result` names
        # every key they give
        return Outcome(b"", (sub.digest, cast(Result, result)))

    def _known(self, sub: Submission) -> bytes | None:
        remembered = self.receipts.get(sub.command.command_id)
        if remembered is None:
            return None
        digest, result, position = remembered
        if digest != sub.digest:
            return _reused_reply(sub)
        return _ok_reply(result, duplicate=True, position=position)

    def _stored_reply(self, sub: Submission) -> bytes | None:
        """The reply a command_id got before this hub's memory began, if it was handled."""
        receipt = self.store.load(CommandReceipt.store_id(sub.command.command_id))
        if receipt is None:
            return None
        assert isinstance(receipt, CommandReceipt)
        # where its events are in the store is not kept: such a reply carries no position
        self.receipts.put(sub.command.command_id, (receipt.payload_digest, receipt.result, None))
        return self._known(sub)

    def _one_by_one(self, batch: list[Submission]) -> tuple[list[bytes], list[Notification]]:
        replies: list[bytes] = []
        notifications: list[Notification] = []
        for sub in batch:
            if sub.chain is not None and sub.chain.broken:
                replies.append(_BROKEN_CHAIN)
                continue
            for _ in range(CONFLICT_RETRIES):
                uow = UnitOfWork(self.store, self.cache, self.classes)
                outcome = self._decide(uow, sub, check_store=True)
                try:
                    notifications += self.store.save(uow.events(), fence=sub.fence)
                except Conflict:
                    self.conflicts += 1
                    uow.discard()
                    continue
                except Fenced as e:
                    log.warning(
                        "command %s refused: another hub holds the lease now (%s)",
                        sub.command.command_id,
                        e,
                    )
                    uow.discard()
                    _break_chain(sub)
                    replies.append(_FENCED)
                    break
                except Exception:
                    log.exception("store failed on command %s", sub.command.command_id)
                    uow.discard()
                    _break_chain(sub)
                    replies.append(_UNAVAILABLE)
                    break
                uow.committed()
                replies += self._replies([sub], [outcome], notifications)
                break
            else:
                _break_chain(sub)
                replies.append(error_reply("conflict", "too many concurrent writers; retry"))
        return replies, notifications


_UNAVAILABLE = error_reply("unavailable", "the event store failed; nothing was saved; retry")
_FENCED = error_reply(
    "fenced", "another hub holds the lease now: this hub's one-per-store roles stopped"
)
_BROKEN_CHAIN = error_reply(
    "chain_broken", "an earlier command this one depends on was refused; nothing was saved"
)


def _break_chain(sub: Submission) -> None:
    if sub.chain is not None:
        sub.chain.broken = True


def _group_commit_span(batch: list[Submission]) -> contextlib.AbstractContextManager[Any]:
    """The span of one group commit: a child of its first traced command's span, linked to the
    others' (one transaction for commands of many traces)."""
    traced = [c for c in map(tracing.context_of, (sub.span for sub in batch)) if c is not None]
    parent = traced[0] if traced else None
    return tracing.span("group commit", parent, traced[1:], commands=len(batch))


def busy_reply(retry_after: float, why: str) -> bytes:
    ms = max(1, round(retry_after * 1000))
    return error_reply("busy", f"{why}; nothing was saved; retry in {ms} ms", retry_after_ms=ms)


def _event_ref(event: Event) -> EventRef:
    kind, key = split_id(event.originator_id)
    return {
        "aggregate": kind,
        "id": key,
        "version": event.originator_version,
        "type": type(event).__name__,
    }


def _domain_reply(e: DomainError) -> bytes:
    details = ({"field": e.field} if e.field else {}) | e.details
    return error_reply(e.code, e.message, **details)


def _reused_reply(sub: Submission) -> bytes:
    return error_reply(
        "command_id_reused",
        f"command_id {sub.command.command_id!r} was already used for a different command",
        field="command_id",
    )


@dataclass
class CommandService:
    """Takes messages from the command subscription and answers each after its batch commits."""

    store: StoreThread
    publisher: Publisher
    on_committed: Callable[[list[Notification]], None]
    max_bytes: int = 64 * 1024
    backpressure: Backpressure | None = None  # None: clients' commands are never held
    metrics: CommandMetrics = field(default_factory=CommandMetrics)
    executor: Executor = field(init=False)
    commits: int = field(default=0, init=False)  # batches saved (each one transaction)
    _queue: list[Submission] = field(default_factory=list, init=False)  # clients'
    _inside: list[Submission] = field(default_factory=list, init=False)  # the hub's own
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _closing: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.executor = Executor(self.store.store)

    async def submit(self, subject: str, data: bytes, reply_to: str | None) -> None:
        parsed = parse(subject, data, self.max_bytes)
        if isinstance(parsed, bytes):
            verb = subject.removeprefix(SUBJECT_PREFIX)
            await self._refuse(verb if verb in COMMANDS else UNKNOWN_SUBJECT, reply_to, parsed)
            return
        if self._closing:
            refusal = error_reply("unavailable", "the hub is shutting down; retry")
            await self._refuse(parsed.subject, reply_to, refusal)
            return
        busy = self.backpressure.busy(len(self._queue)) if self.backpressure is not None else None
        if busy is not None:
            await self._refuse(parsed.subject, reply_to, busy_reply(*busy))
            return
        self._queue.append(Submission(parsed, reply_to).traced(tracing.current()))
        self._wake.set()

    async def _refuse(self, subject: str, reply_to: str | None, reply: bytes) -> None:
        """Answer a command refused before it was queued."""
        self.metrics.answer(subject, outcome(reply))
        if reply_to:
            await self._reply(reply_to, reply)

    async def execute(self, command: Command, fence: int | None = None) -> dict[str, Any]:
        """Run a command from inside the hub (liveness, observations) in the next batch, as
        if it had come over NATS, and return the reply."""
        [reply] = await self.execute_all([command], fence=fence)
        return reply

    async def execute_all(
        self, commands: list[Command], chain: Chain | None = None, fence: int | None = None
    ) -> list[dict[str, Any]]:
        """Run commands from inside the hub together, in order, ahead of clients' commands
        (as few group commits as the batch size allows), and return their replies. With a
        `chain`, none applies after one is refused (see `Chain`); with a `fence`, they are
        saved only while the store's fence stands at that token (the lease's: else they are
        answered `fenced`)."""
        if self._closing:
            raise RuntimeError("the hub is shutting down")
        loop = asyncio.get_running_loop()
        subs = [
            Submission(c, None, answer=loop.create_future(), chain=chain, fence=fence).traced(
                tracing.of_command(c.command_id) or tracing.current()  # a decision's, a report's
            )
            for c in commands
        ]
        self._inside += subs
        self._wake.set()
        return [orjson.loads(await sub.answer) for sub in subs if sub.answer is not None]

    async def run(self) -> None:
        """Commit batches until closed, then finish whatever was already queued."""
        while not self._closing:
            # while clients' commands are held, look again shortly: nothing wakes us for it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HELD_POLL if self._queue else None):
                    await self._wake.wait()
            self._wake.clear()
            await self._drain()
        await self._drain()

    def _next_batch(self) -> list[Submission]:
        """The hub's own commands first; clients' when the intake is open (or closing)."""
        batch = self._inside[:MAX_BATCH]
        del self._inside[:MAX_BATCH]
        room = MAX_BATCH - len(batch)
        if (
            room
            and self._queue
            and (self._closing or self.backpressure is None or self.backpressure.open())
        ):
            batch += self._queue[:room]
            del self._queue[:room]
        return batch

    def close(self) -> None:
        """Refuse new commands; `run` returns once the queued ones are answered."""
        self._closing = True
        self._wake.set()

    async def _drain(self) -> None:
        while batch := self._next_batch():
            started = time.perf_counter()
            try:
                with _group_commit_span(batch):
                    replies, notifications = await self.store.run(self.executor.execute, batch)
                self.commits += 1
                self.metrics.committed(len(batch), time.perf_counter() - started)
            except Exception:  # the store is unreachable: nothing in this batch was saved
                log.exception("store failed; refusing a batch of %d commands", len(batch))
                self.executor.cache.clear()
                for sub in batch:
                    _break_chain(sub)
                replies, notifications = [_UNAVAILABLE] * len(batch), []
            if notifications:
                self.on_committed(notifications)
            for sub, reply in zip(batch, replies, strict=True):
                if sub.answer is not None and not sub.answer.done():
                    sub.answer.set_result(reply)
                if sub.reply_to:
                    await self._reply(sub.reply_to, reply)
                answered = time.perf_counter() - sub.arrived
                self.metrics.answer(sub.command.subject, outcome(reply), answered)
                tracing.end(sub.span, ok=reply.startswith(b'{"ok":true'))

    async def _reply(self, to: str, reply: bytes) -> None:
        try:
            await self.publisher.publish(to, reply)
        except Exception as e:  # a lost reply is retried by its client; never stop serving
            log.warning("could not reply on %s: %s", to, e)
