"""`wingsmith`: run the hub, send commands, read events and views, audit and replay history."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from wingsmith.adapters import nats_bus
from wingsmith.adapters.checkpoints import CheckpointStore
from wingsmith.adapters.dead_letters import DEAD_PREFIX, DEAD_STREAM, Component
from wingsmith.adapters.kube import Kube
from wingsmith.adapters.store import StoreThread, store_env
from wingsmith.domain import subjects
from wingsmith.domain.commands import json_schemas
from wingsmith.domain.deployment import AdmissionPhase
from wingsmith.domain.values import Backend as EngineBackend
from wingsmith.domain.values import is_name
from wingsmith.projections.audit import Entry, Timeline
from wingsmith.projections.fleet import PROJECTIONS
from wingsmith.services.api.server import running_api
from wingsmith.services.cli.client import add_commands
from wingsmith.services.cli.terminal import Progress
from wingsmith.services.config import Settings, connect
from wingsmith.services.health import NoHealth, Status
from wingsmith.services.health import ask as ask_health
from wingsmith.services.hub.projector import as_of, compare, rebuild
from wingsmith.services.hub.relay import event_type
from wingsmith.services.hub.supervisor import READY
from wingsmith.services.hub.wiring import running_hub, running_projector
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.backends.simulated import (
    SimNode,
    SimulatedCluster,
    fault_subject,
    nodes_from_spec,
    simulated_operators,
)
from wingsmith.services.operator.dgd import render_yaml
from wingsmith.services.operator.inspect import inspect_dgd, load_manifest
from wingsmith.services.operator.runtime import Backend, OperatorOptions, run_operator


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(asyncio.run(args.run(args)) or 0)
    except (RuntimeError, ValueError, OSError, nats_bus.NatsError) as e:
        print(f"wingsmith: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wingsmith", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the hub until SIGINT/SIGTERM")
    up.add_argument(
        "--simulated",
        action="append",
        default=[],
        type=_simulated_cluster,
        metavar="ID=SPEC",
        help="also run an operator on a simulated cluster, e.g. east=2x8:H100@rack-a "
        "(nodes: [COUNTx]GPUS:CLASS[@DOMAIN], comma-separated); repeatable",
    )
    up.add_argument(
        "--demo",
        action="store_true",
        help="with --simulated: set a quota and create a workload that uses every cluster",
    )
    up.add_argument(
        "--no-api", action="store_true", help="do not serve the REST API (WINGSMITH_API_LISTEN)"
    )
    up.set_defaults(run=_up)

    api = sub.add_parser(
        "api", help="serve the REST API (WINGSMITH_API_LISTEN) until SIGINT/SIGTERM"
    )
    api.set_defaults(run=_api)

    operator = sub.add_parser(
        "operator", help="run the operator of one cluster until SIGINT/SIGTERM"
    )
    operator.add_argument("--cluster-id", required=True, type=_name, metavar="ID")
    where = operator.add_mutually_exclusive_group(required=True)
    where.add_argument("--kubeconfig", metavar="PATH", help="the cluster's kubeconfig")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    where.add_argument(
        "--simulated",
        metavar="SPEC",
        help="no Kubernetes: nodes as [COUNTx]GPUS:CLASS[@DOMAIN],...",
    )
    operator.add_argument(
        "--namespace", default="wingsmith", help="where rendered DynamoGraphDeployments go"
    )
    operator.add_argument(
        "--api-version",
        choices=["nvidia.com/v1beta1", "nvidia.com/v1alpha1"],
        default="nvidia.com/v1beta1",
        help="the DynamoGraphDeployment version to render (v1alpha1: older Dynamo operators)",
    )
    operator.set_defaults(run=_operator)

    render = sub.add_parser(
        "render", help="print the DynamoGraphDeployment (YAML) for a Deployment object (JSON)"
    )
    render.add_argument("file", help="a render object as published on wingsmith.render.>")
    render.add_argument("--namespace", default="wingsmith")
    render.add_argument(
        "--api-version",
        choices=["nvidia.com/v1beta1", "nvidia.com/v1alpha1"],
        default="nvidia.com/v1beta1",
    )
    render.set_defaults(run=_render)

    inspect = sub.add_parser(
        "inspect-dgd", help="print what runs in a DynamoGraphDeployment manifest, as JSON"
    )
    inspect.add_argument("file", help="a DynamoGraphDeployment (YAML or JSON; v1alpha1 or v1beta1)")
    inspect.set_defaults(run=_inspect_dgd)

    fault = sub.add_parser("sim-fault", help="inject a fault into a simulated cluster")
    fault.add_argument("cluster_id", metavar="CLUSTER")
    fault.add_argument(
        "fault",
        choices=["node_loss", "node_restore", "image_pull", "clear", "run_model", "stop_model"],
        help="run_model: start a model nobody declared, for the operator to discover",
    )
    fault.add_argument("--node", help="for node_loss and node_restore")
    fault.add_argument("--deployment", help="for image_pull and clear")
    fault.add_argument("--name", help="run_model, stop_model: its DynamoGraphDeployment name")
    fault.add_argument("--namespace", default="default", help="run_model, stop_model")
    fault.add_argument("--model", default="Qwen/Qwen3-8B", help="run_model")
    fault.add_argument("--backend", default="vllm", choices=[b.value for b in EngineBackend])
    fault.add_argument("--engine-version", default="0.9.2", help="run_model")
    fault.add_argument("--replicas", type=int, default=1, help="run_model")
    fault.add_argument("--gpus", type=int, default=1, help="run_model: per replica")
    fault.add_argument(
        "--args", default="", help="run_model: the engine's flags, e.g. '--max-model-len 8192'"
    )
    fault.set_defaults(run=_sim_fault)

    projector = sub.add_parser("projector", help="run the projector (`up` starts one itself)")
    projector.set_defaults(run=_projector)

    cmd = sub.add_parser("cmd", help="send one command and print the reply")
    cmd.add_argument("subject", help="e.g. project.set_quota or wingsmith.cmd.project.set_quota")
    cmd.add_argument("payload", help="the command as JSON; command_id is added when missing")
    cmd.add_argument("--timeout", type=float, default=10.0)
    cmd.set_defaults(run=_cmd)

    ping = sub.add_parser(
        "ping", help="the hub's health: exit 0 if healthy, 1 (saying what is wrong) if not"
    )
    ping.add_argument("--timeout", type=float, default=3.0)
    ping.add_argument("--json", action="store_true", help="the whole health report as JSON")
    ping.set_defaults(run=_ping)

    schema = sub.add_parser("schema", help="print the JSON Schema of every command")
    schema.set_defaults(run=_schema)

    events = sub.add_parser("events", help="print events from the WINGSMITH_EVENTS stream")
    events.add_argument("--aggregate", default="*", help="e.g. deployment")
    events.add_argument("--id", default="*", help="aggregate id, e.g. llama--east")
    events.add_argument("--type", default="*", help="event type, e.g. DeploymentScaled")
    events.add_argument("--since", type=int, default=1, metavar="SEQ", help="stream sequence")
    events.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    events.add_argument("--json", action="store_true", help="one JSON event per line")
    events.set_defaults(run=_events)

    dead = sub.add_parser(
        "dead-letters", help="print what the hub's stages set aside (stream WINGSMITH_DEAD)"
    )
    dead.add_argument("--component", default="*", choices=[*Component, "*"], help="default: all")
    dead.add_argument(
        "--since", type=_start, default=1, metavar="WHEN", help="a stream sequence, time or age"
    )
    dead.add_argument("-f", "--follow", action="store_true", help="keep printing new ones")
    dead.add_argument("--json", action="store_true", help="one JSON record per line")
    dead.set_defaults(run=_dead_letters)

    names = [kind.name for kind in PROJECTIONS]
    watch = sub.add_parser(
        "watch", help="print a projection's views, then every change to them as it happens"
    )
    watch.add_argument("projection", choices=names)
    watch.add_argument("--key", default=">", help="a view key, e.g. east.H100 (wildcards: * >)")
    watch.add_argument(
        "--since",
        type=_start,
        default="last",
        metavar="WHEN",
        help="now | a stream sequence | a time (2026-11-29T14:02:00Z) | an age (15m, 2h, 1d); "
        "default: the current views, then changes",
    )
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
    watch.set_defaults(run=_watch)

    view = sub.add_parser("view", help="print a projection's views, now or as of a past time")
    view.add_argument("projection", choices=names)
    view.add_argument("--key", help="one view key, e.g. east.H100")
    view.add_argument(
        "--as-of", type=_time, metavar="TIME", help="e.g. 2026-11-29T14:02:00Z, or an age: 2h"
    )
    view.add_argument("--json", action="store_true", help="the views as one JSON object")
    view.set_defaults(run=_view)

    audit = sub.add_parser("audit", help="an aggregate's history, or one causal chain")
    target = audit.add_mutually_exclusive_group(required=True)
    target.add_argument("ref", nargs="?", help="aggregate:id, e.g. deployment:llama--east")
    target.add_argument("--correlation", metavar="ID", help="every event of this correlation id")
    audit.add_argument(
        "--since", type=_time, metavar="TIME", help="with --correlation: search from this time"
    )
    audit.add_argument("--json", action="store_true", help="one JSON entry per line")
    audit.set_defaults(run=_audit)

    replay = sub.add_parser(
        "replay", help="rebuild every projection from the event store and compare with live"
    )
    replay.add_argument("--timeout", type=float, default=60.0, help="wait for the projector")
    replay.set_defaults(run=_replay)
    add_commands(sub)
    return parser


async def _up(args: argparse.Namespace) -> int:
    # The hub keeps many long-lived objects (aggregate cache, recent receipts); with CPython's
    # default thresholds full collections traverse them every few thousand commands, which
    # showed as 100-200 ms stalls at p99 in bench/ingest.py. Collect young objects less often.
    gc.set_threshold(50_000, 20, 20)
    settings = Settings.from_env()
    stop = _stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        hub = await stack.enter_async_context(running_hub(settings))
        store = settings.store_url or settings.data_dir / "events.sqlite"
        print(f"wingsmith hub ready: nats {hub.nats_url}, store {store}", flush=True)
        watched = list(hub.tasks)  # each runs until shutdown: one that ends is a failure
        if not args.no_api:
            api = await stack.enter_async_context(
                running_api(settings, hub.nats_url, local_token=True)
            )
            watched.append(api.task)
            configured = settings.api_tokens or settings.api_read_tokens
            token = "WINGSMITH_API_TOKENS" if configured else settings.api_token_file
            print(f"rest api: {api.url}/v1 (bearer token: {token})", flush=True)
        extras: list[asyncio.Task[None]] = []  # ours to stop
        if args.simulated:
            clusters = dict(args.simulated)
            state_dir = settings.data_dir / "simulated"
            await stack.enter_async_context(
                simulated_operators(
                    hub.nc, clusters, state_dir=state_dir, sync_every=settings.operator_sync_every
                )
            )
            names = ", ".join(f"{c} ({_devices(n)})" for c, n in clusters.items())
            print(f"simulated clusters: {names}", flush=True)
            # a laptop: say what happens to each deployment as it happens
            extras.append(asyncio.create_task(_phases(hub.store), name="wingsmith-phases"))
        if args.demo:
            await _demo(hub.nc, dict(args.simulated))
        stopping = asyncio.create_task(stop.wait(), name="wingsmith-signals")
        await asyncio.wait([stopping, *watched, *extras], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        failed = [t for t in watched + extras if t.done()]
        for task in failed:
            error = task.exception() if not task.cancelled() else None
            logging.error("%s stopped unexpectedly: %r; shutting down", task.get_name(), error)
        for task in extras:
            task.cancel()
        await asyncio.gather(*extras, return_exceptions=True)
        print("wingsmith hub stopping", flush=True)
    return 1 if failed else 0


def _simulated_cluster(text: str) -> tuple[str, list[SimNode]]:
    cluster_id, _, spec = text.partition("=")
    try:
        return _name(cluster_id), nodes_from_spec(cluster_id, spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text}: {e}") from None


def _name(text: str) -> str:
    if not is_name(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a cluster id is a DNS label (a-z, 0-9, -)")
    return text


def _devices(nodes: list[SimNode]) -> str:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.device_class] = counts.get(node.device_class, 0) + node.devices
    return ", ".join(f"{n} {device_class}" for device_class, n in counts.items())


async def _demo(nc: nats_bus.Connection, clusters: dict[str, list[SimNode]]) -> None:
    """A quota and a workload big enough to use every simulated cluster: placement, admission
    and the replicas' readiness show in the phases printed."""
    device_class = next(iter(clusters.values()))[0].device_class
    total = sum(
        n.devices for nodes in clusters.values() for n in nodes if n.device_class == device_class
    )
    commands = [
        ("project.set_quota", {"project": "demo", "device_class": device_class, "devices": total}),
        (
            "workload.create",
            {
                "workload_id": "demo-llama",
                "project": "demo",
                "device_class": device_class,
                "replicas": max(1, total // 2 - 1),
                "serving": {
                    "model": "meta-llama/Llama-3.1-8B-Instruct",
                    "backend": "vllm",
                    "engine_version": "0.4.1",
                    "devices_per_replica": 2,
                    "parallelism": {"tensor": 2},
                },
            },
        ),
    ]
    for subject, body in commands:
        body["command_id"] = f"demo-{subject}"
        reply: dict[str, Any] = {"error": "the hub did not answer"}
        for _ in range(50):  # the hub answers once its command service runs
            try:
                answer = await nats_bus.request(
                    nc, f"wingsmith.cmd.{subject}", orjson.dumps(body), 2.0
                )
            except nats_bus.NatsError:
                await asyncio.sleep(0.2)
                continue
            reply = orjson.loads(answer)
            break
        print(f"demo: {subject}: {'ok' if reply.get('ok') else reply.get('error')}", flush=True)


PHASE_EVENTS = {
    "DeploymentCreated": AdmissionPhase.PENDING,
    "DeploymentPlaced": AdmissionPhase.PLACED,
    "DeploymentRunning": AdmissionPhase.RUNNING,
    "DeploymentFailed": AdmissionPhase.FAILED,
}


async def _phases(store: StoreThread) -> None:
    """Print each deployment's admission phase as it changes (from now on), read from the event
    store."""
    phases: dict[str, str] = {}
    position = await store.run(store.store.last_position)  # from now: not the whole history
    while True:
        notes = await store.run(store.store.read, position, 1000)
        for note in notes:
            kind = event_type(note.topic)
            if not str(note.originator_id).startswith("deployment:"):
                continue
            e = orjson.loads(note.state)
            phase = e.get("phase") or PHASE_EVENTS.get(kind)
            deployment_id = str(note.originator_id).removeprefix("deployment:")
            if phase is None or phases.get(deployment_id) == phase:
                continue
            before, phases[deployment_id] = phases.get(deployment_id), phase
            why = e.get("reason") or (f"{e['devices']} devices" if e.get("devices") else "")
            arrow = f"{before} -> {phase}" if before else phase
            print(f"deployment {deployment_id}: {arrow}" + (f" ({why})" if why else ""), flush=True)
        position = notes[-1].id if notes else position
        if not notes:
            await asyncio.sleep(0.3)


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: long-running commands shut down cleanly on either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _api(args: argparse.Namespace) -> int:
    stop = _stop_on_signals()
    async with running_api(Settings.from_env()) as api:
        print(f"wingsmith rest api: {api.url}/v1", flush=True)
        stopping = asyncio.create_task(stop.wait(), name="wingsmith-signals")
        await asyncio.wait([stopping, api.task], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if api.task.done():
            error = None if api.task.cancelled() else api.task.exception()
            logging.error("the API server stopped unexpectedly: %r", error)
            return 1
    return 0


async def _projector(args: argparse.Namespace) -> int:
    stop = _stop_on_signals()
    async with running_projector(Settings.from_env()):
        print(READY, flush=True)  # for the hub that supervises this process
        await stop.wait()
    return 0


async def _operator(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    stop = _stop_on_signals()
    options = OperatorOptions(
        cluster_id=args.cluster_id,
        read_only=settings.operator_read_only,
        simulated=bool(args.simulated),
        sync_every=settings.operator_sync_every,
    )
    nc = await connect(settings, "wingsmith-operator", operator_of=args.cluster_id)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if args.simulated:
                cluster = SimulatedCluster(
                    args.cluster_id,
                    nodes_from_spec(args.cluster_id, args.simulated),
                    read_only=options.read_only,
                    state_file=settings.data_dir / "simulated" / f"{args.cluster_id}.json",
                )
                backend: Backend = cluster
                faults = asyncio.create_task(cluster.serve_faults(nc), name="faults")
                stack.push_async_callback(nats_bus.cancel_and_wait, faults)
            else:
                kube = await stack.enter_async_context(
                    Kube(kubeconfig=args.kubeconfig, in_cluster=args.in_cluster)
                )
                backend = KubeBackend(
                    kube,
                    args.cluster_id,
                    args.namespace,
                    read_only=options.read_only,
                    api_version=args.api_version,
                )
            running = asyncio.create_task(run_operator(nc, backend, options), name="operator")
            mode = "read-only" if options.read_only else "read-write"
            print(f"wingsmith operator for {args.cluster_id} ready ({mode})", flush=True)
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([running, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in (running, stopping):
                task.cancel()
            await asyncio.gather(running, stopping, return_exceptions=True)
    finally:
        await nc.close()
    return 0


async def _render(args: argparse.Namespace) -> int:
    try:
        desired = orjson.loads(Path(args.file).read_bytes())
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{args.file}: not JSON: {e}") from None
    print(render_yaml(desired, namespace=args.namespace, api_version=args.api_version), end="")
    return 0


async def _inspect_dgd(args: argparse.Namespace) -> int:
    manifest = load_manifest(Path(args.file).read_text())
    summary = inspect_dgd(manifest).summary()
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    return 0


async def _sim_fault(args: argparse.Namespace) -> int:
    body = {"fault": args.fault, "node": args.node, "deployment_id": args.deployment}
    if args.fault in {"run_model", "stop_model"}:
        body |= {
            "namespace": args.namespace,
            "name": args.name,
            "model": args.model,
            "backend": args.backend,
            "engine_version": args.engine_version,
            "replicas": args.replicas,
            "gpus": args.gpus,
            "args": shlex.split(args.args),
        }
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        reply = await nats_bus.request(nc, fault_subject(args.cluster_id), orjson.dumps(body), 5.0)
    finally:
        await nc.close()
    print(reply.decode())
    return 0 if orjson.loads(reply).get("ok") else 1


async def _cmd(args: argparse.Namespace) -> int:
    try:
        body: Any = orjson.loads(args.payload)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"payload is not valid JSON: {e}") from None
    if isinstance(body, dict) and "command_id" not in body:
        body["command_id"] = f"cli-{uuid.uuid4().hex}"
    subject = (
        args.subject if args.subject.startswith("wingsmith.") else f"wingsmith.cmd.{args.subject}"
    )
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        reply = await nats_bus.request(nc, subject, orjson.dumps(body), args.timeout)
    finally:
        await nc.close()
    print(orjson.dumps(orjson.loads(reply), option=orjson.OPT_INDENT_2).decode())
    return 0 if orjson.loads(reply).get("ok") else 1


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


async def _schema(args: argparse.Namespace) -> int:
    print(orjson.dumps(json_schemas(), option=orjson.OPT_INDENT_2).decode())
    return 0


async def _events(args: argparse.Namespace) -> int:
    parts = (args.aggregate, args.id, args.type)
    subject = ".".join([subjects.EVENTS, *(p if p == "*" else subjects.token(p) for p in parts)])
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        stream = nats_bus.read_stream(
            nc, nats_bus.EVENTS_STREAM, subject, follow=args.follow, start=args.since
        )
        with contextlib.suppress(asyncio.CancelledError):
            async for message in stream:
                print(_event_line(message, as_json=args.json), flush=True)
    finally:
        await nc.close()
    return 0


def _event_line(message: nats_bus.StreamMessage, *, as_json: bool) -> str:
    if as_json:
        return message.data.decode()
    e = orjson.loads(message.data)
    inner = e["event"]
    data = {
        k: v for k, v in inner.items() if k not in {"timestamp", "command_id", "correlation_id"}
    }
    return (
        f"{message.seq:>6} {inner['timestamp'][:23]} {e['aggregate']}/{e['aggregate_id']} "
        f"v{e['version']} {e['type']} cmd={inner['command_id']} "
        f"{orjson.dumps(data).decode()}"
    )


async def _dead_letters(args: argparse.Namespace) -> int:
    subject = f"{DEAD_PREFIX}.{args.component}"
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        stream = nats_bus.read_stream(
            nc, DEAD_STREAM, subject, follow=args.follow, start=args.since
        )
        with contextlib.suppress(asyncio.CancelledError):
            async for m in stream:
                if args.json:
                    print(m.data.decode(), flush=True)
                    continue
                r = orjson.loads(m.data)
                at, component, what = r["at"][:19], r["component"], r["subject"]
                print(f"{m.seq:>6} {at} {component:<9} {what!r}: {r['reason']}", flush=True)
    finally:
        await nc.close()
    return 0


AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _time(text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or an age such as 15m, 2h or 1d."""
    text = text.strip()
    if text[:-1].isdigit() and text[-1:] in AGES:
        return datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * AGES[text[-1]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time nor an age such as 15m, 2h or 1d"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _start(text: str) -> nats_bus.Start:
    if text in ("now", "last"):
        return "new" if text == "now" else "last"
    return int(text) if text.isdigit() else _time(text)


async def _watch(args: argparse.Namespace) -> int:
    stream_name, prefix = nats_bus.view_stream(args.projection)
    subject, prefix = f"{prefix}.{subjects.filter_tokens(args.key)}", f"{prefix}."
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        stream = nats_bus.read_stream(nc, stream_name, subject, follow=True, start=args.since)
        with contextlib.suppress(asyncio.CancelledError):
            async for m in stream:
                key, position = (
                    subjects.key_value(m.subject.removeprefix(prefix)),
                    int(m.headers[nats_bus.POSITION_HEADER]),
                )
                view = None if m.headers.get(nats_bus.DELETED_HEADER) else orjson.loads(m.data)
                if args.json:
                    line = orjson.dumps(
                        {
                            "seq": m.seq,
                            "time": m.time.isoformat(),
                            "key": key,
                            "position": position,
                            "view": view,
                        }
                    ).decode()
                else:
                    shown = "(removed)" if view is None else orjson.dumps(view).decode()
                    line = f"{m.seq:>6} {m.time:%Y-%m-%d %H:%M:%S} {key} @{position} {shown}"
                print(line, flush=True)
    finally:
        await nc.close()
    return 0


async def _view(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.as_of is None:
        nc = await connect(settings, "wingsmith-cli")
        try:
            live = await nats_bus.latest_views(nc, args.projection)
        finally:
            await nc.close()
        views = {key: orjson.loads(v) for key, (_, v) in sorted(live.items()) if v is not None}
    else:
        kind = next(k for k in PROJECTIONS if k.name == args.projection)
        async with _store(settings) as (store, checkpoints):
            read = store.store.read
            [projection] = await store.run(as_of, read, checkpoints, args.as_of, [kind])
        views = dict(sorted(projection.views.items()))
    if args.key is not None:
        if args.key not in views:
            when = f" as of {args.as_of.isoformat()}" if args.as_of else ""
            print(f"wingsmith: no {args.projection} view {args.key!r}{when}", file=sys.stderr)
            return 1
        views = {args.key: views[args.key]}
    if args.json:
        print(orjson.dumps(views, option=orjson.OPT_INDENT_2).decode())
    else:
        for key, view in views.items():
            print(f"{key}  {orjson.dumps(view).decode()}")
    return 0


@contextlib.asynccontextmanager
async def _store(settings: Settings) -> AsyncIterator[tuple[StoreThread, CheckpointStore]]:
    """The event store and its checkpoints, read directly (the same settings as the hub)."""
    env = store_env(settings.store_url, settings.data_dir)
    store = await StoreThread.open(env)
    try:
        checkpoints = await store.run(CheckpointStore, env)
        try:
            yield store, checkpoints
        finally:
            await store.run(checkpoints.close)
    finally:
        await store.close()


async def _audit(args: argparse.Namespace) -> int:
    if args.ref is not None:
        kind, _, key = args.ref.replace("/", ":", 1).partition(":")
        if not (kind.isascii() and kind.isalpha()) or not key:
            raise ValueError(
                f"{args.ref!r} is not an aggregate reference like deployment:llama--east"
            )
        subject = f"{subjects.EVENTS}.{kind}.{subjects.token(key)}.*"
        start, wanted = 1, None
    else:
        subject, start, wanted = "wingsmith.evt.>", args.since or 1, args.correlation
    needle = orjson.dumps(wanted)
    timeline = Timeline()
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        stream = nats_bus.read_stream(
            nc, nats_bus.EVENTS_STREAM, subject, follow=False, start=start
        )
        async for m in stream:
            if wanted is None or needle in m.data:  # cheap test before decoding
                e = orjson.loads(m.data)
                if wanted is None or e["event"]["correlation_id"] == wanted:
                    timeline.apply(e)
    finally:
        await nc.close()
    if not timeline.entries:
        print(f"wingsmith: no events for {args.ref or args.correlation!r}", file=sys.stderr)
        return 1
    for entry in timeline.entries:
        print(orjson.dumps(entry.as_dict()).decode() if args.json else _audit_line(entry))
    return 0


def _audit_line(entry: Entry) -> str:
    changes = ", ".join(
        f"{name}={_short(c.after)}"
        if c.before is None
        else f"{name}: {_short(c.before)} → {_short(c.after)}"
        for name, c in entry.changes.items()
    )
    return (
        f"{entry.timestamp[:23]:23} {entry.aggregate}:{entry.aggregate_id} v{entry.version} "
        f"{entry.type}  {changes or '-'}  cmd={entry.command_id} corr={entry.correlation_id}"
    )


def _short(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


async def _replay(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    async with _store(settings) as (store, _):
        last = await store.run(store.store.last_position)
        bar = Progress("rebuilding", last)

        def read(after: int, limit: int) -> list[Any]:
            return store.store.read(after, limit, last)

        rebuilt = await store.run(rebuild, read, progress=bar.update)
        bar.close()
    upto = rebuilt.last_applied
    nc = await connect(settings, "wingsmith-cli")
    try:
        await _projector_reached(nc, upto, args.timeout)
        verdicts = [
            compare(p, upto, await nats_bus.latest_views(nc, p.name)) for p in rebuilt.projections
        ]
    finally:
        await nc.close()
    print(f"rebuilt from the store up to position {last:,} (last event at {upto:,})")
    print(f"{'PROJECTION':20} {'VIEWS':>8} {'EQUAL':>8} {'CHANGED SINCE':>14} {'MISMATCHED':>11}")
    for v in verdicts:
        views = v.equal + len(v.mismatched)
        print(
            f"{v.projection:20} {views:>8,} {v.equal:>8,} {v.newer:>14,} {len(v.mismatched):>11,}"
        )
        for problem in v.mismatched[:20]:
            print(f"  {problem}")
    mismatched = sum(len(v.mismatched) for v in verdicts)
    print("the live views equal the rebuild" if not mismatched else f"{mismatched} views differ")
    return 0 if not mismatched else 1


async def _projector_reached(nc: nats_bus.Connection, position: int, timeout: float) -> None:
    """Wait until the live projector has applied every event up to `position`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        progress = await nats_bus.projector_progress(nc)
        reached = progress["position"] if progress else 0
        if reached >= position:
            return
        if loop.time() > deadline:
            raise RuntimeError(
                f"the projector has applied events up to position {reached:,}, not yet "
                f"{position:,}; is it running? (waited {timeout:.0f}s)"
            )
        await asyncio.sleep(0.2)
