"""The hub's metrics and its projector's (docs/operations.md#metrics).

The hub counts commands as it answers them and group commits as it saves them; where each
stage is in the store, and how long each cluster has been silent, are read when scraped. The
projector's families are its views, read when scraped, and the devices its deployments'
replicas hold, integrated over time into device-seconds (a counter: GPU-hours are a query).
Labels are what a dashboard groups by (subjects, outcomes, projects, clusters, device
classes, phases), never ids of commands or deployments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from wingsmith.domain.contracts import views as v
from wingsmith.projections.base import Fold
from wingsmith.services.metrics import Children

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
UNKNOWN_SUBJECT = "unknown"  # a subject no command has: never the subject itself as a label


class CommandMetrics:
    """Commands answered by subject and outcome, how long each took from its arrival at the
    hub to its answer, and each group commit's size and duration."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.answered = Counter(
            "wingsmith_commands",
            "Commands answered, by subject and outcome (ok, or the refusal's error code).",
            ["subject", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "wingsmith_command_duration_seconds",
            "From a command's arrival at the hub to its answer, by subject.",
            ["subject"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "wingsmith_group_commit_commands",
            "Commands handled in one group commit (one store transaction).",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=registry,
        )
        self.commit_duration = Histogram(
            "wingsmith_group_commit_duration_seconds",
            "Handling a group commit's commands and saving their events.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._answered: Children[tuple[str, str], Counter] = Children(
            lambda key: self.answered.labels(*key)
        )
        self._duration: Children[str, Histogram] = Children(
            lambda subject: self.duration.labels(subject)
        )

    def answer(self, subject: str, outcome: str, seconds: float | None = None) -> None:
        """A command answered with `outcome`; `seconds` since it arrived, when it was queued."""
        self._answered[(subject, outcome)].inc()
        if seconds is not None:
            self._duration[subject].observe(seconds)

    def committed(self, commands: int, seconds: float) -> None:
        self.batch_size.observe(commands)
        self.commit_duration.observe(seconds)


def admission_wait(registry: CollectorRegistry | None = None) -> Histogram:
    return Histogram(
        "wingsmith_admission_wait_seconds",
        "From a deployment beginning to wait for admission to its admission, by device class.",
        ["device_class"],
        buckets=WAIT_BUCKETS,
        registry=registry,
    )


def seconds_since(iso: str | None) -> float | None:
    """Seconds from an event's timestamp until now; None without one."""
    if iso is None:
        return None
    return max(0.0, (datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds())


class HubCollector(Collector):
    """Read when scraped: where each stage is in the store and how far behind the last
    stored position, and how long each cluster's operator has been silent."""

    def __init__(
        self,
        positions: Callable[[], Mapping[str, int]],
        silences: Callable[[], Mapping[str, float]] | None = None,
        token: Callable[[], int | None] | None = None,
    ) -> None:
        """`positions()`: by stage (stored, relayed, scheduled, projected) the store position
        it has reached; `silences()`: by cluster, seconds since its operator was heard;
        `token()`: the lease's fencing token while this hub holds it, else None."""
        self._positions, self._silences, self._token = positions, silences, token

    def collect(self) -> Iterator[GaugeMetricFamily]:
        positions = self._positions()
        at = GaugeMetricFamily(
            "wingsmith_store_position",
            "The store position each stage has reached (stored: the last one written).",
            labels=["stage"],
        )
        lag = GaugeMetricFamily(
            "wingsmith_store_lag",
            "Store positions a stage is behind the last one written.",
            labels=["stage"],
        )
        stored = positions.get("stored", 0)
        for stage, position in positions.items():
            at.add_metric([stage], position)
            if stage != "stored":
                lag.add_metric([stage], max(stored - position, 0))
        yield at
        yield lag
        if self._token is not None:
            yield GaugeMetricFamily(
                "wingsmith_lease_held",
                "1 on the hub that holds the lease and runs the one-per-store roles, else 0.",
                value=int(self._token() is not None),
            )
        if self._silences is not None:
            age = GaugeMetricFamily(
                "wingsmith_cluster_heartbeat_age_seconds",
                "Seconds since a cluster's operator was last heard from (or, never heard "
                "from, since the hub first knew of the cluster).",
                labels=["cluster"],
            )
            for cluster, seconds in self._silences().items():
                age.add_metric([cluster], seconds)
            yield age


AllocationKey = tuple[str, str, str]  # project, device class, cluster


class DeviceSeconds:
    """The devices live replicas hold, integrated over time per project, device class and
    cluster: each `sample` adds what was held since the previous one, at its count then."""

    def __init__(
        self,
        allocated: Callable[[], dict[AllocationKey, int]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allocated, self._clock = allocated, clock
        self.seconds: dict[AllocationKey, float] = {}
        self._held: dict[AllocationKey, int] = {}
        self._at = clock()

    def sample(self) -> dict[AllocationKey, float]:
        now = self._clock()
        elapsed, self._at = now - self._at, now
        for key, devices in self._held.items():
            self.seconds[key] = self.seconds.get(key, 0.0) + devices * elapsed
        self._held = self._allocated()
        for key in self._held:
            self.seconds.setdefault(key, 0.0)
        return self.seconds


def allocated(fold: Fold) -> dict[AllocationKey, int]:
    """What deployments' live replicas hold, per project, device class and cluster."""
    quota = _projection(fold, v.QUOTA_USE.name)
    held: dict[AllocationKey, int] = {}
    for d in getattr(quota, "deployments", {}).values():
        if d["allocated"]:
            key = (d["project"], d["device_class"], d["cluster_id"])
            held[key] = held.get(key, 0) + d["allocated"]
    return held


def _projection(fold: Fold, name: str) -> Any:
    return next((p for p in fold.projections if p.name == name), None)


def _views(fold: Fold, name: str) -> list[Any]:
    projection = _projection(fold, name)
    return list(projection.views.values()) if projection is not None else []


CAPACITY_STATES = ("total", "unschedulable", "held_outside", "allocated", "reserved", "free")
QUOTA_STATES = ("quota", "used", "allocated", "reserved", "available")


class ViewsCollector(Collector):
    """The projector's views, read when scraped: deployments by admission phase and reason,
    devices per cluster and device class, quota use per project and device class; and the
    device-seconds allocated. `fold()`: the projector's current fold (it is replaced when
    the projector starts over from a checkpoint)."""

    def __init__(self, fold: Callable[[], Fold], device_seconds: DeviceSeconds) -> None:
        self._fold, self._device_seconds = fold, device_seconds

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        fold = self._fold()
        yield _deployments(_views(fold, v.DEPLOYMENT_HEALTH.name))
        yield _rows(
            "wingsmith_cluster_devices",
            "Devices per cluster and device class, by state, as admission counts them "
            "(the capacity view).",
            ["cluster", "device_class"],
            [((r["cluster_id"], r["device_class"]), r) for r in _views(fold, v.CAPACITY.name)],
            CAPACITY_STATES,
        )
        yield _rows(
            "wingsmith_quota_devices",
            "Quota and its use per project and device class, in devices (the quota_use view).",
            ["project", "device_class"],
            [((r["project"], r["device_class"]), r) for r in _views(fold, v.QUOTA_USE.name)],
            QUOTA_STATES,
        )
        used = CounterMetricFamily(
            "wingsmith_allocated_gpu_seconds",
            "Device-seconds held by live replicas, per project, device class and cluster "
            "(sampled each second; a rate of it is the devices held, an increase / 3600 "
            "GPU-hours).",
            labels=["project", "device_class", "cluster"],
        )
        for key, seconds in sorted(self._device_seconds.sample().items()):
            used.add_metric(list(key), seconds)
        yield used
        position = GaugeMetricFamily(
            "wingsmith_projector_position", "The store position the views have folded up to."
        )
        position.add_metric([], fold.position)
        yield position


def _deployments(health: list[v.DeploymentHealthView]) -> GaugeMetricFamily:
    counts: dict[tuple[str, str, str, str, str], int] = {}
    for d in health:
        admission = d["admission"]
        key = (
            d["project"],
            d["device_class"],
            d["cluster_id"],
            admission["phase"],
            admission["reason"] or "",
        )
        counts[key] = counts.get(key, 0) + 1
    family = GaugeMetricFamily(
        "wingsmith_deployments",
        "Deployments by project, device class, cluster, admission phase and reason.",
        labels=["project", "device_class", "cluster", "phase", "reason"],
    )
    for key, n in sorted(counts.items()):
        family.add_metric(list(key), n)
    return family


def _rows(
    name: str,
    documentation: str,
    labels: list[str],
    rows: list[tuple[tuple[str, str], Mapping[str, Any]]],
    states: tuple[str, ...],
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[*labels, "state"])
    for key, row in rows:
        for state in states:
            family.add_metric([*key, state], row[state])
    return family
