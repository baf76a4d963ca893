"""`wingsmith operator`: the operator of one cluster, on Kubernetes or on a simulated cluster."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import socket

from wingsmith.adapters.kube import Kube, selector_matcher
from wingsmith.services.cli.shared import cluster_id, pod_defaults, stop_on_signals
from wingsmith.services.config import Settings, connect
from wingsmith.services.environment import host_port
from wingsmith.services.listening import serving_http
from wingsmith.services.metrics import new_registry, serving_metrics
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.backends.simulated import SimulatedCluster, nodes_from_spec
from wingsmith.services.operator.dgd import V1ALPHA1, V1BETA1
from wingsmith.services.operator.leader import Elector, LeaseTimes
from wingsmith.services.operator.metrics import OperatorMetrics
from wingsmith.services.operator.probes import probes_app
from wingsmith.services.operator.runtime import Backend, OperatorOptions, run_operator
from wingsmith.services.tasks import cancel_and_wait


def operator(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster-id", required=True, type=cluster_id, metavar="ID")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--kubeconfig", metavar="PATH", help="the cluster's kubeconfig")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    where.add_argument(
        "--simulated",
        metavar="SPEC",
        help="no Kubernetes: nodes as [COUNTx]GPUS:CLASS[@DOMAIN],...",
    )
    parser.add_argument(
        "--namespace", default="wingsmith", help="where rendered DynamoGraphDeployments go"
    )
    parser.add_argument(
        "--api-version",
        choices=[V1BETA1, V1ALPHA1],
        default=V1BETA1,
        help="the DynamoGraphDeployment version to render (v1alpha1: older Dynamo operators)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="observe and report, never write to the cluster "
        "(as HANGAR_OPERATOR_READ_ONLY / WINGSMITH_OPERATOR_READ_ONLY=true)",
    )
    parser.add_argument(
        "--pod-defaults",
        metavar="FILE",
        help="the cluster's pod needs (YAML or JSON), filling what a workload leaves unset "
        "(as WINGSMITH_OPERATOR_POD_DEFAULTS)",
    )
    parser.add_argument(
        "--probes",
        metavar="HOST:PORT",
        type=_address,
        help="serve /healthz and /readyz there, for the kubelet "
        "(as WINGSMITH_OPERATOR_PROBES; default: not served)",
    )
    parser.add_argument(
        "--pod-selector",
        metavar="SELECTOR",
        type=_selector,
        help="watch only the pods this label selector matches, on a large cluster, e.g. "
        "nvidia.com/dynamo-graph-deployment-name (as WINGSMITH_OPERATOR_POD_SELECTOR)",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="act only while holding the Lease wingsmith-operator-<cluster> in --namespace, so "
        "that of several replicas one acts (as WINGSMITH_OPERATOR_LEADER_ELECT=true)",
    )
    parser.add_argument(
        "--node-agents",
        action="store_true",
        help="node agents (`wingsmith node-agent`) run on the GPU nodes: report each replica "
        "with the device ids its node's agent gives, not stand-ins "
        "(as WINGSMITH_OPERATOR_NODE_AGENTS=true)",
    )
    parser.set_defaults(run=_operator)


def _address(text: str) -> tuple[str, int]:
    try:
        return host_port("--probes", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _selector(text: str) -> str:
    """A label selector, checked here rather than by the API server at the first list."""
    try:
        selector_matcher(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


async def _operator(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    leader_elect = args.leader_elect or settings.operator_leader_elect
    if args.pod_selector is None and settings.operator_pod_selector is not None:
        try:
            _selector(settings.operator_pod_selector)
        except argparse.ArgumentTypeError as e:
            raise SystemExit(f"WINGSMITH_OPERATOR_POD_SELECTOR: {e}") from None
    read_only = args.read_only or settings.operator_read_only
    if leader_elect and args.simulated:
        raise SystemExit("--leader-elect: a simulated cluster has no Lease to hold")
    if args.node_agents and args.simulated:
        raise SystemExit("--node-agents: a simulated cluster has no kubelet to read")
    if leader_elect and read_only:
        raise SystemExit("--leader-elect: a read-only operator writes nothing, not even a Lease")
    defaults = pod_defaults(args.pod_defaults or settings.operator_pod_defaults)
    stop = stop_on_signals()
    options = OperatorOptions(
        cluster_id=args.cluster_id,
        read_only=read_only,
        simulated=bool(args.simulated),
        sync_every=settings.operator_sync_every,
    )
    registry = new_registry()
    metrics = OperatorMetrics(args.cluster_id, registry)
    nc = await connect(settings, "wingsmith-operator", operator_of=args.cluster_id)
    try:
        async with contextlib.AsyncExitStack() as stack:
            url = await stack.enter_async_context(
                serving_metrics(registry, settings.metrics_listen, "the operator")
            )
            if url is not None:
                print(f"metrics: {url}", flush=True)
            if args.simulated:
                cluster = SimulatedCluster(
                    args.cluster_id,
                    nodes_from_spec(args.cluster_id, args.simulated),
                    read_only=options.read_only,
                    state_file=settings.data_dir / "simulated" / f"{args.cluster_id}.json",
                )
                backend: Backend = cluster
                faults = asyncio.create_task(cluster.serve_faults(nc), name="faults")
                stack.push_async_callback(cancel_and_wait, faults)
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
                    pod_defaults=defaults,
                    pod_selector=args.pod_selector or settings.operator_pod_selector,
                    node_agents=args.node_agents or settings.operator_node_agents,
                    metrics=metrics,
                )
            work = functools.partial(run_operator, nc, backend, options, metrics=metrics)
            if leader_elect:
                identity = f"{socket.gethostname()}-{os.getpid()}"
                times = LeaseTimes.scaled(settings.operator_lease_seconds)
                lease = f"wingsmith-operator-{args.cluster_id}"
                elector = Elector(kube, args.namespace, lease, identity, times)
                work = functools.partial(elector.lead, work)
                print(f"leader election: lease {args.namespace}/{lease} as {identity}", flush=True)
            running = asyncio.create_task(work(), name="operator")
            stack.push_async_callback(cancel_and_wait, running)
            if (probes := args.probes or settings.operator_probes) is not None:
                app = probes_app(
                    lambda: {"running": not running.done()},
                    lambda: {"nats_connected": nc.is_connected, **backend.readiness()},
                )
                host, port = probes
                served = await stack.enter_async_context(
                    serving_http(app, host, port, "the operator's probes")
                )
                print(f"probes: {served.url}/healthz and {served.url}/readyz", flush=True)
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
