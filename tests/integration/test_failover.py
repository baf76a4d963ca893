"""Several hubs on one store: one holds the lease and runs the one-per-store roles; another
takes over when it leaves, when it is cut off from NATS, or when it is killed with SIGKILL. A
holder that lost the lease has stopped before the new one starts, and what it still sends is
refused by the store's fence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import nats
import orjson
from nats.aio.client import Client

from wingsmith.adapters.lease import NatsLease
from wingsmith.adapters.nats_server import EmbeddedNatsServer, free_port
from wingsmith.adapters.store import Notification
from wingsmith.domain.admission import Ledger
from wingsmith.domain.base import split_id
from wingsmith.domain.commands import SetQuota
from wingsmith.services.config import Settings
from wingsmith.services.health import Stage
from wingsmith.services.hub.lease import holder_name
from wingsmith.services.hub.relay import event_type
from wingsmith.services.hub.wiring import Hub, running_hub

from .conftest import (
    HubProcess,
    nats_cluster,
    published,
    read_store,
    seed_deployment,
    send_until_answered,
    stream_ids,
    stream_of_commands,
    wait_for,
)
from .test_admission import inventory, workload_body

LEASE = 3.0  # seconds a silent holder's lease stands in the in-process tests
DECISION = ("phase", "reason", "evidence", "devices", "blocker")  # an admission decision's


def hub_settings(url: str, store_url: str, data_dir: Path, **changes: Any) -> Settings:
    return Settings(
        nats_url=url,
        store_url=store_url,
        data_dir=data_dir,
        projector=False,  # its own process: the kill test below runs it
        lease_seconds=changes.pop("lease_seconds", LEASE),
        **changes,
    )


def holding(hub: Hub) -> Callable[[], Awaitable[bool]]:
    async def holds() -> bool:
        return hub.roles is not None

    return holds


def late_quota(command_id: str) -> SetQuota:
    return SetQuota(command_id=command_id, project="late", device_class="H100", devices=1)


async def test_a_standby_takes_over_as_soon_as_the_holder_leaves(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path, store_url: str
) -> None:
    # a lease that stands a minute: taken within seconds, it was taken because it was released
    first = hub_settings(nats_server.url, store_url, tmp_path / "a", lease_seconds=60)
    second = hub_settings(nats_server.url, store_url, tmp_path / "b", lease_seconds=60)
    async with contextlib.AsyncExitStack() as b_stack:
        a_stack = contextlib.AsyncExitStack()
        a = await a_stack.enter_async_context(running_hub(first))
        b = await b_stack.enter_async_context(running_hub(second))
        assert a.roles is not None and b.roles is None  # the first to start holds
        [lease] = [c for c in b.health.report().checks if c.stage is Stage.LEASE]
        assert lease.detail == f"standby; the lease is held by {holder_name(tmp_path / 'a')}"
        await seed_deployment(client)  # commands are answered by both
        a_token = a.leadership.token
        assert a_token is not None
        await a_stack.aclose()
        await wait_for(holding(b), 20, "the standby to take the lease")
        b_token = b.leadership.token
        assert b_token is not None and b_token > a_token
        # fenced: what the old holder's roles might still send is refused, the new one's saved
        refused = await b.commands.execute(late_quota("from-a"), fence=a_token)
        assert refused["error"]["code"] == "fenced", refused
        assert (await b.commands.execute(late_quota("from-b"), fence=b_token))["ok"]
        await assert_stream_matches_store(client, store_url, tmp_path)


async def test_a_reluctant_hub_leaves_the_lease_to_one_that_prefers_it(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path, store_url: str
) -> None:
    """`WINGSMITH_NO_RELAY=true` is a preference: alone, such a hub serves commands at once and
    takes the lease only after a lease's time; a preferring hub started meanwhile takes it."""
    reluctant = hub_settings(nats_server.url, store_url, tmp_path / "r", relay=False)
    preferring = hub_settings(nats_server.url, store_url, tmp_path / "p")
    async with running_hub(reluctant) as r:
        assert r.roles is None
        await seed_deployment(client)  # answered without the roles
        async with running_hub(preferring) as p:
            assert p.roles is not None and r.roles is None
    async with running_hub(reluctant) as r:  # the lease released, and no other hub: it takes it
        await wait_for(holding(r), 10 * LEASE, "the reluctant hub to take it")


