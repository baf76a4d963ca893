"""The hub's consumer sweep: deletes every lasting consumer on Wingsmith's streams that is not
one the control plane keeps.

The server's permissions keep read-only users (`cli`, `api`, `viewer`) away from the hub's and
the operators' consumers, but whether a new consumer is durable is said in the request body,
which permissions never see: a reader may create a durable consumer under a name of its own
(docs/nats-security.md). Such a consumer reaches nobody else's data, yet it stays on the server
for good. The hub therefore lists the consumers of every Wingsmith stream on start and every
`WINGSMITH_CONSUMER_SWEEP` seconds, and deletes each one that lasts (durable, or ephemeral with
an inactivity threshold above `MAX_EPHEMERAL_IDLE`) and is not the hub's observation consumer or
the render consumer of a cluster whose operator reports (a pull consumer, as both are made).

Which clusters have operators comes from the server, not from a list the hub would have to be
told: a heartbeat on `wingsmith.obs.<cluster>.heartbeat` can only have been published by that
cluster's operator user (or the hub), so the configuration that grants the operator its
permissions is also what makes the hub keep its consumer. A newly started operator creates its
consumer while its first heartbeat is on the way, so a stranger is deleted only when two sweeps
in a row have seen it (the same consumer: same stream, name and creation time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from wingsmith.adapters.nats_auth import operator_consumer
from wingsmith.adapters.nats_bus import Connection
from wingsmith.adapters.nats_consumers import ConsumerSeen, NatsConsumerAdmin
from wingsmith.domain.names import HUB_CONSUMER, OBS_STREAM, RENDER_STREAM
from wingsmith.services.tasks import Backoff, cancel_and_wait, supervise

log = logging.getLogger(__name__)

# nats-py's ordered consumers, and any ephemeral one left to the server's default, lapse after
# 5 s without interest; one kept longer than this is a durable one in all but name.
MAX_EPHEMERAL_IDLE = 300.0
DEFAULT_SWEEP = 5.0  # seconds between sweeps (WINGSMITH_CONSUMER_SWEEP)
FAILING_CAP = 60.0  # seconds at most between sweeps that keep failing

Key = tuple[str, str, datetime]  # stream, name, created: one consumer, not a later namesake


def key(consumer: ConsumerSeen) -> Key:
    return consumer.stream, consumer.name, consumer.created


def kept_durables(cluster_ids: Iterable[str]) -> frozenset[tuple[str, str]]:
    """(stream, name) of every lasting consumer the control plane keeps: the hub's on the
    observation stream, and each reporting cluster's operator's on the render stream. The
    names are those of `nats_auth.durable_consumers`, which the readers' permissions deny."""
    operators = {(RENDER_STREAM, operator_consumer(c)) for c in cluster_ids}
    return frozenset({(OBS_STREAM, HUB_CONSUMER), *operators})


def lasting(consumer: ConsumerSeen, max_idle: float = MAX_EPHEMERAL_IDLE) -> bool:
    """Whether the consumer outlives the client that made it for longer than an ordered one."""
    idle = consumer.inactive_threshold
    return consumer.durable or idle is None or idle > max_idle


def _kept(consumer: ConsumerSeen, kept: frozenset[tuple[str, str]]) -> bool:
    """The control plane's consumers are all pulled from. One of their names with a deliver
    subject was recreated as a push consumer (an operator may do that to its own) to send its
    messages elsewhere: deleted, the operator makes it again as it should be."""
    return (consumer.stream, consumer.name) in kept and not consumer.push


@dataclass(frozen=True, slots=True)
class Verdict:
    delete: list[ConsumerSeen]  # strangers seen by the previous sweep too
    suspects: frozenset[Key]  # strangers seen now: the next sweep deletes those still there


def sweep_verdict(
    consumers: Iterable[ConsumerSeen],
    cluster_ids: Iterable[str],
    suspects: frozenset[Key] = frozenset(),
    max_idle: float = MAX_EPHEMERAL_IDLE,
) -> Verdict:
    """Which consumers to delete now, given what the previous sweep suspected."""
    kept = kept_durables(cluster_ids)
    strangers = [c for c in consumers if lasting(c, max_idle) and not _kept(c, kept)]
    delete = [c for c in strangers if key(c) in suspects]
    return Verdict(delete, frozenset(map(key, strangers)))


class ConsumerAdmin(Protocol):
    """What the sweep needs of NATS (adapters.nats_consumers.NatsConsumerAdmin)."""

    async def consumers(self) -> list[ConsumerSeen]: ...

    async def reporting_clusters(self) -> set[str]: ...

    async def delete(self, consumer: ConsumerSeen) -> bool: ...


def valid_cluster_id(cluster_id: str) -> bool:
    try:
        operator_consumer(cluster_id)
    except ValueError:
        return False
    return True


@dataclass
class ConsumerJanitor:
    """Sweeps every `every` seconds until cancelled; a sweep that fails (the server away for a
    moment) is logged and tried again, `every` seconds later at first, then less often while
    it keeps failing."""

    admin: ConsumerAdmin
    every: float = DEFAULT_SWEEP
    max_idle: float = MAX_EPHEMERAL_IDLE
    removed: int = 0  # consumers deleted since the hub started
    sweeps: int = 0  # sweeps completed
    suspects: frozenset[Key] = field(default_factory=frozenset)

    async def sweep(self) -> list[ConsumerSeen]:
        """One sweep; what it deleted."""
        clusters = {c for c in await self.admin.reporting_clusters() if valid_cluster_id(c)}
        consumers = await self.admin.consumers()
        verdict = sweep_verdict(consumers, clusters, self.suspects, self.max_idle)
        deleted = [c for c in verdict.delete if await self.admin.delete(c)]
        for consumer in deleted:
            self.removed += 1
            _log_deleted(consumer, self.removed)
        self.suspects = verdict.suspects - set(map(key, verdict.delete))
        self.sweeps += 1
        return deleted

    async def run(self) -> None:
        # NATS errors and timeouts alike: the sweep is tried again
        backoff = Backoff(first=self.every, cap=max(self.every, FAILING_CAP), jitter=self.every / 2)
        await supervise("consumer sweep", self._sweeps, backoff, logger=log)

    async def _sweeps(self) -> None:
        while True:
            await self.sweep()
            await asyncio.sleep(self.every)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[None]]:
        """Sweeping, for as long as the block runs."""
        task = asyncio.create_task(self.run(), name="wingsmith-consumer-sweep")
        try:
            yield task
        finally:
            await cancel_and_wait(task)


def hub_janitor(nc: Connection, every: float) -> ConsumerJanitor:
    """The sweep on the hub's own connection, which may use the whole JetStream API."""
    return ConsumerJanitor(NatsConsumerAdmin(nc), every)


def _log_deleted(consumer: ConsumerSeen, removed: int) -> None:
    kind = "durable" if consumer.durable else "long-lived ephemeral"
    log.warning(
        "deleted %s consumer %r on stream %s (filter %s): not one the control plane keeps; "
        "%d deleted since start",
        kind,
        consumer.name,
        consumer.stream,
        consumer.filter or "none",
        removed,
    )
