"""The hub supervises its projector and says how it is: a projector killed with SIGKILL is back
within seconds, `wingsmith ping` says it is down meanwhile, and WINGSMITH_PROJ holds every view
change exactly once afterwards, even when the kill comes after a pause longer than the stream's
duplicate window and long after the last checkpoint."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import orjson
import pytest
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.dead_letters import DeadLetters
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain import names
from wingsmith.domain.names import HEALTH_SUBJECT
from wingsmith.projections.base import Fold
from wingsmith.projections.fleet import PROJECTIONS
from wingsmith.services.api.app import HUB_HEALTH_TTL
from wingsmith.services.cli import main as cli
from wingsmith.services.config import HealthLimits, Settings
from wingsmith.services.health import ask as ask_health
from wingsmith.services.hub.relay import to_message
from wingsmith.services.hub.supervisor import ChildState
from wingsmith.services.hub.wiring import Hub, running_hub

from .conftest import seed_deployment, send_until_answered, stream_ids, wait_for
from .test_api import api_of

WINDOW = 1.0  # WINGSMITH_PROJ's duplicate window here; the pause before the kill is longer


def expected_changes(data_dir: Path) -> list[str]:
    """The message id of every view change the store's events make, in order: what
    WINGSMITH_PROJ must hold, each once."""
    store = EventStore(store_env(None, data_dir))
    try:
        notes = store.read(0, 10_000_000)
    finally:
        store.close()
    fold, ids = Fold(kind() for kind in PROJECTIONS), []
    for message in filter(None, map(to_message, notes)):
        envelope = orjson.loads(message.payload)
        for projection, key in fold.apply_envelope(envelope):
            if projection.name != "render":  # the render stream keeps only the latest
                ids.append(f"{projection.name}:{key}:{envelope['position']}")
    return list(dict.fromkeys(ids))


async def caught_up(client: Client, hub: Hub) -> bool:
    progress = await nats_bus.projector_progress(client)
    assert hub.relay is not None
    return progress is not None and progress["stream_seq"] == hub.relay.seq > 0


async def ping(capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`wingsmith ping`, as the compose health check runs it (in a thread: it has its own loop)."""
    code = await asyncio.to_thread(cli.main, ["ping", "--timeout", "2"])
    return code, capsys.readouterr().out


async def test_a_killed_projector_is_back_and_nothing_is_published_twice(
    nats_server: EmbeddedNatsServer,
    client: Client,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WINGSMITH_NATS_URL", nats_server.url)  # for `wingsmith ping`
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=tmp_path / "hub",
        views_duplicate_window=WINDOW,
        checkpoint_seconds=3600,  # no checkpoint before the kill: everything is folded again
    )
    async with running_hub(settings) as hub:
        assert hub.projector is not None
        await seed_deployment(client)
        for replicas in (3, 4):
            scale = {
                "command_id": f"scale-{replicas}",
                "workload_id": "llama",
                "replicas": replicas,
            }
            assert (await send_until_answered(client, "workload.scale", scale))["ok"]
        await wait_for(lambda: caught_up(client, hub), 30, "the projector to catch up")
        assert await ping(capsys) == (0, "healthy\n")
        await asyncio.sleep(2 * WINDOW)  # idle for longer than the duplicate window

        killed = hub.projector.status.pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        scale = {"command_id": "scale-while-down", "workload_id": "llama", "replicas": 5}
        assert (await send_until_answered(client, "workload.scale", scale))["ok"]
        said: list[str] = []

        async def back() -> bool:
            code, out = await ping(capsys)
            if code:
                said.append(out)
            return code == 0 and hub.projector is not None and hub.projector.status.restarts == 1

        await wait_for(back, 60, "the projector to be back")
        assert hub.projector.status.state is ChildState.RUNNING
        assert hub.projector.status.pid != killed
        assert any("failing: projector: process" in out for out in said), said
        assert all(out.endswith("unhealthy\n") for out in said)
        await wait_for(lambda: caught_up(client, hub), 30, "the projector to catch up again")

    published = await stream_ids(client, names.VIEWS_STREAM)
    assert len(published) == len(set(published)), "a view change was published twice"
    assert published == expected_changes(settings.data_dir)


