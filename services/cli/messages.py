"""`wingsmith cmd`, `ping`, `sim-fault` and `schema`: one message to the hub (or to a simulated
cluster) over NATS and its reply, and the JSON Schema of every command."""

from __future__ import annotations

import argparse
import shlex
import sys
import uuid
from typing import Any

import orjson

from wingsmith.adapters import nats_bus
from wingsmith.domain import names
from wingsmith.domain.commands import json_schemas
from wingsmith.domain.values import Backend as EngineBackend
from wingsmith.services.config import Settings, connect
from wingsmith.services.health import NoHealth, Status
from wingsmith.services.health import ask as ask_health
from wingsmith.services.operator.backends.simulated import FAULTS as SIMULATED_FAULTS
from wingsmith.services.operator.backends.simulated import POD_FAULTS


def sim_fault(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cluster_id", metavar="CLUSTER")
    parser.add_argument(
        "fault",
        choices=list(SIMULATED_FAULTS),
        help="image_pull, crash_loop, oom_kill: pods fail (transient); refuse: the API server "
        "refuses the deployment (permanent); clear: ends them; run_model: start a model nobody "
        "declared, for the operator to discover; model_loaded: one run with --loading is ready",
    )
    parser.add_argument("--node", help="for node_loss and node_restore")
    parser.add_argument(
        "--deployment", help="for image_pull, crash_loop, oom_kill, refuse and clear"
    )
    parser.add_argument("--reason", help="refuse: the API server's reason (default Invalid)")
    parser.add_argument("--message", help="refuse: the API server's message")
    models = "run_model, model_loaded, stop_model"
    parser.add_argument("--name", help=f"{models}: its DynamoGraphDeployment name")
    parser.add_argument("--namespace", default="default", help=models)
    parser.add_argument("--model", default="Qwen/Qwen3-8B", help="run_model")
    parser.add_argument("--backend", default="vllm", choices=[b.value for b in EngineBackend])
    parser.add_argument(
        "--engine-version",
        default="1.0.1",
        help="run_model: the version its image is tagged with (a Dynamo release)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        help="run_model: how many (default 1); a pod fault: how many replicas it hits "
        "(default all)",
    )
    parser.add_argument("--gpus", type=int, default=1, help="run_model: per replica")
    parser.add_argument(
        "--args", default="", help="run_model: the engine's flags, e.g. '--max-model-len 8192'"
    )
    parser.add_argument(
        "--loading",
        action="store_true",
        help="run_model: its pods stay not ready until model_loaded (weights still loading)",
    )
    parser.set_defaults(run=_sim_fault)


async def _sim_fault(args: argparse.Namespace) -> int:
    body = {"fault": args.fault, "node": args.node, "deployment_id": args.deployment}
    if args.fault in POD_FAULTS and args.replicas is not None:
        body["replicas"] = args.replicas
    if args.fault == "refuse":
        body |= {"reason": args.reason, "message": args.message}
    if args.fault in {"run_model", "model_loaded", "stop_model"}:
        body |= {"namespace": args.namespace, "name": args.name}
    if args.fault == "run_model":
        body |= {
            "model": args.model,
            "backend": args.backend,
            "engine_version": args.engine_version,
            "replicas": 1 if args.replicas is None else args.replicas,
            "gpus": args.gpus,
            "args": shlex.split(args.args),
            "loading": args.loading,
        }
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        reply = await nats_bus.request(
            nc, names.fault_subject(args.cluster_id), orjson.dumps(body), 5.0
        )
    finally:
        await nc.close()
    print(reply.decode())
    return 0 if orjson.loads(reply).get("ok") else 1


def cmd(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("subject", help="e.g. project.set_quota or wingsmith.cmd.project.set_quota")
    parser.add_argument("payload", help="the command as JSON; command_id is added when missing")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.set_defaults(run=_cmd)


async def _cmd(args: argparse.Namespace) -> int:
    try:
        body: Any = orjson.loads(args.payload)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"payload is not valid JSON: {e}") from None
    if isinstance(body, dict) and "command_id" not in body:
        body["command_id"] = f"cli-{uuid.uuid4().hex}"
    subject = (
        args.subject
        if args.subject.startswith("wingsmith.")
        else names.command_subject(args.subject)
    )
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        reply = await nats_bus.request(nc, subject, orjson.dumps(body), args.timeout)
    finally:
        await nc.close()
    print(orjson.dumps(orjson.loads(reply), option=orjson.OPT_INDENT_2).decode())
    return 0 if orjson.loads(reply).get("ok") else 1


def ping(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--json", action="store_true", help="the whole health report as JSON")
    parser.set_defaults(run=_ping)


async def _ping(args: argparse.Namespace) -> int:
    """Ask the hub for its health: every stage from the store to the views (services/health.py).
    Exit 1 when it is unhealthy or does not answer, printing what is wrong."""
    nc = await connect(Settings.from_env(), "wingsmith-ping")
    try:
        report = await ask_health(nc, args.timeout)
    except NoHealth as e:
        print(f"unhealthy: {e}", file=sys.stderr)
        return 1
    finally:
        await nc.close()
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        for check in report.checks:
            if check.status is not Status.OK or args.verbose:
                print(f"{check.status}: {check.stage}: {check.detail}")
        print("healthy" if report.healthy else "unhealthy")
    return 0 if report.healthy else 1


def schema(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(run=_schema)


async def _schema(args: argparse.Namespace) -> int:
    print(orjson.dumps(json_schemas(), option=orjson.OPT_INDENT_2).decode())
    return 0
