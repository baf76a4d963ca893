"""Names reused on the real stack: a hub and a simulated cluster over a real nats-server. A
workload is deleted until its pods are gone, its name is declared again, the new incarnation
runs under the name with an id and a history of its own, and `wingsmith audit workload:<name>`
shows both; over REST, the name is its current incarnation. Two creates racing for a free name
against the real event store: one is kept."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.client import Client

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import Conflict, EventStore, store_env
from wingsmith.domain import commands as c
from wingsmith.domain.base import Aggregate, Cause
from wingsmith.domain.workload_name import WorkloadName
from wingsmith.services.cli import history
from wingsmith.services.config import Settings
from wingsmith.services.hub.classes import ReportedClasses
from wingsmith.services.hub.handlers import create_workload, delete_workload, set_quota
from wingsmith.services.hub.wiring import Hub, running_hub
from wingsmith.services.operator.backends.simulated import (
    SimNode,
    nodes_from_spec,
    simulated_operators,
)

from .conftest import LLAMA, send_until_answered, wait_for
from .test_api import WORKLOAD, api_of, ok, until
from .test_simulated import command, event_types, pinned, until_event, view


async def audit(ref: str) -> int:
    """`wingsmith audit <ref> --json`, as the command line runs it: its exit status."""
    parser = argparse.ArgumentParser()
    history.audit(parser)
    args = parser.parse_args([ref, "--json"])
    return int(await args.run(args))


async def test_a_deleted_workloads_name_runs_again_as_a_new_incarnation(
    nats_server: EmbeddedNatsServer,
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    nodes = {"east": [SimNode("east-n1", "H100", 4)]}
    async with running_hub(settings):
        await command(client, "q", "project.set_quota", project="p", device_class="H100", devices=8)
        async with simulated_operators(
            client, nodes, ready_after=0.1, heartbeat_every=0.3
        ) as simulated:
            await until_event(client, "cluster", "east", "InventoryReported")
            first = await command(client, "w1", "workload.create", **pinned("chat", 2))
            assert (first["workload_id"], first["incarnation"]) == ("chat", 1)
            await until_event(client, "deployment", "chat--east", "DeploymentRunning")
            await command(client, "d1", "workload.delete", workload_id="chat")

            async def pods_gone() -> bool:
                return not simulated["east"].pods.get("chat--east")

            await wait_for(pods_gone, 30, "the simulated cluster to stop chat's pods")
            again = await command(client, "w2", "workload.create", **pinned("chat", 4))
            assert (again["workload_id"], again["name"], again["incarnation"]) == (
                "chat--2",
                "chat",
                2,
            )
            await until_event(client, "deployment", "chat--2--east", "DeploymentRunning")

            async def running() -> bool:
                phase = await view(client, "workload_phase", "chat") or {}
                return phase.get("workload_id") == "chat--2" and phase.get("phase") == "running"

            await wait_for(running, 30, "the name's phase to be its second incarnation's")
            refused = await send_until_answered(
                client, "workload.create", {"command_id": "w3"} | pinned("chat", 1)
            )
            assert refused["error"]["code"] == "already_exists", refused

        declared = await view(client, "workloads", "chat")
        assert declared is not None
        assert (declared["workload_id"], declared["incarnation"], declared["replicas"]) == (
            "chat--2",
            2,
            4,
        )
        assert declared["deployments"] == {"east": "chat--2--east"}
        assert await event_types(client, "workload", "chat--2") == [
            "WorkloadCreated",
            "DeploymentAttached",
        ]
        assert (await event_types(client, "workload", "chat"))[-1] == "WorkloadDeleted"

    monkeypatch.setenv("WINGSMITH_NATS_URL", nats_server.url)
    assert await audit("workload:chat") == 0
    entries = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    shown = [(e["aggregate"], e["aggregate_id"], e["type"], e.get("incarnation")) for e in entries]
    assert shown == [
        ("workload", "chat", "WorkloadCreated", 1),
        ("workload", "chat", "DeploymentAttached", 1),
        ("workload", "chat", "WorkloadDeleted", 1),
        ("workload_name", "chat", "WorkloadNameClaimed", None),
        ("workload", "chat--2", "WorkloadCreated", 2),
        ("workload", "chat--2", "DeploymentAttached", 2),
    ]


class StoredRepo:
    """The handlers' repository over the real event store, as one hub of two would see it."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.touched: dict[str, Aggregate] = {}
        self.classes = ReportedClasses()

    def reported_device_classes(self) -> frozenset[str]:
        return self.classes.read(self.store)

    def get(self, cls: type[Any], key: str) -> Any:
        agg_id = cls.store_id(key)
        if agg_id not in self.touched:
            found = self.store.load(agg_id)
            if found is None:
                return None
            self.touched[agg_id] = found
        return self.touched[agg_id]

    def add(self, aggregate: Aggregate) -> None:
        self.touched[aggregate.id] = aggregate

    def save(self) -> None:
        self.store.save([e for a in self.touched.values() for e in a.collect_events()])