async def test_a_stuck_projector_makes_the_hub_unhealthy_until_it_moves(
    nats_server: EmbeddedNatsServer,
    client: Client,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that lives but does not fold (stopped here with SIGSTOP) is found by its lag
    against the limit, and by not moving while behind."""
    monkeypatch.setenv("WINGSMITH_NATS_URL", nats_server.url)
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=tmp_path / "hub",
        health=HealthLimits(projector_lag=1_000, stall_seconds=1.0),
    )
    async with running_hub(settings) as hub:
        assert hub.projector is not None
        await seed_deployment(client)
        await wait_for(lambda: caught_up(client, hub), 30, "the projector to catch up")
        pid = hub.projector.status.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            scale = {"command_id": "scale-stuck", "workload_id": "llama", "replicas": 3}
            assert (await send_until_answered(client, "workload.scale", scale))["ok"]
            outs: list[str] = []

            async def stalled() -> bool:
                code, out = await ping(capsys)
                outs.append(out)
                return code == 1 and "not moving for" in out

            await wait_for(stalled, 30, "the hub to report the stuck projector")
            assert "failing: projector: " in outs[-1]
            assert "events behind, not moving for" in outs[-1]
            hub.health.limits = HealthLimits(projector_lag=0, stall_seconds=3600)
            code, out = await ping(capsys)
            assert code == 1
            assert "events behind (limit 0)" in out
            hub.health.limits = settings.health
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_for(lambda: caught_up(client, hub), 30, "the projector to catch up again")

        async def healthy() -> bool:
            return await ping(capsys) == (0, "healthy\n")

        await wait_for(healthy, 30, "the hub to be healthy again")
        assert hub.projector.status.restarts == 0


async def test_the_api_is_ready_only_while_the_hub_is_healthy(hub: Hub, tmp_path: Path) -> None:
    """`/readyz` carries the hub's health; `/healthz` is the API process alone (a hub problem
    is no reason to restart the API)."""
    assert hub.projector is not None
    async with api_of(hub, tmp_path) as http:

        async def readiness(status: int) -> bool:
            return (await http.get("/readyz")).status_code == status

        await wait_for(lambda: readiness(200), 30, "the API to be ready")
        ready = (await http.get("/readyz")).json()
        assert ready["problems"] == []
        assert ready["hub"]["healthy"] is True
        assert {c["stage"] for c in ready["hub"]["checks"]} >= {"store", "relay", "projector"}

        assert hub.projector.status.pid is not None
        os.kill(hub.projector.status.pid, signal.SIGKILL)
        await wait_for(lambda: readiness(503), 30, "the API to say the hub is not healthy")
        problems = (await http.get("/readyz")).json()["problems"]
        assert any(p.startswith("hub projector: process") for p in problems), problems
        assert (await http.get("/healthz")).status_code == 200
        await wait_for(lambda: readiness(200), 60, "the API to be ready again")
        assert hub.projector.status.restarts == 1


async def test_readyz_asks_the_hub_at_most_once_a_second_however_often_it_is_called(
    hub: Hub, client: Client, tmp_path: Path
) -> None:
    """`/readyz` needs no token: a flood of it must not become a flood of health requests."""
    asked: list[float] = []

    async def count(msg: object) -> None:
        asked.append(asyncio.get_running_loop().time())

    watching = await client.subscribe(HEALTH_SUBJECT, cb=count)
    try:
        async with api_of(hub, tmp_path) as http:
            await wait_for(lambda: _ready(http), 30, "the API to be ready")
            await asyncio.sleep(HUB_HEALTH_TTL)  # the answer that found it ready is old now
            asked.clear()
            started = asyncio.get_running_loop().time()
            answers = await asyncio.gather(*(http.get("/readyz") for _ in range(200)))
            took = asyncio.get_running_loop().time() - started
            await client.flush()
    finally:
        await watching.unsubscribe()
    assert {a.status_code for a in answers} == {200}
    assert 1 <= len(asked) <= took / HUB_HEALTH_TTL + 1, (len(asked), took)


async def _ready(http: httpx.AsyncClient) -> bool:
    return (await http.get("/readyz")).status_code == 200


async def test_dead_letters_are_a_warning_in_the_health_report(
    nats_server: EmbeddedNatsServer,
    client: Client,
    hub: Hub,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something set aside, by any process, is counted and shown; the rest flows on, so the hub
    stays healthy."""
    monkeypatch.setenv("WINGSMITH_NATS_URL", nats_server.url)
    elsewhere = DeadLetters(client)  # as the projector process would
    await elsewhere.set_aside("projector", "cannot fold it", "wingsmith.evt.x.y.Z", b"{")
    await elsewhere.set_aside("projector", "cannot fold it", "wingsmith.evt.x.y.W", b"{")
    await elsewhere.set_aside("relay", "bad subject", "wingsmith.evt.a b", b"{}")
    warned = "warning: dead_letters: 3 set aside (projector: 2, relay: 1)"

    async def shown() -> bool:
        code, out = await ping(capsys)
        return code == 0 and warned in out and out.endswith("healthy\n")

    await wait_for(shown, 30, "the dead letters in the health report")
    report = await ask_health(client, 2)
    assert report.healthy
    assert report.dead_letters.by_component == {"projector": 2, "relay": 1}
