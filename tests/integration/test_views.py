"""Projection streams as a subscriber sees them: every change, from now, from a sequence or
from a time, and no update missed across a nats-server restart. Against a real hub with its
projector process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub

from .conftest import seed_deployment, send_until_answered, wait_for

HEALTH = "wingsmith.proj.deployment_health.llama--east"


async def scale(nc: Client, replicas: int) -> None:
    body = {"command_id": f"scale-{replicas}", "workload_id": "llama", "replicas": replicas}
    reply = await send_until_answered(nc, "workload.scale", body)
    assert reply["ok"], reply


class Subscriber:
    """Reads a projection subject in a task of its own, keeping what arrives."""

    def __init__(self, nc: Client, start: nats_bus.Start, subject: str = HEALTH) -> None:
        self.messages: list[nats_bus.StreamMessage] = []
        stream = nats_bus.read_stream(nc, names.VIEWS_STREAM, subject, follow=True, start=start)
        self._task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: AsyncIterator[nats_bus.StreamMessage]) -> None:
        async for m in stream:
            self.messages.append(m)

    def desired(self) -> list[int]:
        return [orjson.loads(m.data)["desired_replicas"] for m in self.messages]

    async def until(self, last: int) -> list[int]:
        async def arrived() -> bool:
            return bool(self.messages) and self.desired()[-1] == last

        await wait_for(arrived, 30, f"desired_replicas={last} on {HEALTH}")
        return self.desired()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest.fixture
async def nc(nats_server: EmbeddedNatsServer) -> AsyncIterator[Client]:
    client = await nats.connect(
        nats_server.url,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
    )
    yield client
    await client.close()


async def test_every_change_reaches_subscribers_from_any_start_and_across_a_restart(
    nats_server: EmbeddedNatsServer, nc: Client, tmp_path: Path, store_url: str
) -> None:
    settings = Settings(  # without admission, the views change only with the commands
        nats_url=nats_server.url, store_url=store_url, data_dir=tmp_path / "hub", admission=False
    )
    async with running_hub(settings):
        await seed_deployment(nc)
        current = Subscriber(nc, "last")  # the current view, then every change
        assert await current.until(2) == [2]
        from_now = Subscriber(nc, "new")
        await asyncio.sleep(0.5)  # subscribed before the next change
        for replicas in range(3, 9):
            await scale(nc, replicas)
        await current.until(8)

        await nats_server.stop()  # subscribers and the projector lose the server
        await asyncio.sleep(0.5)
        await nats_server.start()
        for replicas in range(9, 13):
            await scale(nc, replicas)
        assert await current.until(12) == list(range(2, 13))  # every change, in order, once
        assert await from_now.until(12) == list(range(3, 13))

        sixth, seventh = current.messages[4:6]  # desired_replicas 6 and 7
        from_seq = Subscriber(nc, seventh.seq)
        from_time = Subscriber(nc, sixth.time + (seventh.time - sixth.time) / 2)
        assert await from_seq.until(12) == list(range(7, 13))
        assert await from_time.until(12) == list(range(7, 13))
        for subscriber in (current, from_now, from_seq, from_time):
            await subscriber.close()
        replay = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "wingsmith",
            "replay",
            env=os.environ
            | {
                "WINGSMITH_NATS_URL": nats_server.url,
                "WINGSMITH_STORE": store_url,
                "WINGSMITH_DATA_DIR": str(settings.data_dir),
            },
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await replay.communicate()
        assert replay.returncode == 0 and b"the live views equal the rebuild" in out, out


async def test_changes_within_one_batch_are_each_published(
    nats_server: EmbeddedNatsServer, nc: Client, tmp_path: Path
) -> None:
    """Commands arriving together are committed and projected as one batch; a subscriber still
    sees each view change, not only where the batch left the view."""
    settings = Settings(
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", admission=False
    )
    async with running_hub(settings):
        await seed_deployment(nc)
        replies = await asyncio.gather(
            *(send_until_answered(nc, "project.set_quota", quota(n)) for n in range(9, 29))
        )
        assert all(r["ok"] for r in replies)
        quota_sub = Subscriber(nc, 1, "wingsmith.proj.quota_use.research.H100")

        async def all_published() -> bool:
            return len(quota_sub.messages) == 21  # the first quota, then 20 changes

        await wait_for(all_published, 30, "every quota change")
        quotas = [orjson.loads(m.data)["quota"] for m in quota_sub.messages]
        assert quotas[0] == 8 and sorted(quotas[1:]) == list(range(9, 29))
        await quota_sub.close()


def quota(devices: int) -> dict[str, Any]:
    return {
        "command_id": f"quota-{devices}",
        "project": "research",
        "device_class": "H100",
        "devices": devices,
    }
