"""`wingsmith events -f` and `watch` keep following a hub whose embedded nats-server came back
on another port (its old one taken meanwhile): every event once, and the views again."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

WINGSMITH = [sys.executable, "-m", "wingsmith"]


def start_hub(env: dict[str, str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [*WINGSMITH, "up", "--no-api"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    said = [process.stdout.readline()]
    while "wingsmith hub ready" not in said[-1]:  # after a warning, perhaps
        assert said[-1], said
        said.append(process.stdout.readline())
    return process


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(30)


class Follower:
    """A `wingsmith` process that keeps printing, its lines read as they come."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen(
            [*WINGSMITH, *args], env=env, stdout=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def until(self, found: Callable[[str], bool], timeout: float = 60) -> list[str]:
        """Every line read until one `found` accepts (that one included)."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while not seen or not found(seen[-1]):
            left = deadline - time.monotonic()
            assert left > 0, f"not printed; got {seen}"
            try:
                seen.append(self.lines.get(timeout=left))
            except queue.Empty:
                continue
        return seen


@pytest.fixture
def followers() -> Iterator[list[Follower]]:
    started: list[Follower] = []
    yield started
    for f in started:
        stop(f.process)


def register(env: dict[str, str], cluster: str) -> None:
    body = json.dumps({"cluster_id": cluster, "command_id": f"register-{cluster}"})
    done = subprocess.run(
        [*WINGSMITH, "cmd", "cluster.register", body],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout + done.stderr


def port(env: dict[str, str]) -> int:
    return int((Path(env["WINGSMITH_DATA_DIR"]) / "nats.url").read_text().rsplit(":", 1)[1])


def test_followers_follow_the_server_to_its_new_port(
    env: dict[str, str], followers: list[Follower]
) -> None:
    hub = start_hub(env)
    try:
        register(env, "east")
        events = Follower(env, "events", "-f")
        watch = Follower(env, "watch", "clusters", "--json")
        followers += [events, watch]
        before = events.until(lambda line: "cluster/east" in line)
        watch.until(lambda line: json.loads(line)["key"] == "east")

        old = port(env)
        stop(hub)
        with socket.socket() as taken:  # another program takes the port meanwhile
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            taken.bind(("127.0.0.1", old))
            taken.listen()
            hub = start_hub(env)
            assert port(env) != old
            register(env, "west")
            after = events.until(lambda line: "cluster/west" in line)
            redrawn = watch.until(lambda line: json.loads(line)["key"] == "west")
            listed = subprocess.run(
                [*WINGSMITH, "events"], env=env, capture_output=True, text=True, timeout=60
            )
    finally:
        stop(hub)

    # the current views again (east), then the change after them (west)
    assert [json.loads(line)["key"] for line in redrawn[-2:]] == ["east", "west"]
    # every event of the stream once, in order, across the move
    printed = [int(line.split()[0]) for line in before + after]
    stored = [int(line.split()[0]) for line in listed.stdout.splitlines()]
    assert printed == stored[: len(printed)] == list(range(1, len(printed) + 1))
    assert "cluster/west" in after[-1] and "cluster/east" in before[-1]
