"""The operator's runtime, the same for a Kubernetes cluster and a simulated one.

It follows the cluster's render objects (`wingsmith.render.<cluster>.>`, from the latest message
of every deployment on), hands each to the backend, publishes what the backend observes on
`wingsmith.obs.<cluster>.<kind>`, and sends a heartbeat every few seconds so the hub knows the
cluster is there. A render object is acknowledged once the backend has applied it; one it
could not apply comes back later.

What the backend observes goes up as changes (deltas). Any of them may be lost (the operator
killed between a change and its report) or overtaken, so the runtime also syncs: on start, for
each deployment once its render object is applied, and every `sync_every` seconds after, it
reports everything the backend has of every deployment (kind `sync`), and the hub sets right
what it holds. A sync is taken and published under the same lock as every other report, so no
report taken before it is published after it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from wingsmith.adapters import nats_bus, tracing
from wingsmith.domain import names, subjects
from wingsmith.domain.cluster import OperatorInfo
from wingsmith.domain.contracts import reports
from wingsmith.domain.deployment import ClusterPhase, DeploymentStatus, StatusCondition
from wingsmith.domain.replica import SYNC_MAX_REPLICAS
from wingsmith.services import logs
from wingsmith.services.operator.metrics import OperatorMetrics, Reconcile
from wingsmith.services.tasks import Backoff, stop_all, supervise

log = logging.getLogger(__name__)

VERSION = "0.1.0"

Report = Callable[[reports.Report], Awaitable[None]]  # sends one report to the hub

RESTART = Backoff(first=1.0, cap=10.0, jitter=0.5)  # a part of the operator that failed
STOP_GIVE_UP = 30.0  # seconds the parts get to end before they are left behind
SYNC_NOT_YET = 0.5  # seconds before asking again a backend that cannot tell the whole truth yet
APPLY_AGAIN = 2.0  # seconds before a render object that could not be applied comes back
APPLY_AGAIN_CAP = 60.0  # ... doubling with each failure in a row, up to this


class Backend(Protocol):
    async def apply(self, deployment_id: str, desired: Mapping[str, Any] | None) -> None:
        """Make the cluster run `desired` (None: the deployment was removed)."""

    async def observe(self, report: Report) -> None:
        """Report what the cluster runs, for as long as the operator runs."""

    def snapshot(self, only: str | None = None) -> list[reports.SyncReport] | None:
        """Everything the cluster has of each deployment the backend was told of (removed ones
        too, while it still has something of them), or of `only` that one, as sync reports;
        None while it cannot tell the whole truth yet (say, before it has listed the cluster).
        Synchronous: it is taken at one instant."""

    def readiness(self) -> dict[str, bool]:
        """What must hold before the operator is ready, each named: whether it holds."""


@dataclass(frozen=True)
class OperatorOptions:
    cluster_id: str
    read_only: bool = False
    simulated: bool = False
    heartbeat_every: float = 5.0
    sync_every: float = 60.0  # seconds between full reports of every deployment (anti-entropy)


@dataclass
class OperatorCounts:
    """What the operator refused rather than act on, for as long as it runs."""

    foreign_renders: int = 0  # render objects that named another cluster


def foreign_cluster(cluster_id: str, subject: str, data: bytes) -> str | None:
    """Why a render object is not this cluster's to act on, or None if it is. The server's
    permissions already keep other clusters' messages from the operator's consumer; this check
    holds even if they were bypassed (a consumer re-filtered by someone allowed to, a render
    object built wrongly): the subject's cluster token and the object's `cluster_id` must both
    be this cluster's, and so must the deployment it is for (`<workload>--<cluster>`)."""
    parts = subject.split(".", 3)
    if len(parts) != 4 or parts[2] != cluster_id:
        return f"its subject {subject!r} is not under {names.RENDER}.{cluster_id}"
    if not data:
        return None  # a removal carries no object
    try:
        desired = orjson.loads(data)
        named, deployment_id = desired.get("cluster_id"), desired.get("deployment_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None  # not a render object at all: the backend says why it cannot apply it
    if named != cluster_id:
        return f"its object names cluster {named!r}"
    if deployment_id is not None and not str(deployment_id).endswith(f"--{cluster_id}"):
        return f"its object is for deployment {deployment_id!r} of another cluster"
    return None


class Reporter:
    """Publishes observations for one cluster, each under a message id of its own (the hub
    handles a resend of one, or a report it already knows, as no news)."""

    def __init__(self, nc: nats_bus.Connection, cluster_id: str) -> None:
        self._nc, self._cluster_id = nc, cluster_id
        self._order = asyncio.Lock()  # reports go out in the order they were taken

    async def __call__(self, report: reports.Report) -> None:
        async with self._order:
            await self._publish(report)

    async def sync(self, backend: Backend, only: str | None = None) -> int:
        """Take the backend's snapshot and publish it (only `only`'s, if given) before any
        report taken after it; returns how many deployments were synced (0: not ready yet)."""
        async with self._order:
            snapshot = backend.snapshot(only)
            if snapshot is None:
                return 0
            for sync in snapshot:
                if len(sync.replicas) > SYNC_MAX_REPLICAS:  # the hub would refuse it
                    log.warning(
                        "%s: %d pods, more than a sync may list (%d): not synced",
                        sync.deployment_id,
                        len(sync.replicas),
                        SYNC_MAX_REPLICAS,
                    )
                    continue
                await self._publish(sync)
            return len(snapshot)

    async def _publish(self, report: reports.Report) -> None:
        """On this cluster's subject, whatever cluster the report names: the hub refuses one
        that names another."""
        msg_id = f"{self._cluster_id}:{report.kind}:{uuid.uuid4().hex}"
        body = report.wire()
        await nats_bus.publish_observation(self._nc, self._cluster_id, report.kind, body, msg_id)


async def run_operator(
    nc: nats_bus.Connection,
    backend: Backend,
    options: OperatorOptions,
    counts: OperatorCounts | None = None,
    metrics: OperatorMetrics | None = None,
) -> None:
    """Run until cancelled; each part restarts on its own after a failure. `counts` is kept up
    to date with what the operator refused, `metrics` with what it did."""
    report = Reporter(nc, options.cluster_id)
    stopping = asyncio.Event()
    logs.bind(cluster_id=options.cluster_id)  # every part's lines name the cluster
    counted = counts if counts is not None else OperatorCounts()
    measured = metrics if metrics is not None else OperatorMetrics(options.cluster_id)
    parts = {
        "heartbeats": _heartbeats(report, options),
        "observe": lambda: backend.observe(report),
        "desired-state": lambda: _follow_desired(
            nc, options.cluster_id, backend, counted, report, measured
        ),
        "sync": lambda: _syncs(report, backend, options.sync_every),
    }
    if (take := getattr(backend, "take_node_devices", None)) is not None:
        parts["node-devices"] = lambda: _node_devices(nc, options.cluster_id, take)
    tasks = [
        asyncio.create_task(
            supervise(f"operator {name}", run, RESTART, stopping=stopping, logger=log), name=name
        )
        for name, run in parts.items()
    ]
    try:
        await asyncio.gather(*tasks)
    finally:
        stopping.set()
        await stop_all(tasks, STOP_GIVE_UP)


def _heartbeats(report: Report, options: OperatorOptions) -> Callable[[], Awaitable[None]]:
    operator = OperatorInfo.model_construct(
        instance=uuid.uuid4().hex,  # a new one each start: the hub records each start
        version=VERSION,
        read_only=options.read_only,
        simulated=options.simulated,
    )
    heartbeat = reports.HeartbeatReport.model_construct(
        cluster_id=options.cluster_id, operator=operator
    )

    async def beat() -> None:
        while True:
            await report(heartbeat)
            await asyncio.sleep(options.heartbeat_every)

    return beat


async def _node_devices(
    nc: nats_bus.Connection, cluster_id: str, take: Callable[[bytes], Awaitable[None]]
) -> None:
    """Hand the backend what the cluster's node agents report (services/operator/agent.py)."""
    async for data in nats_bus.node_devices(nc, cluster_id):
        await take(data)


async def _syncs(report: Reporter, backend: Backend, every: float) -> None:
    """A full sync as soon as the backend can tell the whole truth, then every `every`
    seconds."""
    while not await report.sync(backend):  # noqa: ASYNC110 - a retry, not a wait for a flag
        await asyncio.sleep(min(every, SYNC_NOT_YET))
    while True:
        await asyncio.sleep(every)
        synced = await report.sync(backend)
        log.debug("synced %d deployments", synced)


async def _sync_one(report: Reporter, backend: Backend, deployment_id: str) -> None:
    """A failed sync is the periodic one's to make up for: it never holds up a render object."""
    try:
        await report.sync(backend, only=deployment_id)
    except Exception as e:
        log.warning("%s: could not sync: %s: %s", deployment_id, type(e).__name__, e)


async def _follow_desired(
    nc: nats_bus.Connection,
    cluster_id: str,
    backend: Backend,
    counts: OperatorCounts,
    report: Reporter,
    metrics: OperatorMetrics,
) -> None:
    """Apply each deployment's render object in the order the hub decided it: a message that
    comes back after a newer one for the same deployment was applied is old news. One the
    backend can never apply (it cannot be expressed) is reported as a permanent failure and
    not tried again, and one for another cluster is never handed to the backend. One that
    failed otherwise comes back after a delay that doubles with each failure in a row. The
    first time a deployment is applied, it is synced: a start heals what the last run left
    untold."""
    applied: dict[str, int] = {}  # deployment id -> store position of the last one applied
    failures: dict[str, int] = {}  # deployment id -> failures in a row
    async for batch in nats_bus.render_batches(nc, cluster_id):
        for delivery in batch:
            deployment_token = delivery.subject.split(".", 3)[-1]  # its id, as a subject token
            # the trace of the decision behind the render object: the reports taken while
            # acting on it carry it back to the hub
            with (
                tracing.span(
                    "operator apply",
                    tracing.extract(delivery.headers),
                    cluster_id=cluster_id,
                    deployment_id=deployment_token,
                ),
                logs.context(aggregate="deployment", aggregate_id=deployment_token),
            ):
                await _act(
                    cluster_id, backend, counts, metrics, report, delivery, applied, failures
                )


async def _act(
    cluster_id: str,
    backend: Backend,
    counts: OperatorCounts,
    metrics: OperatorMetrics,
    report: Reporter,
    delivery: nats_bus.Delivery,
    applied: dict[str, int],
    failures: dict[str, int],
) -> None:
    """Act on one render object (see `_follow_desired`)."""
    if why := foreign_cluster(cluster_id, delivery.subject, delivery.data):
        counts.foreign_renders += 1
        log.error(
            "render message %s refused, not for cluster %s: %s (%d refused so far)",
            delivery.msg_id,
            cluster_id,
            why,
            counts.foreign_renders,
        )
        metrics.reconciled(Reconcile.FOREIGN)
        await delivery.reject()
        return
    deployment_id = subjects.key_value(delivery.subject.split(".", 3)[3])  # as encoded
    position = delivery.position
    if position and position < applied.get(deployment_id, 0):
        metrics.reconciled(Reconcile.STALE)
        await delivery.ack()
        return
    desired = orjson.loads(delivery.data) if delivery.data else None
    try:
        await backend.apply(deployment_id, desired)
    except ValueError as e:
        log.error("%s: cannot be applied, skipped: %s", deployment_id, e)
        metrics.reconciled(Reconcile.UNRENDERABLE)
        if desired is not None:
            await _report_unrenderable(report, cluster_id, deployment_id, str(e))
    except Exception as e:
        log.warning("%s: could not apply: %s: %s", deployment_id, type(e).__name__, e)
        failures[deployment_id] = failures.get(deployment_id, 0) + 1
        delay = min(APPLY_AGAIN * 2 ** (failures[deployment_id] - 1), APPLY_AGAIN_CAP)
        metrics.reconciled(Reconcile.FAILED)
        await delivery.retry(delay=delay)
        return
    else:
        metrics.reconciled(Reconcile.APPLIED)
    failures.pop(deployment_id, None)
    first = deployment_id not in applied
    applied[deployment_id] = max(position, applied.get(deployment_id, 0))
    await delivery.ack()
    if first:
        await _sync_one(report, backend, deployment_id)


async def _report_unrenderable(
    report: Report, cluster_id: str, deployment_id: str, message: str
) -> None:
    """A render object the backend cannot express: permanent, so the deployment fails with
    why. (A backend that knows where it would have written reports that action itself.)"""
    condition = StatusCondition.model_construct(
        reason="Unrenderable", message=message[:1024], permanent=True, pods=0
    )
    status = DeploymentStatus.model_construct(
        phase=ClusterPhase.FAILED,
        reason="Unrenderable",
        message=message[:4096],
        ready_replicas=0,
        desired_replicas=0,
        conditions=(condition,),
    )
    await report(
        reports.DeploymentReport.model_construct(
            cluster_id=cluster_id, deployment_id=deployment_id, status=status
        )
    )
