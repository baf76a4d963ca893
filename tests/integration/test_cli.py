"""The README walk-through, exactly as a person types it: `wingsmith up` on the embedded
defaults, commands with `wingsmith cmd`, events with `wingsmith events`, then SIGTERM."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

WINGSMITH = [sys.executable, "-m", "wingsmith"]

README = Path(__file__).resolve().parents[2] / "README.md"


def walkthrough() -> list[list[str]]:
    """The README's walk-through commands, as argument lists."""
    text = README.read_text()
    block = text.split("<!-- walkthrough")[1].split("<!-- /walkthrough -->")[0]
    lines = [line for line in block.splitlines() if line.startswith(".venv/bin/wingsmith ")]
    return [shlex.split(line)[1:] for line in lines]


@pytest.fixture
def hub(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [*WINGSMITH, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert "wingsmith hub ready" in line, line
    yield process
    if process.poll() is None:
        process.terminate()
        process.wait(30)


def wingsmith(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WINGSMITH, *args], env=env, capture_output=True, text=True, timeout=60)


def test_the_readme_walkthrough(hub: subprocess.Popen[str], env: dict[str, str]) -> None:
    steps = walkthrough()
    assert [s[0] for s in steps] == ["cmd"] * 5 + ["events"]
    for args in steps[:-1]:
        done = wingsmith(env, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["ok"] is True

    events = _events_when_all_arrived(env, steps[-1], 11)
    assert [line.split()[4] for line in events] == [
        "ProjectRegistered",
        "QuotaSet",
        "ClusterRegistered",
        "InventoryReported",
        "WorkloadCreated",
        "DeploymentCreated",
        "DeploymentAttached",
        "AdmissionDecided",  # 2 devices: quota 16, 8 in the cluster
        "WorkloadScaled",
        "DeploymentScaled",
        "AdmissionDecided",  # grown to 3
    ]
    assert '"devices":3' in events[-1]
    only = wingsmith(env, "events", "--aggregate", "deployment")
    assert [line.split()[4] for line in only.stdout.splitlines()] == [
        "DeploymentCreated",
        "AdmissionDecided",
        "DeploymentScaled",
        "AdmissionDecided",
    ]

    refused = wingsmith(
        env, "cmd", "workload.scale", '{"workload_id": "mistral-7b", "replicas": -1}'
    )
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["error"]["details"]["errors"][0]["field"] == "replicas"


def test_views_audit_replay_and_watch(hub: subprocess.Popen[str], env: dict[str, str]) -> None:
    for args in walkthrough()[:-1]:
        assert wingsmith(env, *args).returncode == 0
    before = "2000-01-01T00:00:00Z"

    def health() -> dict[str, Any]:
        done = wingsmith(env, "view", "deployment_health", "--key", "mistral-7b--lab", "--json")
        return json.loads(done.stdout)["mistral-7b--lab"] if done.returncode == 0 else {}

    def granted() -> int:
        admission = health().get("admission", {})
        return int(admission.get("evidence", {}).get("wanted", 0)) if admission else 0

    deadline = time.monotonic() + 30
    while health().get("desired_replicas") != 3 or granted() != 3:
        assert time.monotonic() < deadline, "the projector never showed the grown deployment"
        time.sleep(0.2)

    now = wingsmith(env, "view", "capacity", "--as-of", "0s", "--json")
    assert json.loads(now.stdout)["lab.H100"]["total"] == 8
    assert json.loads(wingsmith(env, "view", "capacity", "--as-of", before, "--json").stdout) == {}
    missing = wingsmith(env, "view", "capacity", "--key", "west.H100")
    assert missing.returncode == 1 and "no capacity view 'west.H100'" in missing.stderr
    bad = wingsmith(env, "view", "capacity", "--as-of", "yesterday")
    assert bad.returncode == 2 and "--as-of" in bad.stderr and "'yesterday'" in bad.stderr

    history = wingsmith(env, "audit", "deployment:mistral-7b--lab").stdout.splitlines()
    assert [line.split()[3] for line in history] == [
        "DeploymentCreated",
        "AdmissionDecided",
        "DeploymentScaled",
        "AdmissionDecided",
    ]
    assert "desired_replicas: 2 → 3" in history[2]
    assert "devices: 2 → 3" in history[3]
    scaled = json.loads(
        wingsmith(env, "audit", "deployment:mistral-7b--lab", "--json").stdout.splitlines()[2]
    )
    chain = wingsmith(env, "audit", "--correlation", scaled["correlation_id"], "--json")
    assert [json.loads(line)["type"] for line in chain.stdout.splitlines()] == [
        "WorkloadScaled",
        "DeploymentScaled",
        "AdmissionDecided",  # the admission it caused continues the chain
    ]
    assert wingsmith(env, "audit", "deployment:nope").returncode == 1

    replay = wingsmith(env, "replay")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "the live views equal the rebuild" in replay.stdout
    assert "rebuilding: 100%" in replay.stderr

    for projection, key, check in (
        ("workload_phase", "mistral-7b", lambda view: view["phase"] == "admitted"),
        ("render", "lab.mistral-7b--lab", lambda view: view["replicas"] == 3),
    ):
        watch = subprocess.Popen(
            [*WINGSMITH, "watch", projection, "--json"], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert watch.stdout is not None
            lines = [json.loads(watch.stdout.readline())]
            while lines[-1]["key"] != key:
                lines.append(json.loads(watch.stdout.readline()))
            assert check(lines[-1]["view"]), lines
        finally:
            watch.terminate()
            watch.wait(10)


def test_sigterm_shuts_down_cleanly(hub: subprocess.Popen[str], env: dict[str, str]) -> None:
    url = (Path(env["WINGSMITH_DATA_DIR"]) / "nats.url").read_text()
    port = int(url.rsplit(":", 1)[1])
    hub.send_signal(signal.SIGTERM)
    assert hub.wait(30) == 0
    assert "stopping" in (hub.stdout.read() if hub.stdout else "")
    assert not (Path(env["WINGSMITH_DATA_DIR"]) / "nats.url").exists()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # the embedded nats-server went down with the hub


def test_a_second_hub_on_the_same_data_directory_is_refused(
    hub: subprocess.Popen[str], env: dict[str, str]
) -> None:
    data = Path(env["WINGSMITH_DATA_DIR"])
    deadline = time.monotonic() + 30
    while not (data / "api.url").exists():  # the API starts after the hub says it is ready
        assert time.monotonic() < deadline, "api.url never written"
        time.sleep(0.05)
    urls = {name: (data / name).read_text() for name in ("nats.url", "api.url")}
    second = subprocess.run([*WINGSMITH, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert f"data directory {data} is in use by another wingsmith hub (pid {hub.pid})" in (
        second.stderr
    )
    assert "WINGSMITH_DATA_DIR" in second.stderr
    # the first one's files are as they were, and it still answers
    assert {name: (data / name).read_text() for name in urls} == urls
    done = wingsmith(env, "cmd", "cluster.register", '{"cluster_id": "east"}')
    assert done.returncode == 0, done.stderr
    # once it has stopped, the directory is free again
    hub.terminate()
    assert hub.wait(30) == 0
    again = subprocess.Popen(
        [*WINGSMITH, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert again.stdout is not None
        line = again.stdout.readline()
        assert "wingsmith hub ready" in line, line
    finally:
        again.terminate()
        again.wait(30)


def test_schema_lists_every_command(env: dict[str, str]) -> None:
    done = wingsmith(env, "schema")
    schemas = json.loads(done.stdout)
    assert "wingsmith.cmd.workload.create" in schemas
    assert "command_id" in schemas["wingsmith.cmd.project.set_quota"]["required"]


def test_cmd_without_a_hub_says_what_to_do(env: dict[str, str]) -> None:
    done = wingsmith(env, "cmd", "cluster.register", '{"cluster_id": "east"}')
    assert done.returncode == 2
    assert "wingsmith up" in done.stderr


def _events_when_all_arrived(env: dict[str, str], args: list[str], count: int) -> list[str]:
    deadline = time.monotonic() + 30
    while True:
        lines = wingsmith(env, *args).stdout.splitlines()
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)