async def test_a_holder_cut_off_from_nats_stops_before_another_starts(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path, store_url: str
) -> None:
    async with Cuttable(urlparse(nats_server.url).port or 0) as link:
        first = hub_settings(link.url, store_url, tmp_path / "a")
        second = hub_settings(nats_server.url, store_url, tmp_path / "b")
        async with running_hub(first) as a, running_hub(second) as b:
            assert a.roles is not None and b.roles is None
            a_token = a.leadership.token
            assert a_token is not None
            await seed_deployment(client)
            replies: list[Any] = []
            stream = asyncio.create_task(stream_of_commands(client, "cut", replies, 300))
            await progress(replies, 60)
            link.cut()  # `a` keeps its store, loses NATS
            await wait_for(holding(b), 10 * LEASE, "the standby to take over")
            stopped_at, what, token = a.leadership.transitions[-1]
            started_at, *_ = b.leadership.transitions[-1]
            assert (what, token) == ("stopped", a_token) and a.roles is None
            assert stopped_at < started_at  # one event loop, one clock: comparable
            refused = await a.commands.execute(late_quota("late-a"), fence=a_token)
            assert refused["error"]["code"] == "fenced", refused

            async def back_on_nats() -> bool:
                return a.leadership.unreachable is None

            link.mend()  # back on NATS, it stays a standby
            await stream
            assert len(replies) == 300 and all(r["ok"] for r in replies), replies[:3]
            await wait_for(back_on_nats, 30, "`a` back on NATS")
            assert a.roles is None and b.roles is not None
            await assert_stream_matches_store(client, store_url, tmp_path)


async def test_three_hubs_on_a_nats_cluster_lose_nothing_when_the_holder_is_killed_twice(
    tmp_path: Path, store_url: str
) -> None:
    """The default lease (5 s). Each kill is timed from SIGKILL until another hub holds the
    lease and its relay has published what the killed one had not."""
    async with nats_cluster(tmp_path, 3) as url:
        client = await nats.connect(servers=url.split(","))
        try:
            env = {"WINGSMITH_STORE": store_url, "WINGSMITH_STREAM_REPLICAS": "3"}
            hubs = {
                holder_name(tmp_path / f"hub-{i}"): HubProcess(url, tmp_path / f"hub-{i}", env)
                for i in range(3)
            }
            for hub in hubs.values():
                await hub.start()
                await hub.wait_ready(client)
            lease = await NatsLease.open(client, 3)
            await seed_quota_and_devices(client)
            replies: list[Any] = []
            # about 80 a second: every hub answers commands, failing over or not
            stream = asyncio.create_task(stream_of_commands(client, "kill", replies, 1500, 0.2))
            admissions = asyncio.create_task(workloads_coming_and_going(client, 24))
            takeovers = []
            for step in (200, 800):
                await progress(replies, step)
                assert len(replies) < 1500, "the stream ended before the holder was killed"
                entry = await lease.read()
                assert entry is not None and not entry.released
                killed = hubs[entry.holder]
                killed.kill()
                started = asyncio.get_running_loop().time()

                async def taken(old: int = entry.token) -> bool:
                    now = await lease.read()
                    return now is not None and now.token > old and now.holder in hubs

                await wait_for(taken, 60, "another hub to take the lease")
                takeovers.append(asyncio.get_running_loop().time() - started)
                await killed.start()  # back, as a standby
            await stream
            await admissions
            print(f"takeover after SIGKILL: {', '.join(f'{t:.1f}s' for t in takeovers)}")
            assert len(replies) == 1500 and all(r["ok"] for r in replies), replies[:3]
            notes = await assert_stream_matches_store(client, store_url, tmp_path)
            assert_decided_once_and_within_quota(notes)
            for hub in hubs.values():
                assert hub.terminate() == 0
        finally:
            await client.close()


