"""The REST API through a real HTTP client: a hub, a real nats-server, the API on a free port,
and operators on simulated clusters (or on kmock, for discovery). Every seed endpoint of the
concept document is exercised here; so are bad inputs and authentication, which must store
nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.domain.contracts import views as v
from wingsmith.domain.contracts.replies import Accepted
from wingsmith.services.api.server import running_api
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import Hub, running_hub
from wingsmith.services.operator.backends.simulated import (
    nodes_from_spec,
    simulated_operators,
)
from wingsmith.services.operator.inspect import load_manifest

from ..schemas import check
from .conftest import LLAMA, wait_for
from .kube_fixtures import NAMESPACE, cluster_create, node
from .test_adoption import FIXTURE, operator_on_kmock

WRITER = "w" * 24
READER = "r" * 24
PROBLEM = "application/problem+json"
WORKLOAD = {
    "workload_id": "llama",
    "project": "search",
    "device_class": "H100",
    "replicas": 2,
    "serving": LLAMA,
}


@contextlib.asynccontextmanager
async def api_of(hub: Hub, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = replace(
        Settings.from_env({"WINGSMITH_DATA_DIR": str(tmp_path / "api")}),
        nats_url=hub.nats_url,
        api_listen=("127.0.0.1", 0),
        api_tokens={WRITER: "tests"},
        api_read_tokens={READER: "auditor"},
    )
    settings.data_dir.mkdir(parents=True)
    async with (
        running_api(settings) as api,
        httpx.AsyncClient(base_url=api.url, headers=bearer(WRITER), timeout=20) as http,
    ):
        yield http


@pytest.fixture
async def api(hub: Hub, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with api_of(hub, tmp_path) as http:
        yield http


@pytest.fixture
async def east(hub: Hub) -> AsyncIterator[None]:
    clusters = {"east": nodes_from_spec("east", "2x8:H100")}
    async with simulated_operators(hub.nc, clusters, ready_after=0.2, heartbeat_every=0.5):
        yield


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


async def stored(hub: Hub) -> int:
    return int(await hub.store.run(hub.store.store.last_position))


async def until(http: httpx.AsyncClient, path: str, **fields: Any) -> dict[str, Any]:
    """The resource at `path` once each of `fields` has the value given (the cluster reports
    replicas and status separately: wait for all that a check needs)."""
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal seen
        seen = (await http.get(path)).json()
        return all(seen.get(name) == value for name, value in fields.items())

    await wait_for(reached, 30, f"{path} {fields}")
    return seen


async def test_a_workload_from_quota_to_running_to_deleted(
    hub: Hub, api: httpx.AsyncClient, east: None
) -> None:
    await until(api, "/v1/clusters/east", reachable=True)
    quota = ok(await api.put("/v1/projects/search/quotas/H100", json={"devices": 8}))
    assert quota["quotas"][0] | {"quota": 8} == quota["quotas"][0]

    created = await api.post("/v1/workloads", json=WORKLOAD)
    body = ok(created, 201)
    assert created.headers["location"] == "/v1/workloads/llama"
    assert (body["workload_id"], body["replicas"]) == ("llama", 2)
    assert ok(await api.get("/v1/workloads/llama"))["project"] == "search"  # read your write

    running = await until(api, "/v1/workloads/llama", phase="running")
    assert running["deployments"][0]["deployment_id"] == "llama--east"
    listed = ok(await api.get("/v1/workloads", params={"project": "search", "phase": "running"}))
    assert [w["workload_id"] for w in listed["workloads"]] == ["llama"]
    assert ok(await api.get("/v1/workloads", params={"project": "other"}))["workloads"] == []

    ready: dict[str, object] = {
        "phase": "ready",
        "reason": None,
        "message": None,
        "ready_replicas": 2,
        "conditions": [],
    }
    deployment = await until(
        api,
        "/v1/deployments/llama--east",
        ready_replicas=2,
        status=ready | {"desired_replicas": 2},
        live_digests={running["serving_digest"]: 2},
    )
    assert len(deployment["replicas"]) == 2
    assert all(len(replica["device_ids"]) == 1 for replica in deployment["replicas"])
    for ref in ("llama/east", "llama@east", "llama"):  # readable names for the same deployment
        assert ok(await api.get(f"/v1/deployments/{ref}"))["deployment_id"] == "llama--east"
    capacity = ok(await api.get("/v1/capacity", params={"cluster": "east"}))["capacity"]
    assert capacity[0]["allocated"] == 2
    nodes = ok(await api.get("/v1/clusters/east/nodes"))["nodes"]
    assert sum(n["allocated"] for n in nodes) == 2
    assert ok(await api.get("/v1/projects/search"))["quotas"][0]["used"] == 2

    scaled = ok(await api.post("/v1/workloads/llama/scale", json={"replicas": 3}))
    assert scaled["replicas"] == 3
    prefer = {"preferred_clusters": ["east"], "strategy": "spread"}
    preferred = ok(await api.put("/v1/workloads/llama/preferences", json=prefer))
    assert preferred["preferences"] == prefer | {"cluster_selector": {}}
    assert preferred["moves"] == []
    await until(api, "/v1/deployments/llama", ready_replicas=3)

    serving = LLAMA | {"engine_version": "0.9.3"}
    changed = ok(await api.put("/v1/workloads/llama/serving", json={"serving": serving}))
    assert changed["serving_digest"] != running["serving_digest"]

    args = ["--max-model-len", "8192"]
    deployment = ok(await api.put("/v1/deployments/llama/engine-args", json={"engine_args": args}))
    assert deployment["engine_args"] == args
    assert ok(await api.post("/v1/deployments/llama/disable"))["enabled"] is False
    assert ok(await api.post("/v1/deployments/llama/enable"))["enabled"] is True

    history = ok(await api.get("/v1/events", params={"aggregate": "workload:llama"}))["events"]
    assert [e["type"] for e in history][:2] == ["WorkloadCreated", "DeploymentAttached"]
    scale = next(e for e in history if e["type"] == "WorkloadScaled")
    assert scale["changes"]["replicas"] == {"before": 2, "after": 3}
    phases = ok(await api.get("/v1/events", params={"aggregate": "deployment:llama--east"}))
    kinds = [e["type"] for e in phases["events"]]
    order = ["DeploymentCreated", "AdmissionDecided", "DeploymentPlaced", "DeploymentRunning"]
    assert [kinds.index(kind) for kind in order] == sorted(kinds.index(kind) for kind in order)
    page = ok(await api.get("/v1/events", params={"aggregate": "deployment", "limit": 2}))
    after = ok(
        await api.get("/v1/events", params={"aggregate": "deployment", "since": page["next"]})
    )
    seqs = [e["seq"] for e in page["events"] + after["events"]]
    assert len(page["events"]) == 2 and seqs == sorted(set(seqs)) and after["next"] is None
    whole = ok(await api.get("/v1/events", params={"aggregate": "deployment"}))
    assert [e["seq"] for e in whole["events"]][: len(seqs)] == seqs  # the pages are the whole

    deleted = await api.delete("/v1/workloads/llama")
    assert ok(deleted, 202)["deployments"] == ["llama--east"]
    assert (await api.get("/v1/workloads/llama")).status_code == 404
    free = {"cluster_id": "east", "device_class": "H100", "total": 16, "allocated": 0}
    nothing_else = {"unschedulable": 0, "held_outside": 0, "reserved": 0}
    await until(api, "/v1/clusters/east", capacity=[free | nothing_else | {"free": 16}])


async def test_every_resource_is_exactly_its_contracts_document(
    hub: Hub, api: httpx.AsyncClient, east: None
) -> None:
    """What the API serves, with a workload running and a model found running beside it, is
    what domain/contracts/views.py says: no key missing, none unknown."""
    await until(api, "/v1/clusters/east", reachable=True)
    ok(await api.put("/v1/projects/search/quotas/H100", json={"devices": 8}))
    ok(await api.post("/v1/workloads", json=WORKLOAD), 201)
    await until(api, "/v1/workloads/llama", phase="running")
    await until(api, "/v1/deployments/llama--east", ready_replicas=2)
    fault = {"fault": "run_model", "name": "qwen", "engine_version": "1", "gpus": 1}
    await nats_bus.request(hub.nc, names.fault_subject("east"), orjson.dumps(fault), 5)

    async def sighted() -> bool:
        return len(ok(await api.get("/v1/discovered"))["discovered"]) == 1

    await wait_for(sighted, 20, "the sighting")
    served = {
        "/v1/workloads": v.WorkloadList,
        "/v1/workloads/llama": v.Workload,
        "/v1/deployments": v.DeploymentList,
        "/v1/deployments/llama--east": v.Deployment,
        "/v1/discovered": v.DiscoveredList,
        "/v1/discovered/qwen": v.DiscoveredView,
        "/v1/projects": v.ProjectList,
        "/v1/projects/search": v.Project,
        "/v1/clusters": v.ClusterList,
        "/v1/clusters/east": v.Cluster,
        "/v1/capacity": v.CapacityList,
        "/v1/clusters/east/nodes": v.NodeList,
        "/v1/events?limit=1000": v.AuditPage,
    }
    for path, contract in served.items():
        document = ok(await api.get(path))
        try:
            check(contract, document)
        except Exception as e:
            raise AssertionError(f"{path}: {e}") from e
    assert ok(await api.get("/v1/deployments/llama--east"))["replicas"]  # replicas were checked


async def test_discovered_model_is_tracked_ignored_promoted_and_taken_over(
    hub: Hub, api: httpx.AsyncClient
) -> None:
    manifest = load_manifest(FIXTURE.read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    async with operator_on_kmock(hub.nc) as (emulator, _, _):
        await cluster_create(emulator, "node", node("gpu-1", product="H100", gpus=8))
        await cluster_create(emulator, "dgd/v1beta1", manifest)

        async def sighted() -> bool:
            return bool(ok(await api.get("/v1/discovered"))["discovered"])

        await wait_for(sighted, 20, "the discovery to be listed")
        [found] = ok(await api.get("/v1/discovered"))["discovered"]
        assert (found["name"], found["state"]) == ("qwen3-chat", "sighted")

        ignored = ok(await api.post("/v1/discovered/qwen3-chat/ignore"))
        assert ignored["state"] == "ignored"
        assert ok(await api.get("/v1/discovered"))["discovered"] == []  # hidden by default
        listed = ok(await api.get("/v1/discovered", params={"include_ignored": "true"}))
        assert [d["name"] for d in listed["discovered"]] == ["qwen3-chat"]

        tracked = ok(await api.post(f"/v1/discovered/{NAMESPACE}/qwen3-chat/track"))
        assert tracked["state"] == "tracked"
        assert ok(await api.get("/v1/deployments"))["deployments"] == []  # tracking adds none

        await api.put("/v1/projects/search/quotas/H100", json={"devices": 8})
        promoted = await api.post("/v1/discovered/qwen3-chat/promote", json={"project": "search"})
        workload = ok(promoted, 201)
        assert promoted.headers["location"] == "/v1/workloads/qwen3-chat"
        assert workload["cluster"] == "east"
        deployment = ok(await api.get("/v1/deployments/qwen3-chat"))
        assert deployment["authority"] == "observed"
        assert deployment["imported_args"]

        refused = await api.post("/v1/deployments/qwen3-chat/authority", json={"authority": "x"})
        assert refused.status_code == 422 and refused.json()["field"] == "authority"
        await api.put(
            "/v1/deployments/qwen3-chat/engine-args",
            json={"engine_args": deployment["imported_args"]},
        )
        taken = await api.post(
            "/v1/deployments/qwen3-chat/authority", json={"authority": "managed"}
        )
        assert ok(taken)["authority"] == "managed"


BAD_REQUESTS: list[tuple[str, str, dict[str, Any], int, str]] = [
    # method, path, request kwargs, status, the first field at fault
    ("POST", "/v1/workloads", {"json": WORKLOAD | {"replicas": "2"}}, 422, "replicas"),
    ("POST", "/v1/workloads", {"json": WORKLOAD | {"colour": "red"}}, 422, "colour"),
    ("POST", "/v1/workloads", {"json": WORKLOAD | {"workload_id": "Llama!"}}, 422, "workload_id"),
    (
        "POST",
        "/v1/workloads",
        {"json": WORKLOAD | {"serving": LLAMA | {"devices_per_replica": 0}}},
        422,
        "serving.devices_per_replica",
    ),
    ("POST", "/v1/workloads", {"json": WORKLOAD | {"project": None}}, 422, "project"),
    ("POST", "/v1/workloads", {"json": {"workload_id": "x"}}, 422, "project"),
    ("POST", "/v1/workloads", {"json": WORKLOAD | {"project": "nobody"}}, 404, "project"),
    ("POST", "/v1/workloads/llama/scale", {"json": {"replicas": 1}}, 404, "ref"),
    ("POST", "/v1/workloads", {"json": WORKLOAD | {"strategy": "scatter"}}, 422, "strategy"),
    (
        "POST",
        "/v1/workloads",
        {"json": WORKLOAD | {"cluster_selector": {"no spaces": "x"}}},
        422,
        "cluster_selector.no spaces.[key]",
    ),
    (
        "POST",
        "/v1/workloads",
        {"json": WORKLOAD | {"preferred_clusters": ["mars"]}},
        404,
        "preferred_clusters",
    ),
    ("PUT", "/v1/workloads/llama/preferences", {"json": {"strategy": "spread"}}, 404, "ref"),
    ("POST", "/v1/deployments/nothing/enable", {}, 404, "ref"),
    ("POST", "/v1/discovered/nothing/track", {}, 404, "ref"),
    ("PUT", "/v1/projects/search/quotas/H100", {"json": {"devices": -1}}, 422, "devices"),
    ("PUT", "/v1/projects/Search!/quotas/H100", {"json": {"devices": 1}}, 422, "project"),
    ("GET", "/v1/events", {"params": {"limit": 0}}, 422, "query.limit"),
    ("GET", "/v1/events", {"params": {"aggregate": "workload:a.b"}}, 422, "query.aggregate"),
    (
        "POST",
        "/v1/workloads",
        {"json": WORKLOAD, "headers": {"Idempotency-Key": "no spaces"}},
        400,
        "header.Idempotency-Key",
    ),
    (
        "PUT",
        "/v1/projects/search/quotas/H100",
        {"json": {"devices": 1}, "headers": {"Idempotency-Key": "obs:east:replica:1"}},
        422,
        "command_id",
    ),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "field"), BAD_REQUESTS)
async def test_bad_input_is_a_problem_naming_the_field_and_stores_nothing(
    hub: Hub,
    api: httpx.AsyncClient,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    field: str,
) -> None:
    ok(await api.put("/v1/projects/search/quotas/H100", json={"devices": 8}))
    before = await stored(hub)
    response = await api.request(method, path, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert (problem["status"], problem["field"]) == (status, field), problem
    assert problem["type"].endswith(problem["code"]) and problem["detail"]
    assert await stored(hub) == before


async def test_malformed_bodies_are_refused(hub: Hub, api: httpx.AsyncClient) -> None:
    before = await stored(hub)
    cases: list[tuple[dict[str, Any], int]] = [
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
        ({"content": b"replicas=2", "headers": {"content-type": "text/plain"}}, 415),
        ({"json": {"x": "y" * 70_000}}, 413),
        ({"json": [1, 2]}, 422),
    ]
    for kwargs, status in cases:
        response = await api.post("/v1/workloads", **kwargs)
        assert response.status_code == status, response.text
        assert response.headers["content-type"] == PROBLEM
    assert await stored(hub) == before


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (b'{"workload_id": "a", "project": "search", "workload_id": "b"}', "workload_id"),
        (b'{"workload_id": "a", "serving": {"model": "m", "model": "n"}}', "model"),
    ],
)
async def test_a_key_given_twice_is_refused_naming_it(
    hub: Hub, api: httpx.AsyncClient, body: bytes, key: str
) -> None:
    """Which of two values counts depends on the parser: the sender is told, not guessed for."""
    before = await stored(hub)
    json = {"content-type": "application/json"}
    response = await api.post("/v1/workloads", content=body, headers=json)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert (problem["code"], problem["field"]) == ("invalid_json", key)
    assert repr(key) in problem["detail"]
    assert await stored(hub) == before


async def test_unknown_routes_and_methods_are_problems(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/nothing")).json()["status"] == 404
    wrong = await api.delete("/v1/clusters")
    assert wrong.status_code == 405 and wrong.headers["content-type"] == PROBLEM


async def test_without_a_valid_token_nothing_changes(hub: Hub, api: httpx.AsyncClient) -> None:
    before = await stored(hub)
    quota: dict[str, Any] = {"json": {"devices": 8}}
    async with httpx.AsyncClient(base_url=api.base_url) as anonymous:
        for headers in ({}, bearer("not-a-token"), {"Authorization": f"Basic {WRITER}"}):
            response = await anonymous.put("/v1/projects/p/quotas/H100", headers=headers, **quota)
            assert response.status_code == 401, headers
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["code"] == "unauthorized"
        read_only = await anonymous.put(
            "/v1/projects/p/quotas/H100", headers=bearer(READER), **quota
        )
        assert read_only.status_code == 403
        assert (await anonymous.get("/v1/projects", headers=bearer(READER))).status_code == 200
        assert (await anonymous.get("/v1/projects")).status_code == 401
    assert await stored(hub) == before


async def test_an_idempotency_key_makes_a_resend_harmless(hub: Hub, api: httpx.AsyncClient) -> None:
    ok(await api.put("/v1/projects/search/quotas/H100", json={"devices": 8}))
    key = {"Idempotency-Key": "create-llama-1"}
    first = await api.post("/v1/workloads", json=WORKLOAD, headers=key)
    again = await api.post("/v1/workloads", json=WORKLOAD, headers=key)
    assert ok(first, 201)["created_at"] == ok(again, 201)["created_at"]  # the same workload
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["wingsmith-command-id"] == "create-llama-1"
    other = await api.post("/v1/workloads", json=WORKLOAD | {"replicas": 5}, headers=key)
    assert other.status_code == 409 and other.json()["code"] == "command_id_reused"
    assert (await api.post("/v1/workloads", json=WORKLOAD)).json()["code"] == "already_exists"


async def test_openapi_describes_the_concept_paths(api: httpx.AsyncClient) -> None:
    schema = ok(await api.get("/openapi.json", headers={}))
    paths = schema["paths"]
    assert "post" in paths["/v1/deployments/{ref}/authority"]
    for verb in ("track", "ignore", "promote"):
        assert "post" in paths[f"/v1/discovered/{{ref}}/{verb}"]
    assert {"get", "post"} <= paths["/v1/workloads"].keys()
    body = paths["/v1/workloads"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].endswith("/CreateWorkloadRequest")
    assert "ServingConfig" in schema["components"]["schemas"]


async def test_without_the_projector_a_write_is_accepted_and_a_resend_says_so_again(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """Views that do not catch up (no projector) make a write 202 with the hub's result; the
    same request resent is the same command, answered the same way, never a 404."""
    settings = Settings(
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", projector=False
    )
    async with running_hub(settings) as hub, api_of(hub, tmp_path) as api:
        key = {"Idempotency-Key": "quota-1"}
        for _ in range(2):
            response = await api.put("/v1/projects/p/quotas/H100", json={"devices": 4}, headers=key)
            assert response.status_code == 202, response.text
            assert response.json()["result"]["quota"] == {"H100": 4}
            assert response.json()["consistent"] is False
            check(Accepted, response.json())
        assert response.headers["idempotent-replayed"] == "true"
        assert await stored(hub) == 3  # ProjectRegistered, QuotaSet, the receipt: once


async def test_a_name_that_fits_several_things_is_a_conflict_listing_them(
    hub: Hub, api: httpx.AsyncClient
) -> None:
    clusters = {name: nodes_from_spec(name, "1x4:H100") for name in ("east", "west")}
    async with simulated_operators(hub.nc, clusters, ready_after=0.1):
        for cluster in clusters:  # the same model, run by hand on both clusters
            fault = {"fault": "run_model", "name": "qwen", "engine_version": "1", "gpus": 1}
            await nats_bus.request(hub.nc, names.fault_subject(cluster), orjson.dumps(fault), 5)

        async def both_listed() -> bool:
            return len(ok(await api.get("/v1/discovered"))["discovered"]) == 2

        await wait_for(both_listed, 20, "both sightings")
        ambiguous = await api.post("/v1/discovered/qwen/track")
        assert ambiguous.status_code == 409, ambiguous.text
        problem = ambiguous.json()
        assert (problem["code"], problem["field"]) == ("ambiguous_reference", "ref")
        assert problem["candidates"] == ["east--default--qwen", "west--default--qwen"]
        assert ok(await api.post("/v1/discovered/west/default/qwen/track"))["state"] == "tracked"
        assert ok(await api.get("/v1/discovered/east--default--qwen"))["state"] == "sighted"


async def test_a_hub_that_is_behind_is_a_503_with_its_retry_hint(
    hub: Hub, api: httpx.AsyncClient
) -> None:
    assert hub.commands.backpressure is not None
    hub.commands.backpressure.max_waiting = 0  # as if 4,096 commands waited already
    response = await api.put("/v1/projects/search/quotas/H100", json={"devices": 8})
    assert response.status_code == 503, response.text
    problem = response.json()
    assert problem["code"] == "busy" and problem["retry_after_ms"] > 0
    assert int(response.headers["Retry-After"]) >= 1
    hub.commands.backpressure.max_waiting = 4096
    ok(await api.put("/v1/projects/search/quotas/H100", json={"devices": 8}))
