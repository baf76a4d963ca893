"""The scheduler: one sequential reader of the event history that runs the admission ledger
(`domain/admission.py`), with placement in it, and hands its decisions to the hub as commands.

It runs in the hub that runs the relay, one per store, and reads what the relay publishes, in
the stream's order, as the relay hands it over: no second consumer of the stream inside the hub,
and events it does not fold are not even decoded. What the relay hands over waits in a bounded
buffer; when the scheduler falls further behind than that, the buffer is dropped and it reads
the store in pages from its position until it has caught up (as it does on start).

It works in passes: fold everything that arrived since the last pass, then decide once for each
deployment those events concern, on the latest state, and send all the decisions together, so
they land in as few group commits as the hub's batch size allows. A backlog therefore costs one
decision per deployment, not one per event. Each decision is recorded in the ledger before the
next is made, so two deployments never both get the last free devices; the hub applies a pass's
decisions in order and refuses every one after a refused one (`Chain`), so none counts on
devices that another decision failed to release. Placements of a pass are sent together too
(each recorded before the next is computed, so two workloads never count on the same room),
before the decisions for the deployments they created or rescaled; one the hub refuses (the
workload changed meanwhile) is taken back from the ledger and tried again after the next
events, or after a pause.

A refused decision for a deployment deleted meanwhile changes nothing (its deletion released
its grant; the ledger folds it soon). Any other refused decision means the ledger and the
store disagree: it starts over from the store, and leaves that deployment undecided until an
event changes it (otherwise the same refusal would start it over for ever). An event it cannot
fold, or a deployment it cannot decide for, is set aside with the reason and the rest flow on.

Every so often after a pass, when quiet, and when stopped (unless while deciding), the ledger
is saved beside the projections' checkpoints (`adapters/checkpoints.py`), with the events of its
own decisions still to come back; on start, and when it starts over, it resumes from the latest
one and folds only what the store holds after it. A ledger saved by other code (another version of
`domain/`) is not used: the whole history is folded instead, once.

On a timer it also looks for the moves due (`domain/moves.py`: shares waiting too long, shares
on lost clusters, rebalancing toward preferences) and sends them as placements.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import logging
import pickle
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
from prometheus_client import Histogram

from wingsmith import domain
from wingsmith.adapters import tracing
from wingsmith.adapters.dead_letters import Component, SetAside
from wingsmith.adapters.store import Notification
from wingsmith.domain import moves, subjects
from wingsmith.domain.admission import Decision, Ledger, Placement
from wingsmith.domain.base import split_id
from wingsmith.domain.commands import (
    ADMISSION_PREFIX,
    PLACEMENT_PREFIX,
    Command,
    DecideAdmission,
    PlaceWorkload,
)
from wingsmith.services import logs
from wingsmith.services.hub.metrics import seconds_since
from wingsmith.services.hub.projector import READ_PAGE
from wingsmith.services.hub.relay import event_type
from wingsmith.services.hub.service import Chain
from wingsmith.services.tasks import supervise


def event_subject(note: Notification) -> str:
    """The subject a stored event has on the stream."""
    kind, key = split_id(str(note.originator_id))
    return subjects.event_subject(kind, key, event_type(note.topic))


log = logging.getLogger(__name__)
RETRY_AFTER = 1.0  # seconds before a refused placement is tried again, if nothing happens
BUFFER_LIMIT = 20_000  # records handed over and not folded yet; beyond, read the store
CATCH_UP_LIMIT = 50_000  # records folded from the store before deciding, when far behind
DELETED = frozenset({"not_found"})  # a refusal that says the deployment is gone: nothing to do
# the hub could not act now (its store failed, another writer won, an earlier decision of the
# pass was refused): decided again after starting over, not set aside as a refusal would be
PASSING = frozenset({"unavailable", "conflict", "chain_broken"})
LOOKS_PER_DELAY = 4  # moves are looked for at least this often per their shortest delay
LOOK_BOUNDS = (0.2, 30.0)  # seconds between looks for moves, at least and at most
# the ledger is saved after a pass once this many records were folded since the last save, or
# this many seconds have passed with at least one: a restart folds at most about that much.
# Saving holds the loop (about 1.5 s for 100,000 workloads): never more than 1/SAVE_SHARE of it,
# except when stopping. It is saved too once the scheduler has been quiet for QUIET_SAVE seconds
# with something folded since the last save, and when it is stopped (unless while deciding), so
# a hub restarted after a quiet spell or a clean stop folds next to nothing.
CHECKPOINT_RECORDS, CHECKPOINT_SECONDS = 50_000, 60.0
SAVE_SHARE = 50
QUIET_SAVE = 2.0

Read = Callable[[int, int, int], Awaitable[list[Notification]]]  # (after, limit, stop)
ExecuteAll = Callable[[list[Command], Chain | None], Awaitable[list[dict[str, Any]]]]


class Checkpoints(Protocol):
    """Where the ledger is saved: the latest one, in a format (see `LEDGER_FORMAT`)."""

    async def save(self, position: int, format: str, state: bytes) -> None: ...

    async def latest(self, format: str) -> tuple[int, bytes] | None: ...


def _ledger_format() -> str:
    """What a saved ledger can be read back by: the same pickle protocol, Python and domain
    code (its classes are what is pickled)."""
    digest = hashlib.sha256(f"{pickle.HIGHEST_PROTOCOL} {sys.version_info[:2]}".encode())
    for source in sorted(Path(domain.__file__).parent.rglob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:32]


LEDGER_FORMAT = _ledger_format()


class Refused(Exception):
    """The hub refused a decision: the ledger and the store disagree."""


class Scheduler:
    def __init__(
        self,
        read: Read,
        execute: ExecuteAll,
        published_upto: Callable[[], Awaitable[int]],
        dead_letters: SetAside,
        buffer_limit: int = BUFFER_LIMIT,
        move_rules: moves.MoveRules | None = None,
        clock: Callable[[], float] = time.monotonic,
        admission_wait: Histogram | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        """`published_upto()`: the store position up to which the relay has published, once it
        has caught up with the store. `move_rules`: when placement moves what it placed (None:
        it never does). `admission_wait`: observes each admission's wait, by device class.
        `checkpoints`: where the ledger is saved and resumed from (None: every start folds the
        whole history)."""
        self._read, self._execute, self._published_upto = read, execute, published_upto
        self._dead_letters = dead_letters
        self._admission_wait = admission_wait
        self.move_rules, self._clock = move_rules, clock
        self._looked = clock()  # when moves were last looked for
        self._aside: list[tuple[str, str, bytes, str]] = []  # (reason, subject, data, msg_id)
        self.ledger = Ledger()
        # everything up to here is folded and decided for (health reads it)
        self.position = 0
        self.published_upto = 0  # the last record the relay handed over
        self._buffer: deque[list[Notification]] = deque()
        self._buffered, self._buffer_limit = 0, buffer_limit
        self._from_store = True  # reading the store until caught up: at start, after overflow
        self._arrived = asyncio.Event()
        self._retry: set[str] = set()  # workloads whose placement the hub refused
        self._wanted: dict[str, str | None] = {}  # deployments to decide for -> correlation
        self._moved: dict[str, str | None] = {}  # workloads' last correlation id, to place
        # deployments whose decision the hub refused, with the position then: left undecided
        # until an event after it concerns them (kept across starting over)
        self.refused: dict[str, int] = {}
        self.decisions = self.placements = self.passes = self.overflows = self.set_aside = 0
        # (originator id, version) of the events our decisions recorded: the ledger counted
        # them when deciding, and folding them when they come back, perhaps after later
        # decisions, would take it back in time
        self._own: set[tuple[str, int]] = set()
        self._checkpoints = checkpoints
        self._saved = (0, clock())  # the position of the last ledger saved or resumed, and when
        self.resumed_from = 0  # the position of the ledger the last start resumed from
        self._save_took = 0.0  # seconds the last save held the loop
        # decisions recorded in the ledger and sent, their answers not all in: no ledger to save
        self._deciding = False
        self._arrived_at = clock()  # when the relay last handed something over

    # -- what the relay hands over ---------------------------------------------------------

    def published(self, notifications: list[Notification]) -> None:
        """What the relay has just published (its `on_published`)."""
        if not notifications:
            return
        self.published_upto = max(self.published_upto, notifications[-1].id)
        self._arrived_at = self._clock()
        if not self._from_store:
            if self._buffered + len(notifications) > self._buffer_limit:
                self._overflow()
            else:
                self._buffer.append(notifications)
                self._buffered += len(notifications)
        self._arrived.set()

    def _overflow(self) -> None:
        """Drop the buffer: the store has it all, in order, from our position on."""
        self._buffer.clear()
        self._buffered = 0
        if not self._from_store:
            self.overflows += 1
        self._from_store = True

    def _take(self) -> list[Notification]:
        notes = [n for batch in self._buffer for n in batch if n.id > self.ledger.position]
        self._buffer.clear()
        self._buffered = 0
        return notes

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow until cancelled; after a failure, start over from the store."""
        await supervise("scheduler", self._follow, logger=log)

    async def _follow(self) -> None:
        self._wanted, self._moved, self._deciding = {}, {}, False
        self._overflow()
        self.published_upto = max(self.published_upto, await self._published_upto())
        self.ledger, self._own, self._retry = await self._resume()
        while await self._catch_up():
            pass
        self._wanted = dict.fromkeys(self.ledger.oldest_first(self.ledger.deployments))
        await self._work()
        while True:
            if self._from_store:
                await self._catch_up()
            elif notes := self._take():
                self._fold_all(notes)
            else:
                await self._wait()
            await self._work()

    async def _resume(self) -> tuple[Ledger, set[tuple[str, int]], set[str]]:
        """The latest saved ledger, with its own events still to come back and the workloads
        to place again; a new one if there is none to use."""
        saved = await self._checkpoints.latest(LEDGER_FORMAT) if self._checkpoints else None
        if saved is not None:
            position, state = saved
            if position > self.published_upto:  # a store that lost events: it cannot be right
                log.warning(
                    "the saved ledger is at position %d, past the store's %d: folding the whole "
                    "history",
                    position,
                    self.published_upto,
                )
            else:
                try:
                    ledger, own, retry = pickle.loads(state)
                except Exception as e:
                    log.warning("the saved ledger cannot be read (%s): folding it all again", e)
                else:
                    log.info("resuming admission from the ledger at store position %d", position)
                    self._saved = (position, self._clock())
                    self.resumed_from = position
                    return ledger, own, retry
        self._saved = (0, self._clock())
        self.resumed_from = 0
        return Ledger(), set(), set()

    async def save_on_stop(self) -> None:
        """Once its task is cancelled: save the ledger if anything was folded since the last
        save, unless it stopped while deciding (decisions recorded and sent, their answers
        unknown): then the last save stands. A ledger folded further than it decided is fine
        to save, since a start decides for every deployment anyway."""
        if not self._deciding:
            await self._save("stopping")

    async def _save(self, when: Literal["after a pass", "quiet", "stopping"]) -> None:
        """Save the ledger if anything was folded since the last one and, after a pass, enough
        (see `CHECKPOINT_RECORDS`)."""
        position, at = self._saved
        folded, since = self.ledger.position - position, self._clock() - at
        if self._checkpoints is None or folded <= 0:
            return
        if when != "stopping" and since < self._save_took * SAVE_SHARE:
            return
        if when == "after a pass" and folded < CHECKPOINT_RECORDS and since < CHECKPOINT_SECONDS:
            return
        started = time.perf_counter()
        gc.disable()  # pickling makes no garbage; collecting while it runs only slows it down
        try:
            state = pickle.dumps((self.ledger, self._own, self._retry), pickle.HIGHEST_PROTOCOL)
        finally:
            gc.enable()
        self._save_took = time.perf_counter() - started
        position = self.ledger.position
        try:
            await self._checkpoints.save(position, LEDGER_FORMAT, state)
        except Exception as e:  # admission goes on; the next start folds a little more
            log.warning("could not save the ledger: %s: %s", type(e).__name__, e)
        # not before: a save cancelled before the store thread took it is for the stop to make
        self._saved = (position, self._clock())

    async def _catch_up(self) -> bool:
        """Fold up to `CATCH_UP_LIMIT` records from the store; False once caught up with what
        the relay has published (from then on, what it hands over is buffered)."""
        folded = 0
        while folded < CATCH_UP_LIMIT:
            upto = self.published_upto
            notes = await self._read(self.ledger.position, READ_PAGE, upto)
            if notes:
                self._fold_all(notes)
                folded += len(notes)
            elif self.published_upto == upto:  # nothing handed over during the read was lost
                self._from_store = False
                return False
        return True

    async def _wait(self) -> None:
        """Until something is handed over; refused placements are tried again after a pause,
        and moves looked for when their time comes."""
        self._arrived.clear()
        pauses = [RETRY_AFTER] if self._retry else []
        if self.move_rules is not None:
            pauses.append(max(self._looked + self._look_every() - self._clock(), 0.0))
        save_at = self._quiet_save_at()
        if save_at is not None:
            pauses.append(max(save_at - self._clock(), 0.0))
        try:
            async with asyncio.timeout(min(pauses, default=None)):
                await self._arrived.wait()
        except TimeoutError:
            if save_at is not None and self._clock() >= save_at:
                await self._save("quiet")

    def _quiet_save_at(self) -> float | None:
        """When the ledger is to be saved if nothing arrives meanwhile: `QUIET_SAVE` after the
        last arrival, and no sooner than the share of the loop saves may hold allows (None:
        nothing to save)."""
        position, at = self._saved
        if self._checkpoints is None or self.ledger.position <= position:
            return None
        return max(self._arrived_at + QUIET_SAVE, at + self._save_took * SAVE_SHARE)

    # -- folding -----------------------------------------------------------------------------

    def _fold_all(self, notes: list[Notification]) -> None:
        for note in notes:
            try:
                self._fold(note)
            except Exception as e:  # one event must not stop admission for everyone
                self.ledger.position = max(self.ledger.position, note.id)
                self._set_aside(f"cannot fold it: {type(e).__name__}: {e}", note)

    def _fold(self, note: Notification) -> None:
        """Fold one stored record; note the deployments to decide for and the workloads to
        place, with the correlation id their decisions continue."""
        kind = event_type(note.topic)
        own = (str(note.originator_id), note.originator_version)
        if own in self._own or not self.ledger.folds(kind):
            self._own.discard(own)
            self.ledger.position = max(self.ledger.position, note.id)
            return
        e = orjson.loads(note.state)
        aggregate, aggregate_id = split_id(str(note.originator_id))
        correlation_id = e["correlation_id"]
        if self.refused.get(aggregate_id, note.id) < note.id:  # changed since: decide again
            del self.refused[aggregate_id]
        for deployment_id in self.ledger.apply(note.id, kind, aggregate_id, e):
            self._wanted[deployment_id] = correlation_id
        if aggregate == "workload":
            self._moved[aggregate_id] = correlation_id

    def _set_aside(self, reason: str, note: Notification) -> None:
        """Kept for the pass to hand to the dead letters (folding does not wait)."""
        self.set_aside += 1
        event = f"{note.originator_id}:{note.originator_version}"
        reason = f"{reason} (store position {note.id})"
        self._aside.append((reason, event_subject(note), note.state, event))

    async def _hand_aside(self) -> None:
        aside, self._aside = self._aside, []
        for reason, subject, data, msg_id in aside:
            await self._dead_letters.set_aside(
                Component.SCHEDULER, reason, subject, data, msg_id=msg_id
            )

    # -- deciding ----------------------------------------------------------------------------

    async def _work(self) -> None:
        """One pass: decide for every deployment the folded events concern, place the
        workloads that moved, send it all together; then decide for what placement changed."""
        self.passes += 1
        await self._hand_aside()
        self.ledger.to_place.update(dict.fromkeys(self._retry))
        self._retry.clear()
        wanted, self._wanted = self._wanted, {}
        self._deciding = True  # cancelled from here until the answers are in: nothing to save
        decisions = self._decide(list(wanted))
        placements = self._placements() + self._moves_due()
        touched = await self._send(decisions, placements, wanted)
        if touched:
            await self._send(self._decide(list(touched)), [], touched)
        self._deciding = False
        self._moved.clear()  # a placement tried again continues no chain
        await self._hand_aside()
        self.position = self.ledger.position
        await self._save("after a pass")

    def _decide(self, deployment_ids: list[str]) -> list[Decision]:
        return self.ledger.decide_all(deployment_ids, on_error=self._undecidable, skip=self.refused)

    def _undecidable(self, what: str, e: Exception) -> None:
        """A deployment (or workload) the ledger cannot decide for: set aside with where the
        ledger was; decided again after its next event."""
        self.set_aside += 1
        reason = f"cannot decide for it: {type(e).__name__}: {e}"
        data = orjson.dumps({"id": what, "position": self.ledger.position})
        self._aside.append((reason, what, data, f"{what}@{self.ledger.position}"))

    def _placements(self) -> list[tuple[Placement, list[str]]]:
        """Every workload to place, each recorded before the next is looked at; with the
        deployments to decide for once the hub has made it."""
        made = []
        to_place = self.ledger.to_place
        while to_place:
            workload_id = next(iter(to_place))
            del to_place[workload_id]
            try:
                placement = self.ledger.place(workload_id)
                if placement is not None:
                    made.append((placement, self.ledger.record_placement(placement)))
            except Exception as e:
                self._undecidable(workload_id, e)
        return made

    def _look_every(self) -> float:
        rules = self.move_rules
        assert rules is not None  # looked for only with rules
        shortest = min(rules.move_after, rules.lost_after).total_seconds()
        return min(max(shortest / LOOKS_PER_DELAY, LOOK_BOUNDS[0]), LOOK_BOUNDS[1])

    def _moves_due(self) -> list[tuple[Placement, list[str]]]:
        """The moves due now, if it is time to look (each recorded in the ledger)."""
        if self.move_rules is None or self._clock() - self._looked < self._look_every():
            return []
        self._looked = self._clock()
        made: list[tuple[Placement, list[str]]] = []
        try:  # each move is recorded in the ledger as it is found: those found are made
            made.extend(moves.due(self.ledger, datetime.now(UTC), self.move_rules))
        except Exception as e:
            self._undecidable("moves", e)
        for placement, _ in made:
            assert placement.move is not None
            log.info(
                "moving %d of %s from %s to %s: %s",
                placement.move.replicas,
                placement.workload_id,
                placement.move.from_cluster,
                placement.move.to_cluster,
                placement.move.reason,
            )
        return made

    async def _send(
        self,
        decisions: list[Decision],
        placements: list[tuple[Placement, list[str]]],
        correlations: dict[str, str | None],
    ) -> dict[str, str | None]:
        """Send decisions (in order, as a chain) and placements together; the deployments to
        decide for after the placements the hub made, with their correlation ids."""
        commands: list[Command] = [
            DecideAdmission.of(
                d, self._command_id(ADMISSION_PREFIX, d), correlations.get(d.deployment_id)
            )
            for d in decisions
        ]
        placing: list[Command] = [
            PlaceWorkload.of(
                p, self._command_id(PLACEMENT_PREFIX, p), self._moved.get(p.workload_id)
            )
            for p, _ in placements
        ]
        spans = [_decision_span(command) for command in [*commands, *placing]]
        replies, placed = await asyncio.gather(
            self._execute(commands, Chain(DELETED)) if commands else _nothing(),
            self._execute(placing, None) if placing else _nothing(),
        )
        for span, reply in zip(spans, [*replies, *placed], strict=True):
            tracing.end(span, ok=reply.get("ok"))
        for decision, command, reply in zip(decisions, commands, replies, strict=True):
            with logs.context(
                correlation_id=command.correlation_id,
                aggregate="deployment",
                aggregate_id=decision.deployment_id,
            ):
                await self._decided(decision, reply)
        touched: dict[str, str | None] = {}
        for (placement, decide), command, reply in zip(placements, placing, placed, strict=True):
            if self._ran(command, reply):
                self.placements += 1
            else:  # tried again after the next events (see `_wait`)
                self._retry.add(placement.workload_id)
                decide = self.ledger.undo_placement(placement)
            touched |= dict.fromkeys(decide, command.correlation_id)
        return touched

    async def _decided(self, decision: Decision, reply: dict[str, Any]) -> None:
        if self._ran(None, reply):
            self.decisions += 1
            if decision.admitted and self._admission_wait is not None:
                self._waited(decision.deployment_id, self._admission_wait)
            return
        error = reply.get("error", {})
        if error.get("code") in DELETED:  # deleted meanwhile: its deletion released the grant
            log.info("admission of deleted %s dropped", decision.deployment_id)
            return
        if error.get("code") in PASSING:
            raise Refused(f"{decision.deployment_id}: not decided now ({error.get('code')})")
        self.refused[decision.deployment_id] = self.ledger.position
        reason = f"the hub refused the decision: {error.get('code')}: {error.get('message')}"
        self._aside.append(
            (
                reason,
                decision.deployment_id,
                orjson.dumps(decision),
                f"{decision.deployment_id}@{self.ledger.position}",
            )
        )
        await self._hand_aside()
        raise Refused(f"{decision.deployment_id}: admission was refused ({error.get('code')})")

    def _waited(self, deployment_id: str, histogram: Histogram) -> None:
        """How long an admitted deployment waited, from the event it began to wait at."""
        slot = self.ledger.deployments.get(deployment_id)
        waited = seconds_since(slot.waiting_at) if slot is not None else None
        if slot is not None and waited is not None:
            histogram.labels(slot.device_class).observe(waited)

    def _command_id(self, prefix: str, what: Decision | Placement) -> str:
        # the same decision at the same position (resent after a restart) is the same command
        digest = hashlib.sha256(orjson.dumps(dataclasses.astuple(what))).hexdigest()[:24]
        return f"{prefix}{self.ledger.position}-{digest}"

    def _ran(self, command: Command | None, reply: dict[str, Any]) -> bool:
        """Whether the hub made it; if so, remember the events it recorded, which the ledger
        has already counted."""
        if not reply.get("ok"):
            if command is not None:
                log.info("%s refused: %s", command.subject, reply.get("error"))
            return False
        if not reply.get("duplicate"):  # a duplicate's events came back long ago
            events = reply["result"]["events"]
            self._own |= {(f"{r['aggregate']}:{r['id']}", r["version"]) for r in events}
        return True


def _decision_span(command: Command) -> Any:
    """A decision's span, from the scheduler sending it until the hub answers: a child of the
    first command of its correlation id; the command it sends is its child."""
    span = tracing.start(
        f"scheduler {command.subject}",
        tracing.of_command(command.correlation_id),
        command_id=command.command_id,
    )
    tracing.remember(command.command_id, span)
    return span


async def _nothing() -> list[dict[str, Any]]:
    return []
