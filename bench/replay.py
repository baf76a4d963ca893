"""Replay: rebuilding every projection from a long history, against reading that history raw.

**Method.** A steady fleet with a long history is written straight into a real event store (a
SQLite file in a temporary directory; PostgreSQL with `--store`, in a schema this script creates
and drops). The events come from the domain aggregates themselves, saved with
`EventStore.save` in transactions of 1,000. Created up front: 20 clusters with inventory, 5
projects with quotas, 500 pinned workloads with their deployments and running replicas, and two
discovered models per cluster (one adopted as an observed deployment). Then churn until the
history has `--events` events, with timestamps spread over three simulated days. Churn is what
operators and people report all day: replicas started, ready, not ready and terminated
(rollouts, crashes, evictions: pod names are never reused), status and live-digest observations,
scaling, quota changes, serving-config rollouts, engine arguments, inventory re-reports,
admission cycles, re-sightings. The fleet's live state stays the same size while its history
grows.

1. *Rebuild rate against raw rate.* The raw baseline reads every stored event back with
   `EventStore.read` in pages of `services.hub.projector.READ_PAGE` and decodes its body with
   orjson, nothing else. The rebuild is `services.hub.projector.rebuild` over the same store. They
   run alternately (`--rounds` times each); the best of each is compared.
2. *Peak memory of a rebuild* over the first 100,000 positions and over the whole store, each in
   a fresh process (this script with a hidden flag), measured with tracemalloc; ru_maxrss is
   printed beside it (it includes tracemalloc's own bookkeeping).
3. *Update latency under load.* `wingsmith up` in its own process on the embedded defaults, with
   its projector, in a temporary directory. Background load: `project.set_quota` over 200
   projects at 1,000 commands/s on a fixed schedule (each records one event). Probe: every 20 ms
   a `cluster.report_inventory` for a probe cluster with another device count, timed from sending
   it to the capacity view carrying that total arriving on `wingsmith.proj.capacity.probe.>`.
   The probe's own reply is timed too. Baseline, in the same run: core NATS request/reply to a
   responder on the same server, sent with each probe.

    python bench/replay.py [--events 1000000] [--store postgresql://…?schema=NAME] [--rounds 2]
                           [--latency-seconds 15] [--skip-latency] [--skip-memory]

The last line is `replay_ratio=<rebuild events/s / raw events/s>`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import EventStore, Notification, postgres_connection, store_env
from wingsmith.domain.base import Aggregate, Cause, Event, Writer
from wingsmith.domain.cluster import Cluster, Node, OperatorInfo
from wingsmith.domain.deployment import (
    AdmissionPhase,
    AdmissionReason,
    Authority,
    ClusterPhase,
    Deployment,
    DeploymentStatus,
)
from wingsmith.domain.discovery import DiscoveredComponent, Discovery, Sighting
from wingsmith.domain.project import Project
from wingsmith.domain.replica import Replica
from wingsmith.domain.values import MAX_DEVICES_PER_NODE, Backend, Parallelism, ServingConfig
from wingsmith.domain.workload import Workload
from wingsmith.services.hub.projector import READ_PAGE, rebuild

ROOT = Path(__file__).resolve().parent.parent
SAVE_BATCH = 1_000
HISTORY_START = datetime(2026, 11, 26, tzinfo=UTC)
HISTORY_SPAN = timedelta(days=3)

CLUSTERS = 20
OPERATOR = OperatorInfo(instance="replay", version="1", read_only=False)
NODES = {"H100": 14, "A100": 4}  # per cluster, 8 devices each, plus one spare H100 node
DEVICES_PER_NODE = 8
PROJECTS = ("research", "search", "assistants", "evals", "batch")
QUOTAS = (64, 96, 128, 160)
WORKLOADS = 500
DISCOVERIES = 2  # per cluster; the first is promoted to an observed deployment
MODELS = (  # name, model, backend, devices per replica (= tensor parallelism), device class
    ("llama-8b", "meta-llama/Llama-3.1-8B-Instruct", Backend.VLLM, 1, "H100"),
    ("llama-70b", "meta-llama/Llama-3.1-70B-Instruct", Backend.VLLM, 4, "H100"),
    ("qwen-32b", "Qwen/Qwen2.5-32B-Instruct", Backend.SGLANG, 2, "H100"),
    ("mixtral", "mistralai/Mixtral-8x7B-Instruct-v0.1", Backend.TRTLLM, 2, "A100"),
)
ENGINE_VERSIONS = {
    Backend.VLLM: ("0.9.2", "0.10.0", "0.10.1"),
    Backend.SGLANG: ("0.4.9", "0.5.0"),
    Backend.TRTLLM: ("0.20.0", "0.21.0"),
}
ENGINE_ARGS = (("--enable-prefix-caching",), ("--enable-prefix-caching", "--max-num-seqs", "256"))
PENDING_REASONS = (
    AdmissionReason.INSUFFICIENT_CAPACITY,
    AdmissionReason.INSUFFICIENT_QUOTA,
    AdmissionReason.WAITING_FOR_PREVIOUS_GENERATION,
)


class FleetHistory:
    """A fixed fleet that lives a long time, recorded by the domain aggregates themselves.

    Every operation goes through an aggregate's command method under a `Cause` whose writer is
    the plane or the cluster, as the hub's handlers and the operators would; the events come out
    in the order they were recorded, stamped with a simulated clock."""

    def __init__(self, total: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.step = HISTORY_SPAN / total
        self.emitted = 0
        self.pending: list[Event] = []
        self.serial = itertools.count(1)
        self.clusters: dict[str, Cluster] = {}
        self.nodes: dict[str, list[Node]] = {}
        self.free: dict[tuple[str, str], dict[str, list[str]]] = {}  # (cluster, class) -> node
        self.projects: list[Project] = []
        self.workloads: dict[str, Workload] = {}
        self.deployments: list[Deployment] = []
        self.live: dict[str, list[Replica]] = {}  # deployment key -> its live replicas
        self.replicas_started = 0
        self.disabled: dict[str, Deployment] = {}
        self.unsettled: dict[str, Deployment] = {}  # admission not back to running yet
        self.status_due: dict[str, Deployment] = {}  # replicas changed since last reported
        self.digests_due: dict[str, Deployment] = {}
        self.discoveries: list[Discovery] = []
        churn = {
            self._reconcile: 40,
            self._status: 14,
            self._live_digests: 8,
            self._admission: 8,
            self._scale: 6,
            self._quota: 5,
            self._inventory: 3,
            self._discovery: 3,
            self._serving: 2,
            self._engine_args: 2,
            self._toggle: 2,
        }
        self.churn_ops = list(churn)
        self.churn_weights = list(itertools.accumulate(churn.values()))

    def batches(self, total: int, size: int) -> Iterator[list[Event]]:
        """The fleet's creation, then churn until `total` events: in batches of `size`."""
        self._create_fleet()
        while self.pending or self.emitted < total:
            while len(self.pending) < size and self.emitted < total:
                self.rng.choices(self.churn_ops, cum_weights=self.churn_weights)[0]()
            batch, self.pending = self.pending[:size], self.pending[size:]
            yield batch

    def _cause(self, writer: Writer = Writer.PLANE) -> Cause:
        command_id = f"{writer.value}-{next(self.serial)}"
        at = HISTORY_START + self.step * self.emitted
        return Cause(command_id=command_id, correlation_id=command_id, at=at, writer=writer)

    def _keep(self, *aggregates: Aggregate) -> None:
        for aggregate in aggregates:
            events = aggregate.collect_events()
            self.pending += events
            self.emitted += len(events)

    # -- the fleet, created up front -----------------------------------------------------

    def _create_fleet(self) -> None:
        for i in range(CLUSTERS):
            self._create_cluster(f"gpu-{i:02d}", ("us-east-1", "us-west-2", "eu-west-1")[i % 3])
        for name in PROJECTS:
            project = Project.register(self._cause(), name)
            for device_class in NODES:
                project.set_quota(self._cause(), device_class, self.rng.choice(QUOTAS))
            self._keep(project)
            self.projects.append(project)
        clusters = list(self.clusters)
        for i in range(WORKLOADS):
            name, model, backend, devices, device_class = MODELS[i % len(MODELS)]
            serving = ServingConfig(
                model=model,
                backend=backend,
                engine_version=ENGINE_VERSIONS[backend][0],
                devices_per_replica=devices,
                parallelism=Parallelism(tensor=devices),
            )
            cluster_id = clusters[i // len(MODELS) % CLUSTERS]  # every model on every cluster
            self._create_workload(f"{name}-{i:03d}", cluster_id, serving, device_class, 1 + i % 3)
        for cluster_id in clusters:
            for k in range(DISCOVERIES):
                self._sight(cluster_id, k)

    def _create_cluster(self, cluster_id: str, region: str) -> None:
        cluster = Cluster.register(self._cause(), cluster_id, region, {"tier": "gold"})
        nodes = []
        for device_class, count in NODES.items():
            for j in range(count):
                node_id = f"{cluster_id}-{device_class.lower()}-{j:02d}"
                nodes.append(
                    Node(
                        node_id=node_id,
                        device_class=device_class,
                        devices=DEVICES_PER_NODE,
                        topology_domain=f"nvl-{device_class.lower()}-{j // 4}",
                    )
                )
                pool = self.free.setdefault((cluster_id, device_class), {})
                pool[node_id] = [f"GPU-{node_id}-{d}" for d in range(DEVICES_PER_NODE)]
        spare = Node(node_id=f"{cluster_id}-spare", device_class="H100", devices=DEVICES_PER_NODE)
        nodes.append(spare)  # cordoned and back again: its devices are never allocated here
        cluster.hear_operator(self._cause(Writer.CLUSTER), OPERATOR)
        cluster.report_inventory(self._cause(Writer.CLUSTER), tuple(nodes))
        self._keep(cluster)
        self.clusters[cluster_id], self.nodes[cluster_id] = cluster, nodes

    def _create_workload(
        self,
        workload_id: str,
        cluster_id: str,
        serving: ServingConfig,
        device_class: str,
        replicas: int,
        *,
        imported_args: tuple[str, ...] | None = None,
    ) -> Deployment:
        """As `workload.create` pinned to a cluster, then admitted, placed and running."""
        cause = self._cause()
        project = self.projects[len(self.workloads) % len(self.projects)].key
        workload = Workload.create(
            cause,
            workload_id,
            project=project,
            device_class=device_class,
            serving=serving,
            replicas=replicas,
            cluster_pin=cluster_id,
        )
        d = Deployment.create(
            cause,
            workload_id=workload_id,
            cluster_id=cluster_id,
            project=project,
            device_class=device_class,
            serving=serving,
            desired_replicas=replicas,
            authority=Authority.MANAGED if imported_args is None else Authority.OBSERVED,
            imported_args=imported_args,
        )
        workload.attach_deployment(cause, cluster_id, d.key)
        self._keep(workload, d)
        self.workloads[workload_id] = workload
        self.deployments.append(d)
        self.live[d.key] = []
        self._admit(d)
        for _ in range(replicas):
            self._start(d, self._cause(Writer.CLUSTER))
        for replica in self.live[d.key]:
            replica.mark_ready(self._cause(Writer.CLUSTER))
            self._keep(replica)
        d.mark_placed(self._cause(Writer.CLUSTER))
        d.mark_running(self._cause(Writer.CLUSTER))
        self._keep(d)
        self.status_due[d.key] = self.digests_due[d.key] = d
        return d

    def _admit(self, d: Deployment) -> None:
        evidence = {"requested": d.desired_replicas * d.serving.devices_per_replica}
        d.decide_admission(self._cause(), admitted=True, reason=None, evidence=evidence)
        self._keep(d)

    def _sight(self, cluster_id: str, k: int) -> None:
        sighting = self._sighting(f"legacy-{k}", replicas=1)
        discovery = Discovery.sight(self._cause(Writer.CLUSTER), cluster_id, sighting)
        self._keep(discovery)
        self.discoveries.append(discovery)
        if k == 0:  # adopted: a workload with one observed deployment, as it runs
            args = ("--max-model-len", "8192")
            serving = ServingConfig(
                model="legacy/model",
                backend=Backend.VLLM,
                engine_version="0.8.5",
                devices_per_replica=1,
            )
            workload_id = f"adopted-{cluster_id}"
            discovery.promote(self._cause(), workload_id)
            self._keep(discovery)
            self._create_workload(workload_id, cluster_id, serving, "H100", 1, imported_args=args)

    def _sighting(self, name: str, replicas: int) -> Sighting:
        component = DiscoveredComponent(
            name="worker", role="decode", replicas=replicas, gpus_per_replica=1
        )
        return Sighting(
            namespace="legacy",
            name=name,
            api_version="nvidia.com/v1alpha1",
            backend=Backend.VLLM,
            components=(component,),
        )

    # -- replicas ------------------------------------------------------------------------

    def _start(self, d: Deployment, cause: Cause) -> None:
        need = d.serving.devices_per_replica
        pool = self.free[(d.cluster_id, d.device_class)]
        node_id = next((n for n, free in pool.items() if len(free) >= need), None)
        if node_id is None:
            return  # no room: the replica stays unscheduled, nothing to report
        devices = tuple(pool[node_id][:need])
        del pool[node_id][:need]
        replica = Replica.start(
            cause,
            deployment_id=d.key,
            name=f"{d.workload_id}-{next(self.serial):07x}",
            node_id=node_id,
            device_ids=devices,
            serving_digest=d.serving_digest,
            engine_version=d.serving.engine_version,
        )
        self._keep(replica)
        self.live[d.key].append(replica)
        self.replicas_started += 1

    def _terminate(self, d: Deployment, replica: Replica, cause: Cause) -> None:
        replica.terminate(cause)
        self._keep(replica)
        self.live[d.key].remove(replica)
        self.free[(d.cluster_id, d.device_class)][replica.node_id] += replica.device_ids

    # -- churn ---------------------------------------------------------------------------

    def _reconcile(self) -> None:
        """The cluster reports one replica change of a deployment: a started replica gets
        ready, the count moves toward desired, a replica of an old generation is replaced, or
        one crashes or is evicted."""
        d = self.rng.choice(self.deployments)
        live = self.live[d.key]
        wanted = d.desired_replicas if d.enabled else 0
        cause = self._cause(Writer.CLUSTER)
        starting = next((r for r in live if not r.ready), None)
        stale = next((r for r in live if r.serving_digest != d.serving_digest), None)
        if starting is not None:
            starting.mark_ready(cause)
            self._keep(starting)
        elif len(live) < wanted:
            self._start(d, cause)
        elif len(live) > wanted:
            self._terminate(d, live[0], cause)
        elif stale is not None:
            self._terminate(d, stale, cause)
        elif live and self.rng.random() < 0.4:
            crashed = self.rng.choice(live)
            crashed.mark_not_ready(cause)
            self._keep(crashed)
        elif live:
            self._terminate(d, self.rng.choice(live), cause)
        self.status_due[d.key] = self.digests_due[d.key] = d

    def _due(self, due: dict[str, Deployment]) -> Deployment:
        """The deployment that changed longest ago and was not reported since, else any."""
        if due:
            return due.pop(next(iter(due)))
        return self.rng.choice(self.deployments)

    def _status(self) -> None:
        d = self._due(self.status_due)
        ready = sum(r.ready for r in self.live[d.key])
        wanted = d.desired_replicas if d.enabled else 0
        status = DeploymentStatus(
            phase=ClusterPhase.READY if ready >= wanted else ClusterPhase.PROGRESSING,
            reason=None if ready >= wanted else "ReplicasNotReady",
            ready_replicas=ready,
            desired_replicas=wanted,
        )
        d.observe_status(self._cause(Writer.CLUSTER), status)
        self._keep(d)

    def _live_digests(self) -> None:
        d = self._due(self.digests_due)
        counts = Counter(r.serving_digest for r in self.live[d.key] if r.ready)
        d.observe_live_digests(self._cause(Writer.CLUSTER), dict(counts))
        self._keep(d)

    def _admission(self) -> None:
        """Mostly move an unsettled deployment one step back toward running; else send a
        running one back to pending, or fail it."""
        if self.unsettled and self.rng.random() < 0.8:
            d = self.unsettled[next(iter(self.unsettled))]
            phase = d.admission_phase
            if phase is AdmissionPhase.FAILED:
                reason = AdmissionReason.AWAITING_ADMISSION
                d.decide_admission(self._cause(), admitted=False, reason=reason, evidence={})
            elif phase is AdmissionPhase.PENDING:
                self._admit(d)
            elif phase is AdmissionPhase.ADMITTED:
                d.mark_placed(self._cause(Writer.CLUSTER))
            else:
                d.mark_running(self._cause(Writer.CLUSTER))
                del self.unsettled[d.key]
        else:
            d = self.rng.choice(self.deployments)
            if self.rng.random() < 0.15:
                d.mark_failed(self._cause(Writer.CLUSTER), "CrashLoopBackOff", "engine exited")
            else:
                reason = self.rng.choice(PENDING_REASONS)
                evidence = {"free": self.rng.randrange(8), "requested": 8}
                d.decide_admission(self._cause(), admitted=False, reason=reason, evidence=evidence)
            self.unsettled[d.key] = d
        self._keep(d)

    def _scale(self) -> None:
        d = self.rng.choice(self.deployments)
        workload = self.workloads[d.workload_id]
        replicas = self.rng.choice([n for n in (1, 2, 3) if n != d.desired_replicas])
        cause = self._cause()
        workload.scale(cause, replicas)
        d.scale(cause, replicas)
        self._keep(workload, d)

    def _quota(self) -> None:
        project = self.rng.choice(self.projects)
        device_class = self.rng.choice(list(NODES))
        current = project.quota.get(device_class)
        devices = self.rng.choice([q for q in QUOTAS if q != current])
        project.set_quota(self._cause(), device_class, devices)
        self._keep(project)

    def _inventory(self) -> None:
        """The spare node is cordoned or back; or a node moves to another topology domain."""
        cluster_id = self.rng.choice(list(self.clusters))
        nodes = self.nodes[cluster_id]
        if self.rng.random() < 0.6:
            i = len(nodes) - 1
            devices = DEVICES_PER_NODE - nodes[i].devices
            nodes[i] = nodes[i].model_copy(update={"devices": devices})
        else:
            i = self.rng.randrange(len(nodes) - 1)
            domain = nodes[i].topology_domain or ""
            moved = domain[:-1] if domain.endswith("b") else domain + "b"
            nodes[i] = nodes[i].model_copy(update={"topology_domain": moved})
        cluster = self.clusters[cluster_id]
        cluster.hear_operator(self._cause(Writer.CLUSTER), OPERATOR)
        cluster.report_inventory(self._cause(Writer.CLUSTER), tuple(nodes))
        self._keep(cluster)

    def _discovery(self) -> None:
        discovery = self.rng.choice(self.discoveries)
        if discovery.workload_id is not None:  # promoted: the cluster reports its args
            d = next(d for d in self.deployments if d.workload_id == discovery.workload_id)
            args = d.imported_args or ()
            changed = (*args[:-1], str(self.rng.choice((4096, 8192, 16384))))
            d.observe_imported_args(self._cause(Writer.CLUSTER), changed)
            self._keep(d)
        elif self.rng.random() < 0.7:
            replicas = self.rng.choice([n for n in (1, 2, 3) if n != self._replicas(discovery)])
            sighting = self._sighting(discovery.sighting.name, replicas)
            discovery.resight(self._cause(Writer.CLUSTER), sighting)
        elif self.rng.random() < 0.5:
            discovery.track(self._cause())
        else:
            discovery.ignore(self._cause())
        self._keep(discovery)

    @staticmethod
    def _replicas(discovery: Discovery) -> int:
        return discovery.sighting.components[0].replicas

    def _serving(self) -> None:
        """A rollout: the next engine version; the deployment's replicas get replaced."""
        d = self.rng.choice(self.deployments)
        versions = ENGINE_VERSIONS[d.serving.backend]
        if d.serving.engine_version not in versions:
            return  # an adopted deployment keeps what it was found with
        following = versions[(versions.index(d.serving.engine_version) + 1) % len(versions)]
        serving = d.serving.model_copy(update={"engine_version": following})
        workload = self.workloads[d.workload_id]
        cause = self._cause()
        workload.change_serving_config(cause, serving)
        d.change_serving_config(cause, serving)
        self._keep(workload, d)

    def _engine_args(self) -> None:
        d = self.rng.choice(self.deployments)
        args = ENGINE_ARGS[1] if d.engine_args == ENGINE_ARGS[0] else ENGINE_ARGS[0]
        d.set_engine_args(self._cause(), args)
        self._keep(d)

    def _toggle(self) -> None:
        """A few deployments are switched off for a while, then on again."""
        if len(self.disabled) < 5 and self.rng.random() < 0.5:
            d = self.rng.choice(self.deployments)
            d.disable(self._cause())
            self.disabled[d.key] = d
        elif self.disabled:
            d = self.disabled.pop(self.rng.choice(list(self.disabled)))
            d.enable(self._cause())
        else:
            return
        self._keep(d)


# -- the store -------------------------------------------------------------------------


@contextmanager
def fresh_store(url: str | None) -> Iterator[tuple[EventStore, str]]:
    """An empty event store and the URL another process opens it by; removed afterwards.
    PostgreSQL needs `?schema=NAME`: the schema is created here and dropped at the end."""
    with tempfile.TemporaryDirectory(prefix="wingsmith-replay-") as tmp:
        if url is None:
            store = EventStore(store_env(None, Path(tmp)))
            url = f"sqlite://{Path(tmp) / 'events.sqlite'}"
            try:
                yield store, url
            finally:
                store.close()
            return
        env = store_env(url, Path(tmp))
        if "POSTGRES_SCHEMA" not in env:
            raise SystemExit("--store: give a schema of its own (?schema=NAME): it is dropped")
        schema = sql.Identifier(env["POSTGRES_SCHEMA"])
        with postgres_connection(env, in_schema=False) as db:
            db.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            try:
                store = EventStore(env)
                try:
                    yield store, url
                finally:
                    store.close()
            finally:
                db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(schema))


