"""Leader election on a Kubernetes Lease, so that of several operator replicas for one cluster
exactly one acts at a time (client-go's algorithm, which Kubernetes' own controllers use).

The leader renews the Lease every `retry` seconds. Another candidate takes it over only when
the Lease's record has not changed for `duration` seconds by its own clock (no clocks are
compared across machines); every write is made as of the resourceVersion it read, so of two
candidates at most one wins. A leader that could not renew for `renew_deadline` seconds (less
than `duration`) stops its work before anyone else can take over; one that stops cleanly
gives the Lease up, and the next takes over at its next try."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from wingsmith.adapters.kube import Kube, KubeConflict, KubeError
from wingsmith.services.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseTimes:
    """In seconds; client-go's defaults are 15, 10 and 2."""

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0

    @classmethod
    def scaled(cls, duration: float) -> LeaseTimes:
        """client-go's proportions for a lease of `duration` seconds."""
        return cls(duration, duration * 2 / 3, duration / 7.5)


class Elector:
    """Candidate `identity` for the Lease `namespace/name`."""

    def __init__(
        self, kube: Kube, namespace: str, name: str, identity: str, times: LeaseTimes
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity, self.times = identity, times
        self._seen: tuple[Any, ...] | None = None  # the Lease's record as last read...
        self._seen_at = 0.0  # ...and since when (monotonic) it has been that

    async def lead(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `work` whenever this candidate leads, until cancelled: it is cancelled when
        the lead is lost, and run again when it is won again."""
        try:
            while True:
                await self._until_leading()
                task = asyncio.create_task(work(), name="leading")
                try:
                    await self._renew_while(task)
                finally:
                    await cancel_and_wait(task)
                log.warning("lease %s/%s: lost the lead; stopped", self.namespace, self.name)
        finally:
            await self._release()

    async def _until_leading(self) -> None:
        while not await self._try():  # noqa: ASYNC110 - polling the API server, not a flag
            await asyncio.sleep(self.times.retry)
        log.info("lease %s/%s: leading as %s", self.namespace, self.name, self.identity)

    async def _renew_while(self, task: asyncio.Task[None]) -> None:
        """Renew every `retry` seconds while `task` runs; return when it ends or when no renewal
        succeeded for `renew_deadline` seconds (a request that hangs counts as failing once
        the deadline has passed)."""
        renewed = time.monotonic()
        while not task.done():
            await asyncio.wait([task], timeout=self.times.retry)
            if task.done():
                break
            left = self.times.renew_deadline - (time.monotonic() - renewed)
            try:
                held = await asyncio.wait_for(self._try(), max(left, 0.001))
            except TimeoutError:
                held = False
            if held:
                renewed = time.monotonic()
            elif time.monotonic() - renewed >= self.times.renew_deadline:
                return
        await task  # its failure is the operator's to see

    async def _try(self) -> bool:
        """Take or renew the Lease; whether this candidate holds it now. Errors count as not
        holding it (the renew deadline decides what that means for a leader)."""
        try:
            lease = await self.kube.get_lease(self.namespace, self.name)
            if lease is None:
                await self.kube.create_lease(self._lease(None))
                return True
            spec = lease.get("spec") or {}
            record = (
                spec.get("holderIdentity"),
                spec.get("renewTime"),
                spec.get("leaseTransitions"),
            )
            if record != self._seen:
                self._seen, self._seen_at = record, time.monotonic()
            holder = spec.get("holderIdentity")
            # the duration the holder advertises: replicas configured apart still agree
            duration = spec.get("leaseDurationSeconds") or self.times.duration
            expired = time.monotonic() - self._seen_at >= duration
            if holder and holder != self.identity and not expired:
                return False
            await self.kube.replace_lease(self._lease(lease))
            return True
        except KubeConflict:
            return False  # someone else wrote it since: read again next time
        except KubeError as e:
            log.warning("lease %s/%s: %s", self.namespace, self.name, e)
            return False

    def _lease(self, current: dict[str, Any] | None) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = dict((current or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:  # taken over (or new)
            transitions = spec.get("leaseTransitions", -1) + 1 if current else 0
            spec |= {"acquireTime": now, "leaseTransitions": transitions}
        spec |= {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.times.duration)),
            "renewTime": now,
        }
        meta = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            meta["resourceVersion"] = current["metadata"].get("resourceVersion", "")
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def _release(self) -> None:
        """Give the Lease up (if held) on a clean stop: the next candidate need not wait it
        out."""
        with contextlib.suppress(KubeError):
            lease = await self.kube.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            released = self._lease(lease)
            released["spec"] |= {"holderIdentity": None, "leaseDurationSeconds": 1}
            await self.kube.replace_lease(released)
            log.info("lease %s/%s: released", self.namespace, self.name)
