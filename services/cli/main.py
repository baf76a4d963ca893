"""`wingsmith`: run the hub, send commands, read events and views, audit and replay history."""

# The parser is built from this module alone. Each command's arguments and code live in the
# module COMMANDS names for it, imported only when that command is chosen: `wingsmith --help`
# loads none of them, and the REST commands load neither the hub, the API server nor the
# Kubernetes client (tests/unit/services/test_cli.py, bench/cli.py).

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from wingsmith import __version__

PACKAGE = "wingsmith.services.cli"


class Command(NamedTuple):
    """A subcommand: `where` names the function ("module:function", in this package) that adds
    its arguments to its parser and sets `run`, the coroutine that does the work."""

    where: str
    help: str


COMMANDS = {
    "up": Command("hub:up", "run the hub until SIGINT/SIGTERM"),
    "api": Command("hub:api", "serve the REST API (WINGSMITH_API_LISTEN) until SIGINT/SIGTERM"),
    "operator": Command(
        "operator:operator", "run the operator of one cluster until SIGINT/SIGTERM"
    ),
    "node-agent": Command(
        "node_agent:node_agent",
        "report which devices each pod on this node holds, from the kubelet, until stopped",
    ),
    "nats-config": Command(
        "install:nats_config",
        "print the NATS servers' users for an installation's clusters (passwords: references)",
    ),
    "render": Command(
        "manifests:render",
        "print the DynamoGraphDeployment (YAML) for a Deployment object (JSON)",
    ),
    "inspect-dgd": Command(
        "manifests:inspect_dgd", "print what runs in a DynamoGraphDeployment manifest, as JSON"
    ),
    "sim-fault": Command("messages:sim_fault", "inject a fault into a simulated cluster"),
    "projector": Command("hub:projector", "run the projector (`up` starts one itself)"),
    "cmd": Command("messages:cmd", "send one command and print the reply"),
    "ping": Command(
        "messages:ping",
        "the hub's health: exit 0 if healthy, 1 (saying what is wrong) if not",
    ),
    "schema": Command("messages:schema", "print the JSON Schema of every command"),
    "events": Command("history:events", "print events from the WINGSMITH_EVENTS stream"),
    "dead-letters": Command(
        "history:dead_letters", "print what the hub's stages set aside (stream WINGSMITH_DEAD)"
    ),
    "watch": Command(
        "history:watch", "print a projection's views, then every change to them as it happens"
    ),
    "view": Command("history:view", "print a projection's views, now or as of a past time"),
    "audit": Command("history:audit", "an aggregate's history, or one causal chain"),
    "replay": Command(
        "history:replay", "rebuild every projection from the event store and compare with live"
    ),
    "backup": Command(
        "backup:backup", "copy the SQLite event store to a file, consistently, while the hub runs"
    ),
}

# Verbs of a command, each a command line of its own: `wingsmith operator manifests …` prints
# the manifests that install `wingsmith operator` in a cluster. A verb is the word right after
# its command; without one the command is itself (`wingsmith operator --cluster-id …` runs the
# operator, as it always has).
VERBS = {
    "operator": {
        "manifests": Command(
            "install:operator_manifests",
            "print the operator's install manifests for one cluster (YAML, for kubectl apply -f -)",
        ),
    },
}

# The REST API's resources, each with its actions: client:add_commands adds all of them at once
# (with these help lines, which `wingsmith --help` shows without importing it).
RESOURCES = {
    "workloads": "declare, scale, change and delete workloads (REST API)",
    "deployments": "deployments: status, replicas, authority (REST API)",
    "discovered": "models found running that nobody declared (REST API)",
    "projects": "projects and their quotas (REST API)",
    "clusters": "clusters, their operators and capacity (REST API)",
}

Adds = Callable[[Any], None]  # given the command's parser (or, for the resources, the subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = chosen_command(argv)
    args = build_parser(command, chosen_verb(argv, command)).parse_args(argv)
    return _run(args, command)


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command named on the command line: its first word that is not an option (no option
    before the command takes a value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def chosen_verb(argv: Sequence[str], command: str | None) -> str | None:
    """The command's verb named on the command line: the word right after the command."""
    if command not in VERBS:
        return None
    following = argv[argv.index(command) + 1 :]
    return following[0] if following and following[0] in VERBS[command] else None


def build_parser(command: str | None = None, verb: str | None = None) -> argparse.ArgumentParser:
    """The command line, complete for `command` (or its `verb`); every other command has only
    its help line, which is all `wingsmith --help` shows of it."""
    parser = argparse.ArgumentParser(prog="wingsmith", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--log-format",
        choices=["auto", "text", "json"],
        default=None,
        help="log lines as text or JSON objects (default: WINGSMITH_LOG_FORMAT, else auto: "
        "text on a terminal, JSON otherwise)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    for name, (where, help) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help, epilog=_verbs_help(name))
        if name == command and verb is not None:
            verbs = command_parser.add_subparsers(required=True, metavar="VERB")
            verb_where, verb_help = VERBS[name][verb]
            _load(verb_where)(verbs.add_parser(verb, help=verb_help))
        elif name == command:
            _load(where)(command_parser)
    if command in RESOURCES:
        _load("client:add_commands")(sub)
    else:
        for name, help in RESOURCES.items():
            sub.add_parser(name, help=help)
    return parser


def _verbs_help(command: str) -> str | None:
    verbs = VERBS.get(command, {})
    listed = "; ".join(f"`wingsmith {command} {verb}`: {help}" for verb, (_, help) in verbs.items())
    return f"Also {listed}. See `wingsmith {command} VERB --help`." if verbs else None


def _load(where: str) -> Adds:
    module, _, function = where.partition(":")
    adds: Adds = getattr(importlib.import_module(f"{PACKAGE}.{module}"), function)
    return adds


def _run(args: argparse.Namespace, command: str | None) -> int:
    # Imported here, not above: `--help` and `--version` exit before this and need neither.
    import asyncio
    import logging
    import os

    from wingsmith.adapters import tracing
    from wingsmith.services import logs

    try:
        log_format = args.log_format or os.environ.get("WINGSMITH_LOG_FORMAT") or "auto"
        logs.configure(log_format, logging.INFO if args.verbose else logging.WARNING)
        tracing.configure_from_env(f"wingsmith-{SERVICES.get(command or '', 'cli')}")
        return int(asyncio.run(args.run(args)) or 0)
    except _failures() as e:
        print(f"wingsmith: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        tracing.shutdown()


# What a process's spans name it (`wingsmith-<name>`) unless OTEL_SERVICE_NAME does, by its
# command; every other command is `wingsmith-cli`.
SERVICES = {"up": "hub", "api": "api", "operator": "operator", "projector": "projector"}


def _failures() -> tuple[type[Exception], ...]:
    """The errors a command reports in one line rather than a traceback. NATS's count only if the
    command used NATS: naming them would import the NATS client into every command."""
    nats_bus = sys.modules.get("wingsmith.adapters.nats_bus")
    nats_errors = (nats_bus.NatsError,) if nats_bus is not None else ()
    return (RuntimeError, ValueError, OSError, *nats_errors)
