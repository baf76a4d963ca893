"""The supervision helper: a failed run starts again after a growing, jittered wait that starts
over after a run that went well; a run that returns ends the task; cancellation ends it at once;
tasks stopped together are all waited for."""

from __future__ import annotations

import asyncio
import logging

import pytest

from wingsmith.services.tasks import Backoff, cancel_and_wait, stop_all, supervise

QUICK = Backoff(first=0.001, cap=0.004, jitter=0.0)


def test_the_wait_doubles_up_to_the_cap_and_the_jitter_only_adds() -> None:
    plain = Backoff(first=0.5, cap=4.0, jitter=0.0)
    assert [plain.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    jittered = Backoff(first=0.5, cap=4.0, jitter=0.25)
    for n in range(1, 7):
        assert plain.delay(n) <= jittered.delay(n) <= min(4.0, plain.delay(n) + 0.25)


async def test_a_failing_run_starts_again_until_it_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 4:
            raise ConnectionError("away")

    with caplog.at_level(logging.WARNING):
        await supervise("flaky", flaky, QUICK)
    assert runs == [0, 1, 2, 3]
    failed = [r.getMessage() for r in caplog.records if "flaky failed" in r.getMessage()]
    assert len(failed) == 3 and all("ConnectionError: away" in m for m in failed)


async def test_the_waits_grow_with_quick_failures_and_start_over_after_a_healthy_run() -> None:
    asked: list[int] = []  # the failures in a row each wait was asked for

    class Counting(Backoff):
        def delay(self, failures: int) -> float:
            asked.append(failures)
            return super().delay(failures)

    plan = iter([0.0, 0.0, 0.0, 0.6, 0.0])  # how long each run lasts before it fails

    async def run() -> None:
        lasts = next(plan, None)
        if lasts is None:
            return
        await asyncio.sleep(lasts)
        raise RuntimeError("failed")

    await supervise("runner", run, Counting(0.001, 1.0, jitter=0.0, healthy_after=0.5))
    assert asked == [1, 2, 3, 1, 2]


async def test_a_failure_may_ask_for_a_wait_of_its_own() -> None:
    seen: list[str] = []

    async def run() -> None:
        if len(seen) < 2:
            raise ValueError(f"bad {len(seen)}")

    def own_wait(e: Exception) -> float | None:
        seen.append(str(e))
        return 0.0

    await supervise("own", run, Backoff(first=3600.0, cap=3600.0, jitter=0.0), on_failure=own_wait)
    assert seen == ["bad 0", "bad 1"]


async def test_a_failure_while_stopping_ends_the_task() -> None:
    stopping = asyncio.Event()
    runs = 0

    async def run() -> None:
        nonlocal runs
        runs += 1
        stopping.set()
        raise ConnectionError("closed under it")

    await supervise("stopping", run, QUICK, stopping=stopping)
    assert runs == 1


async def test_a_cancellation_ends_the_task_at_once_even_while_it_waits() -> None:
    started = asyncio.Event()

    async def run() -> None:
        started.set()
        raise RuntimeError("again")

    task = asyncio.create_task(supervise("waiting", run, Backoff(3600.0, 3600.0, 0.0)))
    await started.wait()
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_stopping_tasks_together_waits_for_each_one() -> None:
    unwound: list[str] = []

    async def slow_to_unwind(name: str, steps: int) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            for _ in range(steps):
                await asyncio.sleep(0)
            unwound.append(name)

    tasks = [
        asyncio.create_task(slow_to_unwind("quick", 0)),
        asyncio.create_task(slow_to_unwind("slow", 20)),
    ]
    await asyncio.sleep(0)
    await stop_all(tasks)
    assert all(t.done() for t in tasks) and sorted(unwound) == ["quick", "slow"]