def write_history(store: EventStore, total: int) -> None:
    history = FleetHistory(total)
    types: Counter[str] = Counter()
    started = time.perf_counter()
    for batch in history.batches(total, SAVE_BATCH):
        store.save(batch)
        types.update(type(e).__name__ for e in batch)
    seconds = time.perf_counter() - started
    count = sum(types.values())
    live = sum(len(replicas) for replicas in history.live.values())
    end = HISTORY_START + history.step * history.emitted
    print(
        f"history: {count:,} events written in {seconds:.1f} s ({count / seconds:,.0f} events/s, "
        f"transactions of {SAVE_BATCH:,}), {HISTORY_START:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M}"
    )
    print(
        f"  fleet: {len(history.clusters)} clusters, {len(history.projects)} projects, "
        f"{len(history.deployments)} deployments, {live:,} live replicas at the end "
        f"({history.replicas_started:,} started over the history)"
    )
    mix = ", ".join(f"{name} {n / count:.1%}" for name, n in types.most_common(12))
    print(f"  mix: {mix}")


# -- rebuild against raw ---------------------------------------------------------------


def read_raw(store_read: Callable[[int, int], list[Notification]]) -> None:
    """Every stored event read back in pages and its body decoded: the floor under any fold."""
    position = 0
    while notes := store_read(position, READ_PAGE):
        for note in notes:
            orjson.loads(note.state)
        position = notes[-1].id


