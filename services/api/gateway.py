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
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson

from adapters import nats_bus
from projections.base import View
from services.commands import Command

log = logging.getLogger(__name__)

PROJ_PREFIX = f"{nats_bus.VIEWS_PREFIX}."


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
        projection, _, key = message.subject.removeprefix(PROJ_PREFIX).partition(".")
        views = self.by_projection.setdefault(projection, {})
        if message.headers.get(nats_bus.DELETED_HEADER):
            views.pop(key, None)
        else:
            views[key] = orjson.loads(message.data)
        self.seq = message.seq


class Gateway:
    """The hub, the views and the history, over one NATS connection. `run` keeps the views
    current; `send` waits (up to `consistency_timeout`) until they reflect the command."""

    def __init__(
        self,
        nc: nats_bus.Connection,
        *,
        command_timeout: float = 10.0,
        consistency_timeout: float = 5.0,
    ) -> None:
        self.nc = nc
        self.views = Views()
        self.command_timeout = command_timeout
        self.consistency_timeout = consistency_timeout
        self.ready = asyncio.Event()  # set once the views have caught up after a start
        self._advanced = asyncio.Event()

    async def run(self) -> None:
        """Mirror WINGSMITH_PROJ until cancelled; after an error start over from the latest
        views (keeping the old ones to answer with meanwhile)."""
        while True:
            try:
                await self._mirror()
            except Exception as e:
                log.warning("view mirror: %s: %s; starting over", type(e).__name__, e)
                await asyncio.sleep(1.0)

    async def _mirror(self) -> None:
        target = await nats_bus.last_seq(self.nc, nats_bus.VIEWS_STREAM)
        fresh = Views()
        live = target == 0
        if live:
            self._swap(fresh)
        stream = nats_bus.read_stream(
            self.nc, nats_bus.VIEWS_STREAM, f"{PROJ_PREFIX}>", follow=True, start="last"
        )
        async for message in stream:
            fresh.apply(message)
            if not live and fresh.seq >= target:
                live = True
                self._swap(fresh)
            if live:
                self._advanced.set()
                self._advanced = asyncio.Event()

    def _swap(self, fresh: Views) -> None:
        self.views = fresh
        self.ready.set()

    async def send(self, command: Command) -> dict[str, Any]:
        """The hub's reply to `command`; once it succeeded, the views include its effects (or
        `consistent` is false in the reply: they did not within the timeout)."""
        subject = f"wingsmith.cmd.{command.subject}"
        raw = await nats_bus.request(
            self.nc, subject, command.model_dump_json().encode(), self.command_timeout
        )
        reply: dict[str, Any] = orjson.loads(raw)
        if reply.get("ok"):
            reply["consistent"] = await self.caught_up(reply.get("position"))
        return reply

    async def caught_up(self, position: int | None) -> bool:
        """Wait until the projector has folded `position` and this mirror has every view change
        it published up to there (the projector publishes changes before its progress)."""
        try:
            async with asyncio.timeout(self.consistency_timeout):
                if position is not None:
                    while await self._projected() < position:
                        await asyncio.sleep(0.01)
                target = await nats_bus.last_seq(self.nc, nats_bus.VIEWS_STREAM)
                while self.views.seq < target:
                    await self._advanced.wait()
        except TimeoutError:
            return False
        return True

    async def _projected(self) -> int:
        progress = await nats_bus.projector_progress(self.nc)
        return int(progress["position"]) if progress else 0

    async def history(
        self, subject: str, since: int, limit: int
    ) -> AsyncIterator[nats_bus.StreamMessage]:
        """Up to `limit` events on `subject` from stream sequence `since`."""
        stream = nats_bus.read_stream(
            self.nc, nats_bus.EVENTS_STREAM, subject, follow=False, start=since
        )
        count = 0
        async with contextlib.aclosing(stream):
            async for message in stream:
                yield message
                count += 1
                if count >= limit:
                    return
