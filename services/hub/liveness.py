"""Cluster liveness: operators send heartbeats, and a cluster whose operator has been silent
for longer than the configured silence is marked unreachable. Placement then stops choosing
it, and its deployments keep their last status, flagged stale. Its next heartbeat marks it
reachable again (`handlers.observe_heartbeat`).

Only clusters an operator has ever spoken for are watched; after a hub restart the silence of
each is counted from the restart.
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
        operated: Callable[[], Mapping[str, bool]],
        silence: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`operated()`: every cluster an operator has spoken for, and whether it is
        reachable now."""
        self._execute, self._operated, self.silence, self._clock = execute, operated, silence, clock
        self._started = clock()
        self._heard: dict[str, float] = {}

    def heard(self, cluster_id: str) -> None:
        self._heard[cluster_id] = self._clock()

    def silent(self) -> list[str]:
        """Reachable clusters whose operator has been silent for too long."""
        now = self._clock()
        return [
            cluster
            for cluster, reachable in self._operated().items()
            if reachable and now - self._heard.get(cluster, self._started) > self.silence
        ]

    async def run(self) -> None:
        await supervise("liveness", self._watch, logger=log)

    async def _watch(self) -> None:
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
