"""The NATS configuration in docker-compose.yml, on a real nats-server: the hub and an operator,
each logged in as its own user, run a workload to `running`; the operator cannot speak for
another cluster. This keeps the compose file and the code's needs in step."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

import httpx
import nats.errors
import pytest
import yaml

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_auth import Credentials
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.api.server import running_api
from wingsmith.services.config import Settings
from wingsmith.services.health import ask as ask_health
from wingsmith.services.hub.wiring import running_hub
from wingsmith.services.operator.backends.simulated import SimNode, SimulatedCluster
from wingsmith.services.operator.runtime import OperatorOptions, run_operator

from .conftest import LLAMA, send_until_answered, wait_for

COMPOSE = Path(__file__).parent.parent.parent / "docker-compose.yml"
PASSWORDS = {
    "WINGSMITH_HUB_PASSWORD": "hub-pw",
    "WINGSMITH_EAST_PASSWORD": "east-pw",
    "WINGSMITH_WEST_PASSWORD": "west-pw",
    "WINGSMITH_CLI_PASSWORD": "cli-pw",
    "WINGSMITH_API_NATS_PASSWORD": "api-pw",
}


def compose_nats_config() -> str:
    """The server configuration as Compose hands it to nats-server (`$$` is Compose's `$`)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    content: str = compose["configs"]["nats-auth"]["content"]
    return content.replace("$$", "$")


async def test_the_compose_users_run_the_system_and_keep_operators_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in PASSWORDS.items():
        monkeypatch.setenv(name, value)  # the server reads the passwords from its environment
    async with EmbeddedNatsServer(tmp_path / "nats", config=compose_nats_config()) as server:
        settings = Settings(
            nats_url=server.url,
            store_url=None,
            data_dir=tmp_path / "hub",
            nats_credentials=Credentials("hub", "hub-pw"),
        )
        async with running_hub(settings):
            east = await nats_bus.connect_operator(
                server.url, "east", user="operator-east", password="east-pw"
            )
            cli = await nats_bus.connect(server.url, "cli", user="cli", password="cli-pw")
            cluster = SimulatedCluster("east", [SimNode("east-n1", "H100", 4)], ready_after=0.1)
            options = OperatorOptions(cluster_id="east", simulated=True, heartbeat_every=0.5)
            operator = asyncio.create_task(run_operator(east, cluster, options))
            try:
                quota = {"project": "p", "device_class": "H100", "devices": 4}
                await send_until_answered(cli, "project.set_quota", {"command_id": "q"} | quota)

                async def registered() -> bool:
                    reply = await send_until_answered(
                        cli,
                        "workload.create",
                        {
                            "command_id": "w",
                            "workload_id": "chat",
                            "project": "p",
                            "device_class": "H100",
                            "serving": LLAMA,
                            "replicas": 2,
                            "cluster": "east",
                        },
                    )
                    return bool(reply["ok"])

                await wait_for(registered, 30, "the operator's heartbeat to register east")

                async def running() -> bool:
                    stream = nats_bus.read_stream(
                        cli,
                        names.EVENTS_STREAM,
                        "wingsmith.evt.deployment.chat--east.DeploymentRunning",
                        follow=False,
                    )
                    return [m async for m in stream] != []

                await wait_for(running, 30, "the workload to run on east")
                assert (await ask_health(cli, 5)).healthy  # what `wingsmith ping` asks
                await the_api_serves_as_its_own_user(settings)
                with pytest.raises(nats.errors.Error):
                    await nats_bus.publish_observation(
                        east, "west", "heartbeat", {"cluster_id": "west"}, "spoof"
                    )
            finally:
                operator.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await operator
                await east.close()
                await cli.close()


async def the_api_serves_as_its_own_user(hub: Settings) -> None:
    """The REST API, logged in as `api`, reads the views and the history and sends commands."""
    token = "compose-test-token-0123"
    settings = replace(
        hub,
        nats_credentials=Credentials("api", "api-pw"),
        api_listen=("127.0.0.1", 0),
        api_tokens={token: "test"},
    )
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, headers=auth, timeout=20) as http,
    ):
        assert (await http.get("/v1/deployments/chat")).json()["admission_phase"] == "running"
        history = (await http.get("/v1/events", params={"aggregate": "workload:chat"})).json()
        assert history["events"][0]["type"] == "WorkloadCreated"
        scaled = await http.post("/v1/workloads/chat/scale", json={"replicas": 1})
        assert scaled.status_code == 200, scaled.text
        assert scaled.json()["replicas"] == 1

        async def ready() -> bool:  # the compose health check: the hub's health, as `api`
            return (await http.get("/readyz")).status_code == 200

        await wait_for(ready, 30, "the API to be ready")
