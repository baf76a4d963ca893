"""`wingsmith node-agent`: the node agent of one node (services/operator/agent.py)."""

from __future__ import annotations

import argparse
import asyncio

from wingsmith.domain.contracts.reports import NodeDevicesReport
from wingsmith.domain.values import Subdomain
from wingsmith.services.cli.shared import cluster_id, stop_on_signals
from wingsmith.services.config import Settings, connect
from wingsmith.services.operator import agent
from wingsmith.services.tasks import Backoff, cancel_and_wait, supervise

RESTART = Backoff(first=1.0, cap=30.0, jitter=0.5)  # after NATS or the kubelet failed a read


def node_agent(parser: argparse.ArgumentParser) -> None:
    from wingsmith.adapters.podresources import DEFAULT_SOCKET

    parser.add_argument("--cluster-id", required=True, type=cluster_id, metavar="ID")
    parser.add_argument(
        "--node",
        metavar="NAME",
        type=_node_name,
        help="the node it runs on (default: WINGSMITH_NODE_NAME, set from spec.nodeName)",
    )
    parser.add_argument(
        "--socket", default=DEFAULT_SOCKET, help="the kubelet's pod-resources socket"
    )
    parser.add_argument(
        "--resource",
        action="append",
        metavar="NAME",
        help=f"an extended resource whose devices to report, once per resource "
        f"(default: {', '.join(agent.DEFAULT_RESOURCES)})",
    )
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=agent.DEFAULT_INTERVAL,
        help=f"seconds between two reads of the kubelet (default {agent.DEFAULT_INTERVAL:g}); "
        f"what did not change is published every {agent.REFRESHES} reads",
    )
    parser.set_defaults(run=_node_agent)


def _node_name(text: str) -> str:
    """A node's name as Kubernetes allows it (a DNS subdomain)."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(Subdomain).validate_python(text)
    except ValidationError as e:
        raise argparse.ArgumentTypeError(e.errors()[0]["msg"]) from None


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0.1 <= seconds <= 600:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds from 0.1 to 600")
    return seconds


async def _node_agent(args: argparse.Namespace) -> int:
    from wingsmith.adapters import nats_bus
    from wingsmith.adapters.podresources import PodResources

    settings = Settings.from_env()
    node = args.node or settings.node_name
    if node is None:
        raise SystemExit("--node: give the node's name, or set WINGSMITH_NODE_NAME")
    if args.node is None:
        try:
            node = _node_name(node)
        except argparse.ArgumentTypeError as e:
            raise SystemExit(f"WINGSMITH_NODE_NAME: {e}") from None
    resources = args.resource or list(agent.DEFAULT_RESOURCES)
    stop = stop_on_signals()
    nc = await connect(settings, "wingsmith-node-agent", operator_of=args.cluster_id)
    kubelet = PodResources(args.socket)

    async def publish(report: NodeDevicesReport, msg_id: str) -> None:
        await nats_bus.publish_node_devices(nc, args.cluster_id, node, report.wire(), msg_id)

    async def run() -> None:
        await agent.run_agent(
            kubelet, publish, args.cluster_id, node, resources=resources, interval=args.interval
        )

    try:
        running = asyncio.create_task(supervise("node agent", run, RESTART, logger=agent.log))
        print(
            f"wingsmith node-agent for node {node} of {args.cluster_id}: reading {args.socket}",
            flush=True,
        )
        await stop.wait()
        await cancel_and_wait(running)
    finally:
        await kubelet.close()
        await nc.close()
    return 0
