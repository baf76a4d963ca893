"""Cluster liveness: operators send heartbeats, and a cluster whose operator has been silent
for longer than the configured silence is marked unreachable. Placement then stops choosing
it, and its deployments keep their last status, flagged stale. Its next heartbeat marks it
reachable again (`handlers.observe_heartbeat`).

Every known cluster is watched, including one registered with an inventory whose operator has
never spoken: its silence is counted from when this hub first knew of it (after a restart, from
the restart), and it is marked unreachable once that silence is too long. Placement does not
choose it meanwhile either (`Ledger.operated`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from wingsmith.domain.commands import SILENCE_PREFIX, Command, SetClusterReachability
from wingsmith.services.tasks import supervise

log = logging.getLogger(__name__)

LOOKS_PER_SILENCE = 4  # a silent cluster is marked at most a quarter of the silence late

Execute = Callable[[Command], Awaitable[dict[str, Any]]]


class Liveness:
    def __init__(
        self,
        execute: Execute,
        clusters: Callable[[], Mapping[str, bool]],
        silence: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clusters()`: every known cluster, and whether it is reachable now."""
        self._execute, self._clusters, self.silence, self._clock = execute, clusters, silence, clock
        self._heard: dict[str, float] = {}  # last heard from, or first known of

    def heard(self, cluster_id: str) -> None:
        self._heard[cluster_id] = self._clock()

    def silences(self) -> dict[str, float]:
        """Seconds since each cluster was heard from, or first known."""
        now = self._clock()
        return {cluster: now - heard for cluster, heard in self._heard.items()}

    def silent(self) -> list[str]:
        """Reachable clusters silent for too long since heard from, or since first known."""
        now = self._clock()
        return [
            cluster
            for cluster, reachable in self._clusters().items()
            if now - self._heard.setdefault(cluster, now) > self.silence and reachable
        ]

    async def run(self) -> None:
        await supervise("liveness", self._watch, logger=log)

    async def _watch(self) -> None:
        self.silent()  # what is known now is counted from now
        while True:
            await asyncio.sleep(self.silence / LOOKS_PER_SILENCE)
            for cluster in self.silent():
                await self._mark_unreachable(cluster)

    async def _mark_unreachable(self, cluster: str) -> None:
        command = SetClusterReachability(
            command_id=f"{SILENCE_PREFIX}{cluster}-{time.time_ns()}",
            cluster_id=cluster,
            reachable=False,
        )
        reply = await self._execute(command)
        if reply.get("ok"):
            log.warning(
                "cluster %s: no heartbeat for %.0f s; marked unreachable", cluster, self.silence
            )
        else:
            log.warning("cluster %s: could not mark unreachable: %s", cluster, reply.get("error"))
