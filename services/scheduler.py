"""The scheduler: one sequential reader of the event history that runs the admission ledger
(`domain/admission.py`), with placement in it, and hands its decisions to the hub as commands.

It runs in the hub that runs the relay, one per store, and reads what the relay publishes, in
the stream's order, as the relay hands it over: no second consumer of the stream inside the hub,
and events it does not fold are not even decoded. On start it folds the store up to where the
relay has published, then decides once for every deployment and places every workload; from
there it works after each event, recording each decision in the ledger before the next, so two
deployments never both get the last free devices and two workloads never both count on the same
room. An admission decision the hub refuses means the ledger and the deployments disagree: it
starts over from the store. A placement the hub refuses (overtaken by a newer change to the
workload, or the store unavailable) is tried again after the next events, or after a pause.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from adapters.dead_letters import DeadLetters
from adapters.store import Notification
from domain import subjects
from domain.admission import Decision, Ledger, Placement
from domain.base import split_id
from services.commands import Command, DecideAdmission, PlaceWorkload
from services.projector import READ_PAGE
from services.relay import event_type


def event_subject(note: Notification) -> str:
    """The subject a stored event has on the stream."""
    kind, key = split_id(str(note.originator_id))
    return subjects.event_subject(kind, key, event_type(note.topic))


log = logging.getLogger(__name__)
RETRY_AFTER = 1.0  # seconds before a refused placement is tried again, if nothing happens
DEAD_COMPONENT = "scheduler"

Read = Callable[[int, int, int], Awaitable[list[Notification]]]  # (after, limit, stop)
Execute = Callable[[Command], Awaitable[dict[str, Any]]]


class Refused(Exception):
    """The hub refused a decision."""


class Scheduler:
    def __init__(
        self,
        read: Read,
        execute: Execute,
        published_upto: Callable[[], Awaitable[int]],
        dead_letters: DeadLetters | None = None,
    ) -> None:
        """`published_upto()`: the store position up to which the relay has published, once it
        has caught up with the store."""
        self._read, self._execute, self._published_upto = read, execute, published_upto
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters(None)
        self._arrived: asyncio.Queue[list[Notification]] = asyncio.Queue()
        self.ledger = Ledger()
        self._retry: set[str] = set()  # workloads whose placement the hub refused
        self.decisions = 0
        self.placements = 0
        # (originator id, version) of the events our decisions recorded: the ledger counted
        # them when deciding, and folding them when they come back, perhaps after later
        # decisions, would take it back in time
        self._own: set[tuple[str, int]] = set()

    def published(self, notifications: list[Notification]) -> None:
        """What the relay has just published (its `on_published`)."""
        self._arrived.put_nowait(notifications)

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
            except Exception as e:
                log.warning("scheduler: %s: %s; starting over from the store", type(e).__name__, e)
                await asyncio.sleep(0.5)

    async def _follow(self) -> None:
        self.ledger, self._own, self._retry = Ledger(), set(), set()
        upto = await self._published_upto()
        while notes := await self._read(self.ledger.position, READ_PAGE, upto):
            for note in notes:
                await self._fold_or_set_aside(note)
            self.ledger.position = notes[-1].id
        await self._work(self.ledger.oldest_first(self.ledger.deployments), None)
        while True:
            try:  # refused placements are tried again after the next events, or a pause
                async with asyncio.timeout(RETRY_AFTER if self._retry else None):
                    notes = await self._arrived.get()
            except TimeoutError:
                notes = []
            self.ledger.to_place.update(dict.fromkeys(self._retry))
            self._retry.clear()
            if not notes:
                await self._work([], None)
            for note in notes:
                await self._work(*await self._fold_or_set_aside(note))

    async def _work(self, candidates: list[str], correlation_id: str | None) -> None:
        """Admission decides first (what waits already goes before what placement adds), then
        placement changes shares and admission decides for the deployments it touched."""
        await self._decide(candidates, correlation_id)
        while (placement := self.ledger.next_placement()) is not None:
            await self._decide(await self._place(placement, correlation_id), correlation_id)

    async def _fold_or_set_aside(self, note: Notification) -> tuple[list[str], str | None]:
        """`_fold`, except that an event the ledger cannot fold (old history of a shape it
        does not expect, a bug) is set aside and passed, rather than failing and being folded
        again after every restart; what the ledger did with it before failing stays, as it
        would on the next start from the store."""
        try:
            return self._fold(note)
        except Exception as e:
            self.ledger.position = max(self.ledger.position, note.id)
            await self.dead_letters.set_aside(
                DEAD_COMPONENT,
                f"{type(e).__name__}: {e}"[:500],
                event_subject(note),
                bytes(note.state),
                {"Wingsmith-Position": str(note.id), "topic": note.topic},
                msg_id=str(note.id),
            )
            return [], None

    def _fold(self, note: Notification) -> tuple[list[str], str | None]:
        """Fold one stored record; the deployments to decide for and the correlation id their
        decisions continue."""
        kind = event_type(note.topic)
        own = (str(note.originator_id), note.originator_version)
        if own in self._own or not self.ledger.folds(kind):
            self._own.discard(own)
            self.ledger.position = max(self.ledger.position, note.id)
            return [], None
        e = orjson.loads(note.state)
        _, aggregate_id = split_id(str(note.originator_id))
        return self.ledger.apply(note.id, kind, aggregate_id, e), e["correlation_id"]

    async def _decide(self, candidates: list[str], correlation_id: str | None) -> None:
        for decision in self.ledger.decide_all(candidates):
            await self._send(decision, correlation_id)

    async def _send(self, decision: Decision, correlation_id: str | None) -> None:
        command_id = self._command_id("admission", decision)
        if not await self._run(DecideAdmission.of(decision, command_id, correlation_id)):
            raise Refused(f"{decision.deployment_id}: admission was refused")
        self.decisions += 1

    async def _place(self, placement: Placement, correlation_id: str | None) -> list[str]:
        """Ask the hub to change the workload's shares; the deployments to decide for. A
        refused placement is tried again after the next events (see `_follow`)."""
        command_id = self._command_id("placement", placement)
        if not await self._run(PlaceWorkload.of(placement, command_id, correlation_id)):
            self._retry.add(placement.workload_id)
            return []
        self.placements += 1
        return self.ledger.record_placement(placement)

    def _command_id(self, kind: str, what: Decision | Placement) -> str:
        # the same decision at the same position (resent after a restart) is the same command
        digest = hashlib.sha256(orjson.dumps(dataclasses.astuple(what))).hexdigest()[:24]
        return f"{kind}-{self.ledger.position}-{digest}"

    async def _run(self, command: Command) -> bool:
        """Execute; remember the events it recorded, which the ledger has already counted."""
        reply = await self._execute(command)
        if not reply.get("ok"):
            log.warning("%s refused: %s", command.subject, reply.get("error"))
            return False
        if not reply.get("duplicate"):  # a duplicate's events came back long ago
            events = reply["result"]["events"]
            self._own |= {(f"{r['aggregate']}:{r['id']}", r["version"]) for r in events}
        return True
