"""Keeps a child process running. The projector runs in a process of its own, and a process can
die (killed, out of memory, a bug): the hub must notice, say so in its health, and start it
again, without hammering a child that dies at once.

A restart waits `first_delay` seconds, doubling after each quick death up to `max_delay`; a run
that lasted `stable_after` seconds starts the count again. Every exit is logged with how the
process ended. The child says it is ready by printing `READY` alone on a line of its standard
output; until then it counts as starting. Other lines it prints are passed through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from wingsmith.adapters.nats_server import die_with_parent
from wingsmith.services.tasks import Backoff, cancel_and_wait

log = logging.getLogger(__name__)

READY = "READY"
STOP_GRACE = 20.0  # seconds a child gets to finish its batch and checkpoint
LINE_LIMIT = 1 << 20  # bytes of one line of the child's output read at once


class ChildState(StrEnum):
    STARTING = "starting"  # started, not ready yet
    RUNNING = "running"
    RESTARTING = "restarting"  # exited; waiting before the next start
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ChildStatus:
    name: str
    state: ChildState
    pid: int | None
    restarts: int
    last_exit: str | None  # how the previous run ended, e.g. "killed by SIGKILL after 12.0s"
    since: datetime  # when it entered this state


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        first_delay: float = 0.5,
        max_delay: float = 30.0,
        stable_after: float = 60.0,
    ) -> None:
        self.name, self._argv, self._env = name, list(argv), dict(env)
        # one child per hub: no other process's restarts to spread out, so no jitter
        self.backoff = Backoff(first_delay, max_delay, jitter=0.0, healthy_after=stable_after)
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._quick_deaths = 0
        self._status = ChildStatus(name, ChildState.STARTING, None, 0, None, _now())
        self.task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        """Run `run` in a task of its own (`stop` ends it)."""
        self.task = asyncio.create_task(self.run(), name=f"wingsmith-{self.name}")
        return self.task

    @property
    def status(self) -> ChildStatus:
        return self._status

    async def run(self) -> None:
        """Start the child and start it again whenever it ends, until `stop`."""
        while not self._stopping:
            started = time.monotonic()
            try:
                code = await self._run_once()
            except Exception as e:  # supervising must outlive any fault of its own
                log.error("%s: supervision failed: %s: %s", self.name, type(e).__name__, e)
                code = await self._end_child()
            if self._stopping:
                break
            await self._back_off(code, time.monotonic() - started)
        self._set(ChildState.STOPPED, pid=None)

    async def _run_once(self) -> int:
        try:
            process = await asyncio.create_subprocess_exec(
                *self._argv,
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                preexec_fn=die_with_parent,
                limit=LINE_LIMIT,
            )
        except OSError as e:  # counted as a quick death: tried again after the back-off
            log.error("%s could not be started: %s", self.name, e)
            return 127
        self._process = process
        self._set(ChildState.STARTING, pid=process.pid)
        assert process.stdout is not None
        while line := await _line(process.stdout):
            text = line.decode(errors="replace").rstrip("\n")
            if text == READY:
                self._set(ChildState.RUNNING, pid=process.pid)
                log.info("%s (pid %d) is ready", self.name, process.pid)
            else:
                print(text, flush=True)  # the child's own output, as if it were ours
        return await process.wait()

    async def _back_off(self, code: int, ran: float) -> None:
        if ran >= self.backoff.healthy_after:
            self._quick_deaths = 0
        delay = self.backoff.delay(self._quick_deaths + 1)
        self._quick_deaths += 1
        ended = f"{describe_exit(code)} after {ran:.1f}s"
        restarts = self._status.restarts + 1
        log.warning(
            "%s %s; starting it again in %.1fs (restart %d)", self.name, ended, delay, restarts
        )
        self._status = ChildStatus(self.name, ChildState.RESTARTING, None, restarts, ended, _now())
        await asyncio.sleep(delay)

    async def _end_child(self) -> int:
        """Kill a child whose supervision failed (it is started again); its exit code."""
        process = self._process
        if process is None:
            return -1
        if process.returncode is None:
            process.kill()
        return await process.wait()

    def _set(self, state: ChildState, *, pid: int | None) -> None:
        s = self._status
        self._status = ChildStatus(s.name, state, pid, s.restarts, s.last_exit, _now())

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """Ask the child to finish (SIGTERM), kill it after `grace` seconds (at once: 0), and
        end the task `start` made instead of starting the child again."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            if grace > 0:
                process.terminate()
            try:
                async with asyncio.timeout(grace):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        if self.task is not None:
            await cancel_and_wait(self.task)
        self._set(ChildState.STOPPED, pid=None)


async def _line(stream: asyncio.StreamReader) -> bytes:
    """The next line of the child's output. Of a line longer than `LINE_LIMIT` only its end is
    kept (readline drops what overran), rather than the supervision ending."""
    while True:
        try:
            return await stream.readline()
        except ValueError:
            log.warning("a line of a child's output was longer than %d bytes: cut", LINE_LIMIT)


def _now() -> datetime:
    return datetime.now(UTC)


def python_module(module: str, *args: str) -> list[str]:
    """The command line that runs `module` with this interpreter."""
    return [sys.executable, "-m", module, *args]
