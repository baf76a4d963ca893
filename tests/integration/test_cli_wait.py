"""`wingsmith workloads … --wait` as a person runs it, against a hub, its REST API and a simulated
cluster over a real nats-server: it returns only once every replica is ready on the workload's
current serving config, says why while it waits, and exits 2 with the reason when it gives up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.services.api.server import running_api
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.simulated import SimNode, simulated_operators

from .conftest import LLAMA
from .test_simulated import command, fault, health, serving, until_event, until_status

WINGSMITH = [sys.executable, "-m", "wingsmith"]
CHAT = {"workload_id": "chat", "project": "p", "device_class": "H100", "serving": LLAMA}


@contextlib.asynccontextmanager
async def fleet(
    nats_server: EmbeddedNatsServer, client: Client, data_dir: Path, quota: int
) -> AsyncIterator[dict[str, str]]:
    """A hub, its API and a simulated cluster `east` of 8 devices, with `chat` (not pinned) ready
    on 1 replica under a quota of `quota`: the environment a `wingsmith` command finds them in."""
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=data_dir,
        api_listen=("127.0.0.1", 0),
    )
    nodes = {"east": [SimNode("east-n1", "H100", 8)]}
    async with running_hub(settings), running_api(settings, local_token=True):
        q = {"project": "p", "device_class": "H100", "devices": quota}
        await command(client, "q", "project.set_quota", **q)
        async with simulated_operators(client, nodes, ready_after=0.1):
            await until_event(client, "cluster", "east", "InventoryReported")
            await command(client, "w", "workload.create", **CHAT, replicas=1)
            await until_status(client, "chat--east", "1 replica ready", serving(1))
            clean = {k: v for k, v in os.environ.items() if not k.startswith("WINGSMITH_")}
            yield clean | {"WINGSMITH_DATA_DIR": str(data_dir)}


async def started(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *WINGSMITH, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def finished(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def until_said(process: asyncio.subprocess.Process, text: str) -> list[str]:
    """The lines the command printed on stderr up to the first that says `text`, while it still
    runs (it has not exited: its stderr is still open)."""
    assert process.stderr is not None
    lines: list[str] = []
    while not lines or text not in lines[-1]:
        line = await asyncio.wait_for(process.stderr.readline(), 60)
        assert line, f"it exited before saying {text!r}: {lines}"
        lines.append(line.decode())
    return lines


async def deployment(env: dict[str, str]) -> dict[str, Any]:
    """`wingsmith deployments get chat--east --json`: the API's document."""
    got = await started(env, "deployments", "get", "chat--east", "--json")
    code, out, err = await finished(got)
    assert code == 0, err
    document: dict[str, Any] = orjson.loads(out)
    return document


def ready_on(document: dict[str, Any], digest: str) -> int:
    return sum(1 for r in document["replicas"] if r["ready"] and r["serving_digest"] == digest)


async def test_scale_and_rollout_wait_until_every_replica_is_ready_on_the_current_config(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    async with fleet(nats_server, client, tmp_path / "hub", quota=8) as env:
        # given pods that start and never become ready (their image cannot be pulled)
        assert (await fault(client, "east", fault="image_pull", deployment_id="chat--east"))["ok"]
        scale = await started(env, "workloads", "scale", "chat", "3", "--wait", "--timeout", "90")
        # the pods of all three replicas exist, none is ready: it says so and still waits
        said = await until_said(scale, "ImagePullBackOff (3 pods)")
        assert "east: 0/3 ready" in said[-1], said

        assert (await fault(client, "east", fault="clear", deployment_id="chat--east"))["ok"]
        code, out, err = await finished(scale)
        assert code == 0, err
        assert "replicas: 3" in out
        digest = (await health(client, "chat--east"))["serving_digest"]
        assert ready_on(await deployment(env), digest) == 3  # ready when it returned, not after

        rollout = await started(
            env, "workloads", "serving", "chat", "--context-length", "4096", "--wait"
        )
        code, out, err = await finished(rollout)
        assert code == 0, err
        document = await deployment(env)
        assert document["serving_digest"] != digest
        assert ready_on(document, document["serving_digest"]) == 3


async def test_a_scale_past_quota_waits_saying_why_and_exits_2_at_its_timeout(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    async with fleet(nats_server, client, tmp_path / "hub", quota=4) as env:
        scale = await started(env, "workloads", "scale", "chat", "6", "--wait", "--timeout", "8")
        said = await until_said(scale, "insufficient_quota")
        code, _, err = await finished(scale)
        assert code == 2
        reason = "2 replicas wait: insufficient_quota (quota 4, others hold 0, wanted 6, granted 4"
        assert reason in said[-1], said  # said while it waited
        last = err.splitlines()[-1]  # and when it gave up
        assert last.startswith("wingsmith: workload chat not ready after 8s: 4/6 replicas ready")
        assert reason in last, err
        view = await health(client, "chat--east")
        assert (view["ready_replicas"], view["waiting_replicas"]) == (4, 2)  # what fits runs