def compare_rates(store: EventStore, events: int, rounds: int) -> float:
    """Raw reads and rebuilds, alternately; returns best rebuild rate / best raw rate."""
    best = {"raw read": 0.0, "rebuild": 0.0}
    for run in range(1, rounds + 1):
        for label, work in (("raw read", read_raw), ("rebuild", rebuild)):
            started = time.perf_counter()
            work(store.read)
            seconds = time.perf_counter() - started
            best[label] = max(best[label], events / seconds)
            print(f"{label:>8} run {run}: {events / seconds:9,.0f} events/s  ({seconds:.2f} s)")
    ratio = best["rebuild"] / best["raw read"]
    print(
        f"best: raw read {best['raw read']:,.0f} events/s, rebuild {best['rebuild']:,.0f} "
        f"events/s over {events:,} events: ratio {ratio:.3f} (target >= 0.5)"
    )
    return ratio


# -- peak memory -----------------------------------------------------------------------


def rebuild_peak(url: str, stop: int) -> None:
    """In a fresh process: rebuild over positions up to `stop` and print, as JSON, the peak
    memory it took, what the projections keep, and the sizes of their tables."""
    store = EventStore(store_env(url, Path.cwd()))
    tracemalloc.start()
    started = time.perf_counter()
    rebuilt = rebuild(functools.partial(store.read, stop=stop))
    seconds = time.perf_counter() - started
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tables = {
        f"{p.name}.{attr}": len(value)
        for p in rebuilt.projections
        for attr, value in vars(p).items()
        if isinstance(value, dict)
    }
    report = {
        "position": rebuilt.position,
        "seconds": seconds,
        "peak": peak,
        "kept": kept,
        "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "tables": tables,
    }
    print(orjson.dumps(report).decode())
    store.close()


