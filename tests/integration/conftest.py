"""Integration fixtures: a hub in this process or in its own, and a NATS client that sends
commands the way a careful client does (same command_id until it gets an answer)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from nats.aio.client import Client

from wingsmith.adapters import nats_auth, nats_bus
from wingsmith.adapters.nats_auth import Credentials
from wingsmith.adapters.nats_server import EmbeddedNatsServer, free_port
from wingsmith.adapters.store import EventStore, Notification, store_env
from wingsmith.services.config import Settings
from wingsmith.services.hub.relay import to_message
from wingsmith.services.hub.wiring import Hub, running_hub

LLAMA = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "backend": "vllm",
    "engine_version": "0.9.2",
    "devices_per_replica": 1,
}

# Every role's password on a server with users (adapters/nats_auth.py), east and west operating.
PASSWORDS = {
    "hub": "hub-pw",
    "operator-east": "east-pw",
    "operator-west": "west-pw",
    "cli": "cli-pw",
    "api": "api-pw",
    "viewer": "viewer-pw",
}


def roles_config() -> str:
    """The nats-server configuration of a fleet with a user for every role."""
    return nats_auth.server_config(
        Credentials("hub", PASSWORDS["hub"]),
        {"east": PASSWORDS["operator-east"], "west": PASSWORDS["operator-west"]},
        client=Credentials("cli", PASSWORDS["cli"]),
        api=Credentials("api", PASSWORDS["api"]),
        viewer=Credentials("viewer", PASSWORDS["viewer"]),
    )


@pytest.fixture
async def hub(nats_server: EmbeddedNatsServer, tmp_path: Path) -> AsyncIterator[Hub]:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    async with running_hub(settings) as running:
        yield running


@pytest.fixture
async def plain_hub(nats_server: EmbeddedNatsServer, tmp_path: Path) -> AsyncIterator[Hub]:
    """A hub without the admission process: only commands write, so a test can count on
    exactly the events its commands record."""
    settings = Settings(
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", admission=False
    )
    async with running_hub(settings) as running:
        yield running


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `wingsmith` process as a person's shell has it: none of this
    machine's WINGSMITH_ settings, its own data directory, the API on any free port."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WINGSMITH_")}
    return clean | {
        "WINGSMITH_DATA_DIR": str(tmp_path / "data"),
        "WINGSMITH_API_LISTEN": "127.0.0.1:0",
    }


@pytest.fixture
async def client(nats_server: EmbeddedNatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    yield nc
    await nc.close()


async def send(nc: Client, verb: str, body: dict[str, Any] | bytes, timeout: float = 10) -> Any:
    payload = body if isinstance(body, bytes) else orjson.dumps(body)
    msg = await nc.request(f"wingsmith.cmd.{verb}", payload, timeout=timeout)
    return orjson.loads(msg.data)


async def send_until_answered(nc: Client, verb: str, body: dict[str, Any]) -> Any:
    """Resend the same command (same command_id) until a hub answers; give up after 60 s."""
    for _ in range(240):
        try:
            reply = await send(nc, verb, body, timeout=2)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            await asyncio.sleep(0.25)
            continue
        if reply.get("ok") or reply["error"]["code"] not in ("unavailable", "conflict"):
            return reply
        await asyncio.sleep(0.1)
    raise AssertionError(f"{verb} {body['command_id']} never answered")


async def operator_heard(nc: Client, cluster_id: str) -> None:
    """One heartbeat from the cluster's operator, as the operator sends it: placement chooses
    only clusters an operator has spoken for. Returns once the hub has recorded it."""
    operator = {"instance": "test", "version": "1", "read_only": False}
    body = {"cluster_id": cluster_id, "operator": operator}
    await nats_bus.publish_observation(nc, cluster_id, "heartbeat", body, f"hb-{cluster_id}")
    subject = f"wingsmith.evt.cluster.{cluster_id}.OperatorConnected"
    stream = await nc.jetstream().subscribe(subject, ordered_consumer=True)
    try:
        await stream.next_msg(timeout=30)
    finally:
        await stream.unsubscribe()


async def seed_deployment(nc: Client, prefix: str = "s") -> str:
    """A project, a cluster and a workload pinned to it: returns the deployment id."""
    quota: dict[str, Any] = {
        "command_id": f"{prefix}-q",
        "project": "research",
        "device_class": "H100",
        "devices": 8,
    }
    cluster: dict[str, Any] = {"command_id": f"{prefix}-c", "cluster_id": "east"}
    workload: dict[str, Any] = {
        "command_id": f"{prefix}-w",
        "workload_id": "llama",
        "project": "research",
        "device_class": "H100",
        "serving": LLAMA,
        "replicas": 2,
        "cluster": "east",
    }
    for verb, body in [
        ("project.set_quota", quota),
        ("cluster.register", cluster),
        ("workload.create", workload),
    ]:
        reply = await send_until_answered(nc, verb, body)
        assert reply["ok"], reply
    return "llama--east"


def read_store(data_dir: Path, store_url: str | None = None) -> list[Notification]:
    store = EventStore(store_env(store_url, data_dir))
    try:
        return store.read(0, 10_000_000)
    finally:
        store.close()


def published(notes: list[Notification]) -> list[str]:
    """The message ids the relay must publish for these stored records, in order."""
    return [m.msg_id for m in map(to_message, notes) if m is not None]


async def stream_ids(nc: Client, stream: str = "WINGSMITH_EVENTS") -> list[str]:
    """Every message id on the stream, in stream order."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    if not info.state.messages:
        return []
    ids = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(stream, seq=seq)
        ids.append((msg.headers or {})["Nats-Msg-Id"])
    return ids


