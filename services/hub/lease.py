"""Which hub runs the roles only one hub per store may run: the relay, the scheduler, liveness,
report intake, the consumer sweep and the projector.

Any number of hubs share a store and take commands; one at a time holds the lease (a value in
the NATS key-value bucket `wingsmith_lease`, adapters/lease.py) and runs those roles. The rules:

- **Taking it.** A hub takes a lease nobody holds, or one released, at once; one its own
  previous life held (same host name and data directory: the data directory's lock says that
  life has ended) at once too; any other only once its revision has stood still for `seconds`,
  timed on the taker's own clock from when it first saw that revision. Every write is a
  compare-and-set on the revision read, so of two takers one wins.
- **The fencing token** is the revision the taking got. Before starting the roles the new
  holder raises the store's fence to it (`EventStore.fence`), which waits for any save under
  the old token to end; from then on the old holder's saves are refused in the store.
- **Keeping it.** The holder writes the lease again every `seconds / 5`. If no write has
  succeeded for `seconds - guard` since the last good one was *sent*, it stops its roles: a
  taker waits `seconds` from when it *saw* that write, which was after it was sent, so the
  holder has stopped `guard` before anyone may take over, with no clock shared between them.
  A write refused because the revision moved means another hub took it: stop at once.
- **A preference.** A hub set not to prefer the roles (`WINGSMITH_NO_RELAY`) waits `seconds`
  longer before each taking, so a preferring hub wins when both could take it.
- **Leaving.** A hub shutting down stops its roles, letting the relay publish what was
  committed, then releases the lease so another takes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from wingsmith.adapters.lease import LeaseEntry, LeaseUnreachable
from wingsmith.services.health import Status

log = logging.getLogger(__name__)

T = TypeVar("T")


class LeaseLost(Exception):
    """The lease is another hub's now, or could not be kept: stop the roles at once."""


class LeaseStore(Protocol):
    async def read(self) -> LeaseEntry | None: ...

    async def take(self, holder: str, replacing: LeaseEntry | None) -> int | None: ...

    async def renew(self, holder: str, token: int, revision: int) -> int | None: ...

    async def release(self, revision: int) -> None: ...


@dataclass(frozen=True)
class LeaseTiming:
    seconds: float = 5.0  # how long a silent holder's lease stands

    @property
    def renew_every(self) -> float:
        return self.seconds / 5

    @property
    def guard(self) -> float:
        """How long before anyone may take over a silent holder stops its roles."""
        return self.seconds / 5


def holder_name(data_dir: Path) -> str:
    """Who a hub is on the lease: its host and data directory, which one hub at a time holds."""
    return f"{socket.gethostname()}:{data_dir.resolve()}"


# the roles, started under a fencing token and stopped when the block ends (at once when it
# ends with LeaseLost); what it yields are their tasks, each running until the roles stop
Roles = Callable[[int], AbstractAsyncContextManager[dict[str, asyncio.Task[None]]]]


