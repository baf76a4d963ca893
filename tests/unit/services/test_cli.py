"""The command line loads what the chosen command needs and nothing else: `--help` none of the
libraries the commands use, a REST command neither the hub, the API server nor the Kubernetes
client; and the parser it builds for one command is the whole command line's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from wingsmith import __version__
from wingsmith.services.cli.main import (
    COMMANDS,
    RESOURCES,
    VERBS,
    build_parser,
    chosen_command,
    chosen_verb,
)

SERVERS = {"fastapi", "starlette", "uvicorn", "kubernetes_asyncio", "eventsourcing", "psycopg"}

# One valid command line per command (none of them is run).
EXAMPLES = {
    "up": ["up", "--simulated", "east=1x8:H100"],
    "api": ["api"],
    "operator": ["operator", "--cluster-id", "east", "--simulated", "1x8:H100"],
    "node-agent": ["node-agent", "--cluster-id", "east", "--node", "gpu-1"],
    "nats-config": ["nats-config", "--cluster", "east"],
    "render": ["render", "desired.json"],
    "inspect-dgd": ["inspect-dgd", "dgd.yaml"],
    "sim-fault": ["sim-fault", "east", "node_loss", "--node", "n0"],
    "projector": ["projector"],
    "cmd": ["cmd", "project.set_quota", "{}"],
    "ping": ["ping"],
    "schema": ["schema"],
    "events": ["events", "--aggregate", "deployment"],
    "dead-letters": ["dead-letters", "--since", "15m"],
    "watch": ["watch", "capacity"],
    "view": ["view", "capacity", "--as-of", "2h"],
    "audit": ["audit", "deployment:llama--east"],
    "replay": ["replay"],
    "backup": ["backup", "events-backup.sqlite"],
    "workloads": ["workloads", "list", "--phase", "running"],
    "deployments": ["deployments", "list"],
    "discovered": ["discovered", "promote", "d1", "--project", "p"],
    "projects": ["projects", "quota", "p", "H100", "8"],
    "clusters": ["clusters", "get", "east"],
}


def imported(tmp_path: Path, *argv: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules a fresh `python -m wingsmith *argv` imports (from `-X importtime`), with the
    REST API and NATS pointed at ports where nothing listens."""
    env = os.environ | {
        "WINGSMITH_DATA_DIR": str(tmp_path),
        "WINGSMITH_API_URL": "http://127.0.0.1:9",
        "WINGSMITH_NATS_URL": "nats://127.0.0.1:9",
    }
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "wingsmith", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    modules = {
        line.rpartition("|")[2].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    return modules, done


def packages(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_help_imports_the_parser_alone(tmp_path: Path) -> None:
    modules, done = imported(tmp_path, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "deployments" in done.stdout
    assert not packages(modules) & (SERVERS | {"nats", "httpx", "pydantic", "yaml"})
    ours = {name for name in modules if name.startswith("wingsmith")} - {"wingsmith.__main__"}
    packages_of_main = {"wingsmith", "wingsmith.services", "wingsmith.services.cli"}
    assert ours == {*packages_of_main, "wingsmith.services.cli.main"}


def test_version_is_the_packages(tmp_path: Path) -> None:
    modules, done = imported(tmp_path, "--version")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"wingsmith {__version__}\n"
    assert "wingsmith.services.cli.main" in modules
    assert not packages(modules) & (SERVERS | {"nats", "httpx", "pydantic"})


def test_a_rest_command_imports_the_http_client_and_no_server(tmp_path: Path) -> None:
    modules, done = imported(tmp_path, "deployments", "list")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot reach the API at http://127.0.0.1:9" in done.stderr
    assert "httpx" in modules
    assert not packages(modules) & (SERVERS | {"nats"})
    assert not {
        m for m in modules if m.startswith(("wingsmith.services.hub", "wingsmith.services.api"))
    }


def test_an_offline_command_imports_neither_nats_nor_kubernetes(tmp_path: Path) -> None:
    modules, done = imported(tmp_path, "render", str(tmp_path / "missing.json"))
    assert done.returncode == 2
    assert "No such file or directory" in done.stderr
    assert not packages(modules) & (SERVERS | {"nats", "httpx"})


@pytest.mark.parametrize("name", [*COMMANDS, *RESOURCES])
def test_each_command_parses_to_its_coroutine(name: str) -> None:
    argv = EXAMPLES[name]
    args = build_parser(chosen_command(argv)).parse_args(argv)
    assert asyncio.iscoroutinefunction(args.run)


# One valid command line per verb of a command.
VERB_EXAMPLES = {
    ("operator", "manifests"): ["operator", "manifests", "--cluster-id", "east", "--read-only"],
}


@pytest.mark.parametrize(("command", "verb"), list(VERB_EXAMPLES))
def test_each_verb_parses_to_its_coroutine_and_its_command_names_it(
    command: str, verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = VERB_EXAMPLES[command, verb]
    assert (chosen_command(argv), chosen_verb(argv, command)) == (command, verb)
    args = build_parser(command, verb).parse_args(argv)
    assert asyncio.iscoroutinefunction(args.run)
    with pytest.raises(SystemExit):
        build_parser(command).parse_args([command, "--help"])
    assert f"`wingsmith {command} {verb}`" in " ".join(capsys.readouterr().out.split())


def test_every_verb_example_is_of_a_known_verb() -> None:
    assert set(VERB_EXAMPLES) == {(c, v) for c, verbs in VERBS.items() for v in verbs}


def test_a_verb_is_only_the_word_right_after_its_command() -> None:
    """So the operator's own command line is parsed as it always was, whatever its values."""
    argv = ["operator", "--cluster-id", "manifests", "--in-cluster"]
    assert chosen_verb(argv, "operator") is None
    args = build_parser("operator").parse_args(argv)
    assert (args.cluster_id, args.in_cluster) == ("manifests", True)
    assert chosen_verb(["-v", "operator", "manifests"], "operator") == "manifests"
    assert chosen_verb(["render", "manifests"], "render") is None
    assert chosen_verb(["operator"], "operator") is None
    assert chosen_verb([], None) is None


def test_the_operators_manifests_import_neither_nats_nor_kubernetes(tmp_path: Path) -> None:
    modules, done = imported(tmp_path, "operator", "manifests", "--cluster-id", "east")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kind: Deployment" in done.stdout
    assert not packages(modules) & (SERVERS | {"nats", "httpx"})


@pytest.mark.parametrize("name", [*COMMANDS, *RESOURCES])
def test_the_command_list_is_the_same_whichever_command_is_chosen(name: str) -> None:
    """`wingsmith --help` shows help lines kept in main.py; the commands' own modules (client.py
    for the resources) must agree with them."""
    assert build_parser(name).format_help() == build_parser().format_help()


def test_the_chosen_command_is_the_first_word_that_is_no_option() -> None:
    assert chosen_command(["-v", "deployments", "list", "--json"]) == "deployments"
    assert chosen_command(["--help"]) is None
    assert chosen_command([]) is None


def test_every_example_is_of_a_known_command() -> None:
    assert set(EXAMPLES) == set(COMMANDS) | set(RESOURCES)


def test_deployments_list_shows_what_the_cluster_says_is_wrong() -> None:
    from wingsmith.domain.contracts.views import DeploymentList
    from wingsmith.services.cli.client import _deployment_table

    row = {
        "deployment_id": "llama--east",
        "cluster_id": "east",
        "admission_phase": "running",
        "admission_reason": None,
        "ready_replicas": 2,
        "desired_replicas": 3,
        "waiting_replicas": 1,
        "authority": "managed",
        "enabled": True,
        "live_digests": {"svg_1": 2},
        "status": {
            "phase": "progressing",
            "reason": None,
            "message": None,
            "ready_replicas": 2,
            "desired_replicas": 3,
            "conditions": [
                {"reason": "ImagePullBackOff", "message": "denied", "permanent": False, "pods": 1},
                {"reason": "Rejected", "message": "x" * 200, "permanent": True, "pods": 0},
            ],
        },
    }
    text = _deployment_table(cast("DeploymentList", {"deployments": [row]}))
    assert "CONDITIONS" in text.splitlines()[0]
    assert text.splitlines()[1].split()[5] == "1"  # WAITING
    assert "ImagePullBackOff (1 pod), Rejected: " + "x" * 79 + "…" in text
    assert "denied" not in text  # a transient one shows its pods; the message is in --json


def test_deployments_explain_prints_the_constraint_its_numbers_and_the_way_out() -> None:
    from wingsmith.domain.contracts.views import Explanation
    from wingsmith.services.cli.client import explanation_text

    explained = {
        "deployment_id": "chat--east",
        "workload_id": "chat",
        "cluster_id": "east",
        "project": "p",
        "device_class": "H100",
        "phase": "running",
        "wants": {"replicas": 5, "devices": 5},
        "holds": {"replicas": 4, "devices": 4},
        "waiting": {"replicas": 1, "devices": 1},
        "constraint": {
            "reason": "insufficient_quota",
            "message": "project p's quota for H100 is 4",
            "numbers": {"quota": 4, "quota_needed": 5},
        },
        "unblock": ["raise project p's quota for H100 to at least 5"],
        "summary": "waits for quota: 1 replicas",
    }
    text = explanation_text(cast("Explanation", explained))
    assert text.splitlines()[0] == "chat--east: waits for quota: 1 replicas"
    assert "wants 5 replicas (5 devices); holds 4 replicas (4 devices)" in text
    assert "why: insufficient_quota: project p's quota for H100 is 4" in text
    assert "quota=4, quota_needed=5" in text
    assert text.splitlines()[-1] == "  - raise project p's quota for H100 to at least 5"


def test_deployments_explain_parses_to_its_coroutine() -> None:
    argv = ["deployments", "explain", "chat--east", "--json"]
    args = build_parser(chosen_command(argv)).parse_args(argv)
    assert asyncio.iscoroutinefunction(args.run) and (args.ref, args.json) == ("chat--east", True)


def test_workloads_prefer_sends_the_preferences_given() -> None:
    from wingsmith.services.cli.client import _preferences_from

    argv = ["workloads", "prefer", "chat", "--prefer", "east,west", "--selector", "tier=gold"]
    args = build_parser("workloads").parse_args([*argv, "--strategy", "spread"])
    assert _preferences_from(args) == {
        "preferred_clusters": ["east", "west"],
        "cluster_selector": {"tier": "gold"},
        "strategy": "spread",
    }
    assert _preferences_from(build_parser("workloads").parse_args(argv[:3])) == {}
    bad = build_parser("workloads").parse_args([*argv[:3], "--selector", "gold"])
    with pytest.raises(ValueError, match="key=value"):
        _preferences_from(bad)