async def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.1)


class HubProcess:
    """`wingsmith up` in its own process, so a test can kill it with SIGKILL."""

    def __init__(self, nats_url: str, data_dir: Path, extra_env: dict[str, str] | None = None):
        self.env = (
            os.environ
            | {
                "WINGSMITH_NATS_URL": nats_url,
                "WINGSMITH_DATA_DIR": str(data_dir),
                "WINGSMITH_API_LISTEN": "127.0.0.1:0",  # any free port: tests run side by side
            }
            | (extra_env or {})
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir / "hub.log"
        data_dir.mkdir(parents=True, exist_ok=True)

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "wingsmith", "-v", "up"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    async def wait_ready(self, nc: Client) -> None:
        async def ready() -> bool:
            try:
                await nc.request("wingsmith.cmd.ping", b"{}", timeout=0.5)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                return False
            return True

        await wait_for(ready, 30, "the hub to answer")
        assert self.process is not None
        if self.process.poll() is not None:  # another hub answered: this one did not start
            raise AssertionError(f"the hub exited: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


async def stream_of_commands(
    nc: Client, prefix: str, done: list[Any], count: int, pace: float = 0.05
) -> None:
    """Sixteen clients each resending a command until answered, pausing `pace` seconds after
    each answer, so that failures land while the stream still runs."""
    semaphore = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with semaphore:
            body = {
                "command_id": f"{prefix}-{i}",
                "project": f"team-{i % 20}",
                "device_class": "H100",
                "devices": i,
            }
            done.append(await send_until_answered(nc, "project.set_quota", body))
            await asyncio.sleep(pace)

    await asyncio.gather(*(one(i) for i in range(count)))


@contextlib.asynccontextmanager
async def nats_cluster(tmp_path: Path, size: int) -> AsyncIterator[str]:
    """A JetStream cluster of `size` nats-servers with an elected meta leader: their URLs,
    comma-separated, as a client is given them."""
    routes = [free_port() for _ in range(size)]
    servers = [
        EmbeddedNatsServer(
            tmp_path / f"nats-{i}",
            extra_args=(
                "--name",
                f"nats-{i}",
                "--cluster_name",
                "wingsmith",
                "--cluster",
                f"nats://127.0.0.1:{routes[i]}",
                "--routes",
                ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i),
            ),
        )
        for i in range(size)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for server in servers:
            await stack.enter_async_context(server)
        url = ",".join(s.url for s in servers)
        nc = await nats.connect(servers=url.split(","))
        try:

            async def meta_leader() -> bool:
                try:
                    await nc.jetstream().account_info()
                except Exception:
                    return False
                return True

            await wait_for(meta_leader, 30, "a JetStream meta leader")
        finally:
            await nc.close()
        yield url
