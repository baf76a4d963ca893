"""The README's five-minute tour, exactly as a person types it, against `wingsmith up` with the
simulated clusters `make run` starts: a quota and a workload that goes pending → admitted →
placed → running, a model discovered and adopted, then its audit trail and a replay."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WINGSMITH = [sys.executable, "-m", "wingsmith"]


def tour() -> list[list[str]]:
    block = (ROOT / "README.md").read_text().split("<!-- tour")[1].split("<!-- /tour -->")[0]
    lines = [line for line in block.splitlines() if line.startswith(".venv/bin/wingsmith ")]
    return [shlex.split(line)[1:] for line in lines]


def make_run_clusters() -> list[str]:
    """The `--simulated` arguments of `make run`, as the Makefile has them."""
    return re.findall(r"--simulated (\S+)", (ROOT / "Makefile").read_text())


class System:
    """`wingsmith up` as `make run` starts it, its output collected as it comes."""

    def __init__(self, env: dict[str, str]) -> None:
        simulated = [arg for spec in make_run_clusters() for arg in ("--simulated", spec)]
        self.process = subprocess.Popen(
            [*WINGSMITH, "up", *simulated],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None, "".join(self.lines)
            assert time.monotonic() < deadline, f"no {text!r} in:\n{''.join(self.lines)}"
            time.sleep(0.1)

    def stop(self) -> str:
        self.process.terminate()
        self.process.wait(30)
        self._reader.join(10)
        return "".join(self.lines)


@pytest.fixture
def system(env: dict[str, str]) -> Iterator[System]:
    running = System(env)
    try:
        running.wait_for("simulated clusters")
        yield running
    finally:
        if running.process.poll() is None:
            running.stop()


def run(env: dict[str, str], args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WINGSMITH, *args], env=env, capture_output=True, text=True, timeout=120)


def until(
    env: dict[str, str], args: list[str], shown: Callable[[str], bool]
) -> subprocess.CompletedProcess[str]:
    """Run a read again until its output shows what a person would wait a moment for."""
    deadline = time.monotonic() + 30
    while True:
        done = run(env, args)
        if (done.returncode == 0 and shown(done.stdout)) or time.monotonic() > deadline:
            return done
        time.sleep(0.3)


def test_the_readme_tour(system: System, env: dict[str, str]) -> None:
    steps = tour()
    assert [s[0] for s in steps] == [
        "clusters", "projects", "workloads", "deployments", "sim-fault", "discovered",
        "discovered", "deployments", "deployments", "deployments", "audit", "replay",
    ]  # fmt: skip
    waits: dict[int, Callable[[str], bool]] = {
        0: lambda out: out.count("yes") == 2,  # both operators have reported
        5: lambda out: "qwen-chat" in out,  # the operator's discovery has arrived
        10: lambda out: "AuthorityPromoted" in out and "AdmissionDecided" in out,
    }
    outputs = []
    for i, args in enumerate(steps):
        done = until(env, args, waits[i]) if i in waits else run(env, args)
        assert done.returncode == 0, f"{shlex.join(args)}\n{done.stdout}{done.stderr}"
        outputs.append(done.stdout)

    assert "phase: running" in outputs[2]
    [row] = [line for line in outputs[3].splitlines() if line.startswith("llama-8b--")]
    assert row.split()[2:5] == ["running", "-", "3/3"]
    assert "west--team-a--qwen-chat" in outputs[5] and "sighted" in outputs[5]
    assert "authority: observed" in outputs[7]
    assert 'imported_args: ["--max-model-len","8192"]' in outputs[7]
    assert "authority: managed" in outputs[9] and "drift: null" in outputs[9]
    assert "engine_args: [] → " in outputs[10]
    assert "the live views equal the rebuild" in outputs[11]

    listed = run(env, ["workloads", "list", "--phase", "running", "--json"])
    names = [w["workload_id"] for w in json.loads(listed.stdout)["workloads"]]
    assert sorted(names) == ["llama-8b", "qwen-chat"]
    missing = run(env, ["deployments", "get", "nothing"])
    assert missing.returncode == 2 and "404 not_found (ref)" in missing.stderr
    refused = run(env, ["workloads", "scale", "llama-8b", "-1"])
    assert refused.returncode == 2 and "validation_error (replicas)" in refused.stderr
    gone = run(env, ["workloads", "delete", "llama-8b"])
    assert gone.returncode == 0 and "deleted llama-8b" in gone.stdout

    log = system.stop()
    for phase in ("pending -> admitted", "admitted -> placed", "placed -> running"):
        assert re.search(rf"deployment llama-8b--\w+: {phase}", log), log
