"""Long-running tasks: how each one is kept running, and how it is ended.

Every loop of the hub, the API and the operator runs under `supervise`. A failure is logged
and the work starts again after a wait that doubles with each quick failure, up to a cap, plus
a random part (tenacity's `wait_exponential_jitter`), so that the loops of many processes that
lost the same server do not all come back at one instant. A run that went well for a while
starts the doubling over. A cancellation is never caught: it ends the task at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tenacity

log = logging.getLogger(__name__)

CANCEL_AGAIN = 0.5  # seconds: a task that swallowed a cancellation is cancelled again
_RETRYING = tenacity.AsyncRetrying()  # only to give tenacity's wait strategy a call state


@dataclass(frozen=True)
class Backoff:
    """The wait before a task starts again: `first` seconds after a failure, doubling with each
    quick failure after it, plus up to `jitter` seconds at random, and never more than `cap`.
    A run that lasted `healthy_after` seconds went well: the next failure waits `first` again."""

    first: float = 0.5
    cap: float = 2.0
    jitter: float = 0.25
    healthy_after: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th quick failure in a row (counted from 1)."""
        wait = tenacity.wait_exponential_jitter(
            multiplier=self.first, max=self.cap, jitter=self.jitter
        )
        state = tenacity.RetryCallState(_RETRYING, None, (), {})
        state.attempt_number = max(1, failures)
        return float(wait(state))


RESTART = Backoff()

# Called with each failure before the wait: side effects (say, forgetting what was folded), and
# a wait of its own for this failure instead of the backoff's, or None to keep the backoff's.
OnFailure = Callable[[Exception], float | None]


def _no_wait_of_its_own(_: Exception) -> float | None:
    return None


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    backoff: Backoff = RESTART,
    *,
    on_failure: OnFailure = _no_wait_of_its_own,
    stopping: asyncio.Event | None = None,
    logger: logging.Logger = log,
) -> None:
    """Run `run()` until it returns (the task is done) or the task is cancelled; after each
    failure, log it and run it again after `backoff`'s wait. Once `stopping` is set, a failure
    ends the task instead: it is part of being stopped, not one to recover from."""
    failures = 0
    while True:
        started = time.monotonic()
        try:
            await run()
            return
        except Exception as e:
            if stopping is not None and stopping.is_set():
                return
            healthy = time.monotonic() - started >= backoff.healthy_after
            failures = 1 if healthy else failures + 1
            own = on_failure(e)
            delay = backoff.delay(failures) if own is None else own
            logger.warning(
                "%s failed: %s: %s; starting again in %.2gs", name, type(e).__name__, e, delay
            )
        await asyncio.sleep(delay)


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel a task and wait until it has ended. nats-py waits with asyncio.wait_for, which on
    Python 3.11 can swallow a cancellation that lands while it completes, so a task reading from
    NATS is cancelled again until it ends."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=CANCEL_AGAIN)
    with contextlib.suppress(BaseException):
        task.result()


async def stop_all(tasks: Sequence[asyncio.Task[Any]], give_up: float | None = None) -> None:
    """Cancel every task and wait until each has ended; after `give_up` seconds the rest is
    left behind, with a warning. (Not `gather`: it returns as soon as one task ends cancelled,
    while the others may still be unwinding.)"""
    stopping = asyncio.ensure_future(asyncio.gather(*map(cancel_and_wait, tasks)))
    await asyncio.wait([stopping], timeout=give_up)
    if pending := [t for t in tasks if not t.done()]:
        log.warning("%s did not stop", ", ".join(t.get_name() for t in pending))
