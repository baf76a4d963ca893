"""What the REST API stands on: the hub's command API, the projections' views, the event stream.

The API holds no state of its own. It sends each request's command to the hub over NATS (the
same subjects and handlers as any other client), answers reads from a mirror of every
projection's latest views (WINGSMITH_PROJ, last value per subject, then each change), and reads
audit history from WINGSMITH_EVENTS. After a command it waits until the mirror reflects it, so a
client that reads what it has just written sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator

import orjson

from wingsmith.adapters import nats_bus
from wingsmith.domain import names, subjects
from wingsmith.domain.commands import Command
from wingsmith.domain.contracts.replies import Done, Refused, Reply
from wingsmith.projections.base import View
from wingsmith.services.tasks import Backoff, stop_all, supervise

log = logging.getLogger(__name__)

FOLLOW_AGAIN = Backoff(first=1.0, cap=10.0, jitter=0.5)  # after a follower failed or ended

PROJ_PREFIX = f"{names.VIEWS}."


class Views:
    """Every projection's latest views, by projection name and key, as of stream sequence
    `seq` of WINGSMITH_PROJ."""

    def __init__(self) -> None:
        self.by_projection: dict[str, dict[str, View]] = {}
        self.seq = 0

    def get(self, projection: str, key: str) -> View | None:
        return self.by_projection.get(projection, {}).get(key)

    def all(self, projection: str) -> Iterator[View]:
        return iter(list(self.by_projection.get(projection, {}).values()))

    def apply(self, message: nats_bus.StreamMessage) -> None:
        projection, _, encoded = message.subject.removeprefix(PROJ_PREFIX).partition(".")
        key = subjects.key_value(encoded)
        views = self.by_projection.setdefault(projection, {})
        if message.headers.get(nats_bus.DELETED_HEADER):
            views.pop(key, None)
        else:
            views[key] = orjson.loads(message.data)
        self.seq = message.seq


class Answered(Done):
    """The hub's `Done`, and whether the views include what the command did."""

    consistent: bool


class Gateway:
    """The hub, the views and the history, over one NATS connection. `run` keeps the views and
    the projector's progress current; `send` waits (up to `consistency_timeout`) until the
    views reflect the command."""

    def __init__(
        self,
        nc: nats_bus.Connection,
        *,
        command_timeout: float = 10.0,
        consistency_timeout: float = 5.0,
    ) -> None:
        self.nc = nc
        self.views = Views()
        self.projected = 0  # the store position the projector has folded up to
        self.command_timeout = command_timeout
        self.consistency_timeout = consistency_timeout
        self.ready = asyncio.Event()  # set while the views are caught up and followed
        self._advanced = asyncio.Event()

    async def run(self) -> None:
        """Follow the views and the progress until cancelled, each starting over after an error
        (the views from their latest values, kept meanwhile to answer with)."""
        followers = {"view mirror": self._mirror, "projector progress": self._progress}
        tasks = [
            asyncio.create_task(
                supervise(name, _again(follow), FOLLOW_AGAIN, logger=log), name=name
            )
            for name, follow in followers.items()
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            await stop_all(tasks)

    async def _mirror(self) -> None:
        target = await nats_bus.last_seq(self.nc, names.VIEWS_STREAM)
        fresh = Views()
        if target == 0:
            self._swap(fresh)
        stream = nats_bus.read_stream(
            self.nc, names.VIEWS_STREAM, f"{PROJ_PREFIX}>", follow=True, start="last"
        )
        try:
            async with contextlib.aclosing(stream):
                async for message in stream:
                    fresh.apply(message)
                    if fresh is not self.views and fresh.seq >= target:
                        self._swap(fresh)
                    if fresh is self.views:
                        self._advance()
        finally:
            self.ready.clear()  # not ready again until a fresh mirror has caught up

    async def _progress(self) -> None:
        async for progress in nats_bus.follow_progress(self.nc):
            self.projected = int(progress["position"])
            self._advance()

    def _swap(self, fresh: Views) -> None:
        self.views = fresh
        self.ready.set()

    def _advance(self) -> None:
        self._advanced.set()
        self._advanced = asyncio.Event()

    async def send(self, command: Command) -> Answered | Refused:
        """The hub's reply to `command`. A successful one says whether the views include its
        effects (`consistent`): it is false when they did not within the timeout, or when the
        hub cannot say where its events are (a resend answered from an old receipt)."""
        subject = names.command_subject(command.subject)
        raw = await nats_bus.request(
            self.nc, subject, command.model_dump_json().encode(), self.command_timeout
        )
        reply: Reply = orjson.loads(raw)
        if not reply["ok"]:
            return reply
        position = reply.get("position")
        unknown = position is None and reply["result"]["events"]
        return {**reply, "consistent": not unknown and await self.caught_up(position)}

    async def caught_up(self, position: int | None) -> bool:
        """Wait until the projector has folded `position` and this mirror has every view change
        published up to there (the projector publishes its progress only once they are stored).
        False if that does not happen in time, or NATS fails meanwhile: the command stands."""
        try:
            async with asyncio.timeout(self.consistency_timeout):
                if position is not None:
                    await self._until(lambda: self.projected >= position)
                target = await nats_bus.last_seq(self.nc, names.VIEWS_STREAM)
                await self._until(lambda: self.views.seq >= target)
        except (TimeoutError, nats_bus.NatsError):
            return False
        return True

    async def _until(self, reached: Callable[[], bool]) -> None:
        while not reached():
            await self._advanced.wait()

    async def history(
        self, subject: str, since: int
    ) -> AsyncGenerator[nats_bus.StreamMessage, None]:
        """Events on `subject` from stream sequence `since`, to the end of the stream."""
        stream = nats_bus.read_stream(
            self.nc, names.EVENTS_STREAM, subject, follow=False, start=since
        )
        async with contextlib.aclosing(stream):
            async for message in stream:
                yield message


def _again(follow: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """`follow`, started again after a pause each time it ends, as after a failure."""

    async def forever() -> None:
        while True:
            await follow()
            await asyncio.sleep(FOLLOW_AGAIN.first)

    return forever