async def seed_quota_and_devices(nc: Client) -> None:
    """Project research may hold 12 H100; cluster east has 64."""
    await seed_deployment(nc)  # quota 8, east registered, one workload of 2
    quota = {"command_id": "q12", "project": "research", "device_class": "H100", "devices": 12}
    assert (await send_until_answered(nc, "project.set_quota", quota))["ok"]
    await inventory(nc, 64, "inv-64")


async def workloads_coming_and_going(nc: Client, count: int) -> None:
    """Workloads of two replicas pinned to east, every third deleting an earlier one: more
    than the quota holds, so some wait and are admitted as others go."""
    for i in range(count):
        body = workload_body(i, replicas=2, cluster="east")
        assert (await send_until_answered(nc, "workload.create", body))["ok"]
        if i % 3 == 2:
            gone = {"command_id": f"del-w{i - 2}", "workload_id": f"w{i - 2}"}
            assert (await send_until_answered(nc, "workload.delete", gone))["ok"]
        await asyncio.sleep(0.3)


def assert_decided_once_and_within_quota(notes: list[Notification]) -> None:
    """No deployment was decided twice the same way in a row (what two schedulers deciding at
    once would leave), and at no position did a project hold more than its quota."""
    ledger, last = Ledger(), dict[str, dict[str, Any]]()
    for note in notes:
        kind = event_type(note.topic)
        _, aggregate_id = split_id(str(note.originator_id))
        state = orjson.loads(note.state)
        if kind == "AdmissionDecided":  # the same decision on the same evidence, again
            decision = {k: state[k] for k in DECISION}
            assert last.get(aggregate_id) != decision, f"{aggregate_id} twice: {decision}"
            last[aggregate_id] = decision
        if ledger.folds(kind):
            ledger.apply(note.id, kind, aggregate_id, state)
        for key, held in ledger.held_by_project.items():
            assert held <= ledger.quota.get(key, 0), f"{key} holds {held} at {note.id}"
    assert any(decision["phase"] == "admitted" for decision in last.values())


async def progress(replies: list[Any], step: int) -> None:
    async def reached() -> bool:
        return len(replies) >= step

    await wait_for(reached, 60, f"{step} commands answered")


async def assert_stream_matches_store(
    nc: Client, store_url: str, tmp_path: Path
) -> list[Notification]:
    """WINGSMITH_EVENTS ends up holding every stored event once, in store order (the
    scheduler may still be deciding: compared until they agree). The store's events."""
    seen: list[tuple[list[str], list[Notification]]] = []

    async def caught_up() -> bool:
        on_stream, notes = await stream_ids(nc), read_store(tmp_path, store_url)
        seen.append((on_stream, notes))
        return on_stream == published(notes)

    with contextlib.suppress(AssertionError):
        await wait_for(caught_up, 60, "the stream to hold what the store does")
    on_stream, notes = seen[-1]
    assert len(on_stream) == len(set(on_stream)), "an event was published twice"
    assert on_stream == published(notes)  # every stored event, once, in store order
    return notes


class Cuttable:
    """A TCP proxy in front of a nats-server whose connections can be cut and new ones refused,
    as a partition would: the hub behind it loses NATS, not its store."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port, self.port = upstream_port, free_port()
        self.open = True
        self._ends: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Cuttable:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        await self._server.wait_closed()

    def cut(self) -> None:
        self.open = False
        for end in self._ends:
            end.transport.abort()
        self._ends.clear()

    def mend(self) -> None:
        self.open = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._ends |= {writer, up_writer}
        await asyncio.gather(
            _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
