"""Leader election on a Lease against kmock (real HTTP, the real kubernetes_asyncio client):
never two leaders at once, even when the leader loses the API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from wingsmith.adapters.kube import Kube
from wingsmith.services.operator.leader import Elector, LeaseTimes
from wingsmith.services.tasks import cancel_and_wait

from .kube_fixtures import NAMESPACE, kube_emulator

TIMES = LeaseTimes(duration=3.0, renew_deadline=1.0, retry=0.1)


class Candidate:
    """An elector whose work notes when it starts and stops, in `log`."""

    def __init__(self, kube: Kube, identity: str, log: list[str]) -> None:
        self.elector = Elector(kube, NAMESPACE, "operator", identity, TIMES)
        self.identity, self.log = identity, log
        self.started = asyncio.Event()

    async def work(self) -> None:
        self.log.append(f"{self.identity} starts")
        self.started.set()
        try:
            await asyncio.Future()
        finally:
            self.log.append(f"{self.identity} stops")


@contextlib.asynccontextmanager
async def running(candidate: Candidate) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(candidate.elector.lead(candidate.work))
    try:
        yield task
    finally:
        await cancel_and_wait(task)


@contextlib.asynccontextmanager
async def hanging_server() -> AsyncIterator[str]:
    """An API server that takes requests and never answers them."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_a_leader_cut_off_from_the_api_server_stops_before_another_takes_over() -> None:
    """Its renewals hang (a request would wait 30 s): it stops at its renew deadline, before
    the lease's duration lets the other take over."""
    log: list[str] = []
    async with (
        kube_emulator() as (_, server, kube),
        Kube(host=str(server.url), backoff=(0.01, 0.05)) as other,
        hanging_server() as url,
        Kube(host=url, request_timeout=30) as unreachable,
    ):
        a, b = Candidate(kube, "a", log), Candidate(other, "b", log)
        async with running(a):
            await asyncio.wait_for(a.started.wait(), 10)
            async with running(b):
                await asyncio.sleep(TIMES.duration + 0.5)  # b waits: a renews
                assert log == ["a starts"]
                a.elector.kube = unreachable  # a can no longer renew
                await asyncio.wait_for(b.started.wait(), 10)
                assert log == ["a starts", "a stops", "b starts"]
                lease = await kube.get_lease(NAMESPACE, "operator")
                assert lease is not None
                spec = lease["spec"]
                assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)


async def test_a_leader_that_stops_gives_the_lease_up_and_the_next_leads_at_once() -> None:
    log: list[str] = []
    async with (
        kube_emulator() as (_, server, kube),
        Kube(host=str(server.url), backoff=(0.01, 0.05)) as other,
    ):
        a, b = Candidate(kube, "a", log), Candidate(other, "b", log)
        async with running(a) as leading:
            await asyncio.wait_for(a.started.wait(), 10)
            async with running(b):
                await asyncio.sleep(TIMES.retry * 3)
                await cancel_and_wait(leading)  # a stops cleanly: it releases the lease
                lease = await kube.get_lease(NAMESPACE, "operator")
                assert lease is not None and lease["spec"].get("holderIdentity") is None
                # b takes it at its next try, not after the lease's duration
                await asyncio.wait_for(b.started.wait(), TIMES.duration - TIMES.retry)
        assert log == ["a starts", "a stops", "b starts", "b stops"]