def measure_memory(url: str, events: int) -> None:
    reports = []
    for stop in (min(100_000, events // 10), events):
        child = subprocess.run(
            [sys.executable, __file__, "--rebuild-peak", str(stop), "--store", url],
            capture_output=True,
            cwd=ROOT,
        )
        if child.returncode:
            raise RuntimeError(f"the rebuild to {stop} failed:\n{child.stderr.decode()}")
        report = orjson.loads(child.stdout.splitlines()[-1])
        reports.append(report)
        print(
            f"rebuild to position {report['position']:>9,}: peak {mib(report['peak'])}, "
            f"kept {mib(report['kept'])}, ru_maxrss {mib(report['maxrss'])} "
            f"({report['seconds']:.1f} s under tracemalloc)"
        )
    small, large = reports
    print(
        f"peak memory ratio (all / first {small['position']:,}): "
        f"{large['peak'] / small['peak']:.2f} (target <= 1.5)"
    )
    grown = {
        table: (n, large["tables"][table])
        for table, n in small["tables"].items()
        if large["tables"][table] > 1.5 * n + 100
    }
    for table, (before, after) in sorted(grown.items()):
        print(f"  grows with the history: {table} {before:,} -> {after:,} entries")


def mib(size: int) -> str:
    return f"{size / 2**20:7.1f} MiB"


# -- update latency under load ---------------------------------------------------------

LOAD_RATE = 1_000
LOAD_PROJECTS = 200
PROBE_INTERVAL = 0.020
PROBE_CLUSTER = "probe"
PROBE_START_DEVICES = 1024  # never one of the probes' totals (1..1000)


class Timings:
    """Send times by key; for each key that comes back, when it was sent and how long it took."""

    def __init__(self) -> None:
        self.sent: dict[Any, float] = {}
        self.done: list[tuple[float, float]] = []  # (sent at, milliseconds)

    def send(self, key: Any) -> None:
        self.sent[key] = time.perf_counter()

    def arrived(self, key: Any) -> None:
        started = self.sent.pop(key, None)
        if started is not None:
            self.done.append((started, (time.perf_counter() - started) * 1000))

    def summary(self) -> str:
        ms = [took for _, took in self.done]
        if len(ms) < 2:
            return f"{len(ms)} arrived"
        cuts = statistics.quantiles(ms, n=100, method="inclusive")
        return (
            f"p50 {cuts[49]:6.2f}  p90 {cuts[89]:6.2f}  p99 {cuts[98]:6.2f}  "
            f"max {max(ms):6.2f} ms  ({len(ms)} arrived, {len(self.sent)} lost)"
        )

    def slowest(self, count: int, since: float) -> str:
        worst = sorted(self.done, key=lambda d: d[1], reverse=True)[:count]
        return ", ".join(f"{took:.0f} ms at {at - since:.1f} s" for at, took in worst)


class Replies:
    """Counts command replies arriving on an inbox, and keeps the first refusal."""

    def __init__(self) -> None:
        self.ok = self.refused = 0
        self.first_refusal: bytes | None = None

    async def on_reply(self, msg: Msg) -> None:
        if orjson.loads(msg.data)["ok"]:
            self.ok += 1
        else:
            self.refused += 1
            self.first_refusal = self.first_refusal or msg.data


async def paced(rate: float, until: float, send: Callable[[int], Awaitable[None]]) -> int:
    """Call `send(k)` for k = 0, 1, ... on a fixed schedule of `rate` per second until the
    loop's clock reaches `until`; a late wake-up sends what fell due meanwhile."""
    loop = asyncio.get_running_loop()
    started, sent = loop.time(), 0
    while (now := loop.time()) < until:
        due = int((now - started) * rate) + 1
        while sent < due:
            await send(sent)
            sent += 1
        await asyncio.sleep(min(sent / rate - (now - started), until - now))
    return sent


async def command(nc: Client, verb: str, body: dict[str, Any]) -> None:
    reply = orjson.loads((await nc.request(f"wingsmith.cmd.{verb}", orjson.dumps(body), 30)).data)
    if not reply["ok"]:
        raise RuntimeError(f"{verb}: {reply['error']}")


def inventory(command_id: str, devices: int) -> dict[str, Any]:
    """The probe cluster with `devices` H100 in all, on as many nodes as a node's limit needs."""
    per_node = MAX_DEVICES_PER_NODE
    nodes = [
        {"node_id": f"probe-n{i}", "device_class": "H100", "devices": min(per_node, devices - n)}
        for i, n in enumerate(range(0, devices, per_node))
    ]
    return {"command_id": command_id, "cluster_id": PROBE_CLUSTER, "nodes": nodes}


async def probe_under_load(nc: Client, echo: Client, seconds: float) -> None:
    """With the hub up: prepare, then run the background load and the probes together."""
    probes, acks, pings = Timings(), Timings(), Timings()
    first_view = asyncio.Event()

    async def on_view(msg: Msg) -> None:
        if msg.data:  # an empty body is a removed view
            total = orjson.loads(msg.data)["total"]
            probes.arrived(total)
            if total == PROBE_START_DEVICES:
                first_view.set()

    async def on_echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    async def on_pong(msg: Msg) -> None:
        pings.arrived(int(msg.data))

    async def on_probe_reply(msg: Msg) -> None:
        acks.arrived(int(msg.subject.rpartition(".")[2]))
        await probe_replies.on_reply(msg)

    inbox = nc.new_inbox()
    load_replies, probe_replies = Replies(), Replies()
    await nc.subscribe(f"wingsmith.proj.capacity.{PROBE_CLUSTER}.>", cb=on_view)
    await nc.subscribe(f"{inbox}.load", cb=load_replies.on_reply)
    await nc.subscribe(f"{inbox}.probe.*", cb=on_probe_reply)
    await nc.subscribe(f"{inbox}.ping", cb=on_pong)
    await echo.subscribe("bench.echo", cb=on_echo)
    await echo.flush()

    for start in range(0, LOAD_PROJECTS, 50):  # the load's projects exist before it starts
        await asyncio.gather(
            *(
                command(nc, "project.set_quota", quota(f"warm-{p}", p, 1))
                for p in range(start, min(start + 50, LOAD_PROJECTS))
            )
        )
    await command(nc, "cluster.register", {"command_id": "reg", "cluster_id": PROBE_CLUSTER})
    await command(nc, "cluster.report_inventory", inventory("inv", PROBE_START_DEVICES))
    async with asyncio.timeout(60):  # the projector has caught up with all of that
        await first_view.wait()

    async def send_load(k: int) -> None:
        devices = 8 * (1 + (k // LOAD_PROJECTS) % 2)  # alternating: every command is an event
        body = orjson.dumps(quota(f"load-{k}", k % LOAD_PROJECTS, devices))
        await nc.publish("wingsmith.cmd.project.set_quota", body, reply=f"{inbox}.load")

    async def send_probe(k: int) -> None:
        total = 1 + k % 1000
        body = orjson.dumps(inventory(f"probe-{k}", total))
        probes.send(total)
        acks.send(k)
        await nc.publish("wingsmith.cmd.cluster.report_inventory", body, reply=f"{inbox}.probe.{k}")
        pings.send(k)
        await nc.publish("bench.echo", str(k).encode(), reply=f"{inbox}.ping")

    async def probes_after_warm_up() -> int:
        await asyncio.sleep(1.0)
        return await paced(1 / PROBE_INTERVAL, loop.time() + seconds, send_probe)

    loop = asyncio.get_running_loop()
    started, probing = loop.time(), time.perf_counter() + 1.0
    load_sent, probes_sent = await asyncio.gather(
        paced(LOAD_RATE, started + 1.0 + seconds, send_load), probes_after_warm_up()
    )
    load_seconds = loop.time() - started
    await asyncio.sleep(2.0)  # the last probes' views, the last replies
    print(
        f"background load: {load_sent / load_seconds:,.0f} commands/s sent on schedule, "
        f"{load_replies.ok / load_seconds:,.0f}/s acknowledged ok over {load_seconds:.1f} s "
        f"(target rate {LOAD_RATE:,}/s; {load_replies.refused} refused)"
    )
    print(f"probe inventory -> capacity view: {probes.summary()}  (target p99 <= 25 ms)")
    print(f"  slowest: {probes.slowest(5, probing)} into the probing")
    print(f"probe inventory -> its reply:     {acks.summary()}")
    print(f"baseline core NATS request/reply: {pings.summary()}")
    if probe_replies.refused or load_replies.refused:
        refusal = probe_replies.first_refusal or load_replies.first_refusal or b""
        print(f"  refused: {refusal.decode()}")
    print(f"  {probes_sent} probes sent, {probe_replies.ok} acknowledged ok")


def quota(command_id: str, project: int, devices: int) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "project": f"load-{project:03d}",
        "device_class": "H100",
        "devices": devices,
    }


async def update_latency(seconds: float) -> None:
    with tempfile.TemporaryDirectory(prefix="wingsmith-replay-") as tmp:
        async with EmbeddedNatsServer(Path(tmp) / "nats") as server:
            env = {  # the embedded defaults: SQLite, relay and projector on
                k: v
                for k, v in os.environ.items()
                if k not in ("WINGSMITH_PROJECTOR", "WINGSMITH_STORE", "WINGSMITH_NO_RELAY")
            }
            env |= {
                "WINGSMITH_NATS_URL": server.url,
                "WINGSMITH_DATA_DIR": str(Path(tmp) / "hub"),
                "WINGSMITH_API_LISTEN": "127.0.0.1:0",  # `up` serves the REST API too
            }
            hub = subprocess.Popen(  # noqa: ASYNC220 - returns once forked
                [sys.executable, "-m", "wingsmith", "up"],
                env=env,
                stdout=subprocess.PIPE,
                cwd=ROOT,
            )
            nc = await nats.connect(server.url, pending_size=64 * 1024 * 1024)
            echo = await nats.connect(server.url)
            try:
                assert hub.stdout is not None
                ready = await asyncio.to_thread(hub.stdout.readline)
                if b"ready" not in ready:
                    raise RuntimeError(f"wingsmith up did not start: {ready!r}")
                await probe_under_load(nc, echo, seconds)
            finally:
                hub.terminate()
                hub.wait(30)
                await echo.close()
                await nc.close()


# -- main ------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    with fresh_store(args.store) as (store, url):
        write_history(store, args.events)
        events = store.last_position()  # a fresh store: positions 1..events
        ratio = compare_rates(store, events, args.rounds)
        if not args.skip_memory:
            measure_memory(url, events)
    if not args.skip_latency:
        asyncio.run(update_latency(args.latency_seconds))
    print(f"total time {time.perf_counter() - started:.0f} s")
    print(f"replay_ratio={ratio:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--store", help="postgresql://…?schema=NAME (default: SQLite in a tmpdir)")
    parser.add_argument("--rounds", type=int, default=2, help="raw and rebuild runs, each")
    parser.add_argument("--latency-seconds", type=float, default=15.0)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--rebuild-peak", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rebuild_peak is not None:
        rebuild_peak(args.store, args.rebuild_peak)
    else:
        main(args)