def test_two_creates_racing_for_a_free_name_are_stored_once(tmp_path: Path) -> None:
    store = EventStore(store_env(None, tmp_path))
    cause = Cause(command_id="c", correlation_id="c", at=datetime.now(UTC))
    try:
        given = StoredRepo(store)
        set_quota(
            given, c.SetQuota(command_id="q", project="p", device_class="H100", devices=8), cause
        )
        body = {"workload_id": "chat", "project": "p", "device_class": "H100"}
        create = c.CreateWorkload.model_validate(
            {"command_id": "w", "serving": LLAMA, "replicas": 1} | body
        )
        create_workload(given, create, cause)
        delete_workload(given, c.DeleteWorkload(command_id="d", workload_id="chat"), cause)
        given.save()
        one, other = StoredRepo(store), StoredRepo(store)
        assert create_workload(one, create, cause)["workload_id"] == "chat--2"
        assert create_workload(other, create, cause)["workload_id"] == "chat--2"
        one.save()
        with pytest.raises(Conflict):
            other.save()  # the hub reloads and runs it again: `chat` is taken then
        record = store.load(WorkloadName.store_id("chat"))
        assert isinstance(record, WorkloadName) and record.incarnations == ("chat", "chat--2")
    finally:
        store.close()


@pytest.fixture
async def api(hub: Hub, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with api_of(hub, tmp_path) as http:
        yield http


@pytest.fixture
async def east(hub: Hub) -> AsyncIterator[None]:
    clusters = {"east": nodes_from_spec("east", "1x4:H100")}
    async with simulated_operators(hub.nc, clusters, ready_after=0.1, heartbeat_every=0.5):
        yield


async def test_over_rest_a_name_is_its_current_incarnation(
    hub: Hub, api: httpx.AsyncClient, east: None
) -> None:
    await until(api, "/v1/clusters/east", reachable=True)
    ok(await api.put("/v1/projects/search/quotas/H100", json={"devices": 8}))
    pinned = WORKLOAD | {"cluster": "east", "replicas": 1}
    assert ok(await api.post("/v1/workloads", json=pinned), 201)["workload_id"] == "llama"
    ok(await api.delete("/v1/workloads/llama"), 202)
    again = await api.post("/v1/workloads", json=pinned | {"replicas": 2})
    body = ok(again, 201)
    assert (body["workload_id"], body["name"], body["incarnation"]) == ("llama--2", "llama", 2)
    assert again.headers["Location"] == "/v1/workloads/llama"
    await until(api, "/v1/workloads/llama", workload_id="llama--2", phase="running")
    listed = ok(await api.get("/v1/deployments", params={"workload": "llama"}))["deployments"]
    assert [d["deployment_id"] for d in listed] == ["llama--2--east"]
    one = ok(await api.get("/v1/deployments/llama/east"))
    assert one["deployment_id"] == "llama--2--east"
    taken = await api.post("/v1/workloads", json=pinned)
    assert taken.status_code == 409, taken.text
    history = ok(await api.get("/v1/events", params={"aggregate": "workload:llama"}))["events"]
    shown = [(e["aggregate_id"], e["type"], e.get("incarnation")) for e in history]
    assert shown == [
        ("llama", "WorkloadCreated", 1),
        ("llama", "DeploymentAttached", 1),
        ("llama", "WorkloadDeleted", 1),
        ("llama", "WorkloadNameClaimed", None),
        ("llama--2", "WorkloadCreated", 2),
        ("llama--2", "DeploymentAttached", 2),
    ]
