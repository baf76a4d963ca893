"""`wingsmith up`, `api` and `projector`: the hub and the REST API, together or one at a time.

`up` runs a whole Wingsmith in one process (the hub, the API, and simulated clusters if asked);
`api` and `projector` run one part alone (the hub starts its projector with `projector`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from wingsmith.adapters import nats_bus
from wingsmith.adapters.store import StoreThread
from wingsmith.domain import names
from wingsmith.domain.deployment import AdmissionPhase
from wingsmith.services.api.server import running_api
from wingsmith.services.cli.shared import cluster_id, stop_on_signals
from wingsmith.services.config import Settings
from wingsmith.services.hub.relay import event_type
from wingsmith.services.hub.supervisor import READY
from wingsmith.services.hub.wiring import running_hub, running_projector
from wingsmith.services.metrics import new_registry, serving_metrics
from wingsmith.services.operator.backends.simulated import (
    SimNode,
    nodes_from_spec,
    simulated_operators,
)

# The hub keeps many long-lived objects (aggregate cache, recent receipts, the scheduler's
# ledger); with CPython's default thresholds full collections traverse them every few thousand
# commands, which showed as 100-200 ms stalls at p99 in bench/ingest.py. Collect young objects
# less often. bench/admission.py runs the ledger under the same thresholds.
GC_THRESHOLDS = (50_000, 20, 20)


def up(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulated",
        action="append",
        default=[],
        type=_simulated_cluster,
        metavar="ID=SPEC",
        help="also run an operator on a simulated cluster, e.g. east=2x8:H100@rack-a "
        "(nodes: [COUNTx]GPUS:CLASS[@DOMAIN], comma-separated); repeatable",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="with --simulated: set a quota and create a workload that uses every cluster",
    )
    parser.add_argument(
        "--no-api", action="store_true", help="do not serve the REST API (WINGSMITH_API_LISTEN)"
    )
    parser.set_defaults(run=_up)


async def _up(args: argparse.Namespace) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    settings = Settings.from_env()
    stop = stop_on_signals()
    registry = new_registry()  # one for the process: the hub's, the API's, the operators'
    async with contextlib.AsyncExitStack() as stack:
        hub = await stack.enter_async_context(running_hub(settings, registry))
        store = settings.store_url or settings.data_dir / "events.sqlite"
        print(f"wingsmith hub ready: nats {hub.nats_url}, store {store}", flush=True)
        await _serve_metrics(stack, registry, settings, "the hub")
        watched = list(hub.tasks)  # each runs until shutdown: one that ends is a failure
        if not args.no_api:
            server = await stack.enter_async_context(
                running_api(settings, hub.nats_url, local_token=True, registry=registry)
            )
            watched.append(server.task)
            configured = settings.api_tokens or settings.api_read_tokens
            token = "WINGSMITH_API_TOKENS" if configured else settings.api_token_file
            print(f"rest api: {server.url}/v1 (bearer token: {token})", flush=True)
        extras: list[asyncio.Task[None]] = []  # ours to stop
        if args.simulated:
            clusters = dict(args.simulated)
            state_dir = settings.data_dir / "simulated"
            await stack.enter_async_context(
                simulated_operators(
                    hub.nc,
                    clusters,
                    state_dir=state_dir,
                    sync_every=settings.operator_sync_every,
                    read_only=settings.operator_read_only,
                    registry=registry,
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


async def _serve_metrics(
    stack: contextlib.AsyncExitStack, registry: CollectorRegistry, settings: Settings, what: str
) -> None:
    """The process's metrics on WINGSMITH_METRICS_LISTEN, if set, until the stack closes."""
    url = await stack.enter_async_context(serving_metrics(registry, settings.metrics_listen, what))
    if url is not None:
        print(f"metrics: {url}", flush=True)


def _simulated_cluster(text: str) -> tuple[str, list[SimNode]]:
    name, _, spec = text.partition("=")
    try:
        return cluster_id(name), nodes_from_spec(name, spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text}: {e}") from None


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
                    "runtime_release": "1.0.1",
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
                    nc, names.command_subject(subject), orjson.dumps(body), 2.0
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


def api(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(run=_api)


async def _api(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    settings, registry = Settings.from_env(), new_registry()
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(running_api(settings, registry=registry))
        print(f"wingsmith rest api: {server.url}/v1", flush=True)
        await _serve_metrics(stack, registry, settings, "the API")
        stopping = asyncio.create_task(stop.wait(), name="wingsmith-signals")
        await asyncio.wait([stopping, server.task], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if server.task.done():
            error = None if server.task.cancelled() else server.task.exception()
            logging.error("the API server stopped unexpectedly: %r", error)
            return 1
    return 0


def projector(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(run=_projector)


async def _projector(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    async with running_projector(Settings.from_env()):
        print(READY, flush=True)  # for the hub that supervises this process
        await stop.wait()
    return 0
