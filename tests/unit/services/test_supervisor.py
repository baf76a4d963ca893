"""The supervisor restarts a child that dies, backs off when it dies at once, and stops it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import pytest

from wingsmith.services.hub.supervisor import ChildState, Supervisor

SLEEPER = [sys.executable, "-c", "import time; print('READY', flush=True); time.sleep(600)"]
QUITTER = [sys.executable, "-c", "raise SystemExit(3)"]


async def until(predicate: object, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def test_a_killed_child_is_started_again(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor("sleeper", SLEEPER, dict(os.environ), first_delay=0.05)
    supervisor.start()
    try:
        await until(lambda: supervisor.status.state is ChildState.RUNNING)
        first = supervisor.status.pid
        assert first is not None
        with caplog.at_level(logging.WARNING):
            os.kill(first, signal.SIGKILL)
            await until(lambda: supervisor.status.restarts == 1)
            assert supervisor.status.last_exit is not None
            assert supervisor.status.last_exit.startswith("killed by SIGKILL")
            await until(lambda: supervisor.status.state is ChildState.RUNNING)
        assert supervisor.status.pid not in (None, first)
        assert "sleeper killed by SIGKILL" in caplog.text
        assert "(restart 1)" in caplog.text
    finally:
        await supervisor.stop()
    assert supervisor.status.state is ChildState.STOPPED


async def test_a_child_that_dies_at_once_is_restarted_ever_more_slowly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = Supervisor("quitter", QUITTER, dict(os.environ), first_delay=0.01, max_delay=0.08)
    with caplog.at_level(logging.WARNING):
        supervisor.start()
        try:
            await until(lambda: supervisor.status.restarts >= 5)
        finally:
            await supervisor.stop()
    records = [r for r in caplog.records if r.name == "wingsmith.services.hub.supervisor"]
    delays = [r.args[2] for r in records][:5]  # type: ignore[index]
    assert delays == [0.01, 0.02, 0.04, 0.08, 0.08]
    assert supervisor.status.last_exit is not None
    assert supervisor.status.last_exit.startswith("exited with code 3")


async def test_a_line_longer_than_the_reader_takes_does_not_end_the_supervision(
    capsys: pytest.CaptureFixture[str],
) -> None:
    talker = [
        sys.executable,
        "-c",
        "import time; print('x' * 3_000_000, flush=True); print('READY', flush=True); "
        "time.sleep(600)",
    ]
    supervisor = Supervisor("talker", talker, dict(os.environ), first_delay=0.05)
    supervisor.start()
    try:
        await until(lambda: supervisor.status.state is ChildState.RUNNING)
        assert supervisor.status.restarts == 0
    finally:
        await supervisor.stop()
    out = capsys.readouterr().out  # the long line's end passed through, READY kept to itself
    assert "x" * 100_000 in out and "READY" not in out