class Leadership:
    def __init__(
        self,
        lease: LeaseStore,
        holder: str,
        roles: Roles,
        timing: LeaseTiming = LeaseTiming(),
        *,
        prefer: bool = True,
    ) -> None:
        self.lease, self.holder, self.roles, self.timing = lease, holder, roles, timing
        self.prefer = prefer
        self.token: int | None = None  # while the roles run: the token they run under
        self.seen: LeaseEntry | None = None  # the lease as last read
        self.unreachable: str | None = None  # why the last read or write failed, if it did
        # (monotonic time, "started" or "stopped", token): when the roles began and ended
        self.transitions: list[tuple[float, str, int]] = []
        self.settled = asyncio.Event()  # set once it holds the lease or has seen who does
        self._revision = 0  # the lease's revision as this hub last wrote it
        self._leaving = asyncio.Event()

    async def run(self) -> None:
        """Take the lease, run the roles while it is kept, and wait to take it again when it
        is lost, until `leave` (or a role fails); then stop the roles and release it."""
        while taken := await self._take():
            token, sent = taken
            self._revision = token
            try:
                async with self.roles(token) as tasks:
                    self._started(token)
                    await self._keep(token, sent, tasks)
            except LeaseLost as e:
                log.warning("lease lost (token %d): %s; the one-per-store roles stopped", token, e)
                continue
            except BaseException:
                await self._release()
                raise
            finally:
                self._stopped(token)
            await self._release()  # left: `_keep` returns for nothing else
            return

    def leave(self) -> None:
        """Stop the roles, letting the relay publish what was committed, and release the
        lease; `run` returns once done."""
        self._leaving.set()

    async def _take(self) -> tuple[int, float] | None:
        """Wait until this hub may take the lease and does: the token and when it was sent;
        None when told to leave first."""
        first_seen = time.monotonic()
        while not self._leaving.is_set():
            entry = await self._read()
            now = time.monotonic()
            if entry != self.seen:
                self.seen, first_seen = entry, now
            wait = self._wait_for(entry)
            if wait and self.unreachable is None:
                self.settled.set()
            if now - first_seen >= wait:
                sent = time.monotonic()
                token = await self._try(self.lease.take(self.holder, entry))
                if token is not None:
                    log.info("took the lease (token %d) from %s", token, _who(entry))
                    return token, sent
            await self._pause(self.timing.renew_every)
        return None

    async def _pause(self, seconds: float, tasks: Iterable[asyncio.Task[None]] = ()) -> None:
        """Wait `seconds`, or until told to leave or one of `tasks` ends (its error, if any)."""
        leaving = asyncio.ensure_future(self._leaving.wait())
        try:
            done, _ = await asyncio.wait(
                [leaving, *tasks], timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            leaving.cancel()
        for task in done - {leaving}:
            task.result()  # its error, if it failed
            raise RuntimeError(f"{task.get_name()} ended")

    def _wait_for(self, entry: LeaseEntry | None) -> float:
        if entry is None or entry.released or entry.holder == self.holder:
            wait = 0.0
        else:
            wait = self.timing.seconds
        return wait if self.prefer else wait + self.timing.seconds

    async def _keep(self, token: int, sent: float, tasks: dict[str, asyncio.Task[None]]) -> None:
        """Renew the lease until told to leave; LeaseLost when it is lost, a role's error when
        one fails."""
        renewed = sent
        while True:
            deadline = renewed + self.timing.seconds - self.timing.guard
            pause = min(self.timing.renew_every, deadline - time.monotonic())
            if pause <= 0:
                raise LeaseLost(f"not renewed for {time.monotonic() - renewed:.1f}s")
            await self._pause(pause, tasks.values())
            if self._leaving.is_set():
                return
            sent = time.monotonic()
            try:
                async with asyncio.timeout(max(deadline - sent, 0.01)):
                    renewal = await self._try(self.lease.renew(self.holder, token, self._revision))
            except TimeoutError:
                continue
            if renewal is not None:
                self._revision, renewed = renewal, sent
            elif self.unreachable is None:
                entry = await self._read()
                if entry is None or (entry.holder, entry.token) != (self.holder, token):
                    raise LeaseLost(f"taken by {_who(entry)}")
                self._revision = entry.revision  # our own write, whose answer was lost

    async def _release(self) -> None:
        """Give the lease up (best effort: unreleased, it stands for `seconds`)."""
        with contextlib.suppress(TimeoutError, LeaseUnreachable):
            async with asyncio.timeout(self.timing.renew_every):
                await self.lease.release(self._revision)
                log.info("released the lease")

    async def _read(self) -> LeaseEntry | None:
        entry = await self._try(self.lease.read())
        return self.seen if self.unreachable else entry

    async def _try(self, call: Awaitable[T]) -> T | None:
        """The call's result, or None with `unreachable` saying why it failed."""
        try:
            result = await call
        except LeaseUnreachable as e:
            if self.unreachable is None:
                log.warning("the lease cannot be reached: %s", e)
            self.unreachable = str(e)
            return None
        self.unreachable = None
        return result

    def _started(self, token: int) -> None:
        self.token = token
        self.settled.set()
        self.transitions.append((time.monotonic(), "started", token))

    def _stopped(self, token: int) -> None:
        if self.token is None:  # the roles did not start
            return
        self.token = None
        self.transitions.append((time.monotonic(), "stopped", token))

    def check(self) -> tuple[Status, str]:
        """What the health report says of the lease."""
        if self.token is not None:
            return Status.OK, f"this hub holds the lease (token {self.token})"
        if self.unreachable is not None:
            return Status.WARNING, f"standby; the lease cannot be read: {self.unreachable}"
        return Status.OK, f"standby; the lease is held by {_who(self.seen)}"


def _who(entry: LeaseEntry | None) -> str:
    if entry is None:
        return "nobody (never taken)"
    if entry.released:
        return "nobody (released)"
    return entry.holder
