"""/metrics scraped over HTTP from a real hub (a real nats-server, its projector process, real
commands through the REST API, an operator on a simulated cluster), checked against the views
the projector publishes; and every metric the Grafana dashboard queries found in a scrape."""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain.contracts import views as v
from wingsmith.services.api.server import running_api
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import Hub, running_hub
from wingsmith.services.metrics import serving_metrics
from wingsmith.services.operator.backends.simulated import nodes_from_spec, simulated_operators

from .conftest import LLAMA, wait_for

ROOT = Path(__file__).parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "wingsmith.json"
TOKEN = "t" * 24
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Fleet:
    hub: Hub
    api: httpx.AsyncClient  # the REST API, which also serves the hub's and operator's metrics
    hub_metrics: str  # the same registry on WINGSMITH_METRICS_LISTEN
    projector_metrics: str
    nc: Client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def fleet(nats_server: EmbeddedNatsServer, tmp_path: Path) -> AsyncIterator[Fleet]:
    """`wingsmith up --simulated east=2x8:H100` as its parts: one registry for the hub, the
    API and the operator; the projector in its own process with its own /metrics."""
    port = free_port()
    settings = Settings(
        nats_url=nats_server.url,
        store_url=None,
        data_dir=tmp_path / "hub",
        api_listen=("127.0.0.1", 0),
        api_tokens={TOKEN: "tests"},
        projector_metrics_listen=("127.0.0.1", port),
    )
    clusters = {"east": nodes_from_spec("east", "2x8:H100")}
    async with contextlib.AsyncExitStack() as stack:
        hub = await stack.enter_async_context(running_hub(settings))
        api = await stack.enter_async_context(running_api(settings, registry=hub.registry))
        listen = ("127.0.0.1", 0)
        url = await stack.enter_async_context(serving_metrics(hub.registry, listen, "the hub"))
        assert url is not None
        await stack.enter_async_context(
            simulated_operators(
                hub.nc, clusters, ready_after=0.2, heartbeat_every=0.5, registry=hub.registry
            )
        )
        http = await stack.enter_async_context(
            httpx.AsyncClient(
                base_url=api.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20
            )
        )
        yield Fleet(hub, http, url, f"http://127.0.0.1:{port}/metrics", hub.nc)


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


async def scrape_when_up(url: str) -> Samples:
    """A scrape of a process that may still be starting (the projector)."""
    found: Samples = {}

    async def up() -> bool:
        nonlocal found
        try:
            found = await scrape(url)
        except httpx.TransportError:
            return False
        return True

    await wait_for(up, 30, f"{url} to answer")
    return found


def series(samples: Samples, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {k: value for (n, k), value in samples.items() if n == name and want <= set(k)}


def value(samples: Samples, name: str, **labels: str) -> float:
    found = series(samples, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {found}"
    return next(iter(found.values()))


async def views(nc: Client, kind: v.Kind[Any]) -> list[Any]:
    return [orjson.loads(d) for _, d in (await nats_bus.latest_views(nc, kind.name)).values() if d]


async def seed(fleet: Fleet) -> None:
    """A quota of 8 H100 for research, a workload of 2 that runs, one of 8 more than the
    quota has left, and a command refused for a missing field."""
    api = fleet.api
    assert (await api.get("/v1/clusters/east")).status_code in (200, 404)
    await wait_for(
        lambda: _reachable(api), 30, "the simulated cluster to register and report devices"
    )
    quota = await api.put("/v1/projects/research/quotas/H100", json={"devices": 8})
    assert quota.status_code == 200, quota.text
    for workload_id, replicas in (("llama", 2), ("big", 8)):
        body = {
            "workload_id": workload_id,
            "project": "research",
            "device_class": "H100",
            "replicas": replicas,
            "serving": LLAMA,
            "cluster": "east",
        }
        created = await api.post("/v1/workloads", json=body)
        assert created.status_code in (200, 201, 202), created.text
    refused = await api.post("/v1/workloads", json={"workload_id": "no-serving"})
    assert refused.status_code == 422


async def _reachable(api: httpx.AsyncClient) -> bool:
    response = await api.get("/v1/clusters/east")
    return response.status_code == 200 and bool(response.json().get("devices"))


async def test_metrics_agree_with_the_views(fleet: Fleet) -> None:
    await seed(fleet)

    async def llama_running() -> bool:
        found = await views(fleet.nc, v.DEPLOYMENT_HEALTH)
        return any(
            d["deployment_id"] == "llama--east" and d["admission"]["phase"] == "running"
            for d in found
        )

    await wait_for(llama_running, 60, "llama to run")

    # the projector's gauges are its views: they equal what it publishes, once it is idle
    async def projector_matches_views() -> bool:
        samples = await scrape_when_up(fleet.projector_metrics)
        capacity = await views(fleet.nc, v.CAPACITY)
        quota = await views(fleet.nc, v.QUOTA_USE)
        health = await views(fleet.nc, v.DEPLOYMENT_HEALTH)
        devices = {
            (r["cluster_id"], r["device_class"], state): float(r[state])
            for r in capacity
            for state in ("total", "allocated", "reserved", "free")
        }
        scraped_devices = {
            (dict(k)["cluster"], dict(k)["device_class"], dict(k)["state"]): n
            for k, n in series(samples, "wingsmith_cluster_devices").items()
            if dict(k)["state"] in ("total", "allocated", "reserved", "free")
        }
        used = {(r["project"], r["device_class"]): float(r["used"]) for r in quota}
        scraped_used = {
            (dict(k)["project"], dict(k)["device_class"]): n
            for k, n in series(samples, "wingsmith_quota_devices", state="used").items()
        }
        phases: dict[tuple[str, str, str], float] = {}
        for d in health:
            key = (d["cluster_id"], d["admission"]["phase"], d["admission"]["reason"] or "")
            phases[key] = phases.get(key, 0) + 1
        scraped_phases = {
            (dict(k)["cluster"], dict(k)["phase"], dict(k)["reason"]): n
            for k, n in series(samples, "wingsmith_deployments").items()
        }
        return bool(capacity) and (devices, used, phases) == (
            scraped_devices,
            scraped_used,
            scraped_phases,
        )

    await wait_for(projector_matches_views, 30, "the projector's metrics to equal its views")
    samples = await scrape(fleet.projector_metrics)
    assert value(samples, "wingsmith_cluster_devices", cluster="east", state="total") == 16
    held = value(samples, "wingsmith_cluster_devices", cluster="east", state="allocated")
    assert held == value(samples, "wingsmith_quota_devices", project="research", state="used")
    assert value(samples, "wingsmith_quota_devices", project="research", state="quota") == 8
    assert sum(series(samples, "wingsmith_deployments").values()) == 2  # llama and big
    assert series(samples, "wingsmith_deployments", phase="running")

    # device-seconds grow while llama's 2 devices are held (sampled each second)
    key = {"project": "research", "device_class": "H100", "cluster": "east"}
    first = value(samples, "wingsmith_allocated_gpu_seconds_total", **key)

    async def grew() -> bool:
        later = await scrape(fleet.projector_metrics)
        return value(later, "wingsmith_allocated_gpu_seconds_total", **key) >= first + 2

    await wait_for(grew, 30, "allocated GPU-seconds to grow")

    async def every_stage_moved() -> bool:
        found = series(await scrape(fleet.hub_metrics), "wingsmith_store_position")
        return len(found) == 4 and all(found.values())

    await wait_for(every_stage_moved, 30, "the hub to look at every stage")
    before = fleet.hub.commands.commits  # commits go on meanwhile: the operator reports
    hub = await scrape(fleet.hub_metrics)
    after = fleet.hub.commands.commits
    ok = value(hub, "wingsmith_commands_total", subject="workload.create", outcome="ok")
    assert ok == 2
    assert value(hub, "wingsmith_commands_total", subject="project.set_quota", outcome="ok") == 1
    assert value(hub, "wingsmith_command_duration_seconds_count", subject="workload.create") == 2
    assert before <= value(hub, "wingsmith_group_commit_commands_count") <= after
    assert value(hub, "wingsmith_group_commit_commands_sum") >= 3
    assert value(hub, "wingsmith_admission_wait_seconds_count", device_class="H100") >= 1
    assert value(hub, "wingsmith_cluster_heartbeat_age_seconds", cluster="east") < 30
    positions = {dict(k)["stage"]: n for k, n in series(hub, "wingsmith_store_position").items()}
    assert set(positions) == {"stored", "relayed", "scheduled", "projected"}
    assert all(0 < n <= positions["stored"] for n in positions.values()), positions
    lags = series(hub, "wingsmith_store_lag")
    assert {dict(k)["stage"] for k in lags} == {"relayed", "scheduled", "projected"}
    applied = value(hub, "wingsmith_operator_reconciles_total", cluster="east", outcome="applied")
    assert applied >= 2  # a render object per deployment
    # the API counts by route template, and its refusal by status
    refused = value(
        hub, "wingsmith_api_requests_total", method="POST", route="/v1/workloads", status="422"
    )
    assert refused == 1
    via_api = await fleet.api.get("/metrics")
    assert via_api.status_code == 200 and "wingsmith_commands_total" in via_api.text


async def test_a_refused_command_counts_under_its_error_code(fleet: Fleet) -> None:
    await fleet.nc.request("wingsmith.cmd.workload.create", b'{"command_id": "x"}', timeout=10)
    await fleet.nc.request("wingsmith.cmd.no.such", b"{}", timeout=10)
    hub = await scrape(fleet.hub_metrics)
    refused = value(
        hub, "wingsmith_commands_total", subject="workload.create", outcome="validation_error"
    )
    assert refused == 1
    unknown = value(hub, "wingsmith_commands_total", subject="unknown", outcome="unknown_command")
    assert unknown == 1


def queried_names(dashboard: dict[str, Any]) -> set[str]:
    """Every metric name in the dashboard's queries (panels, and rows' panels)."""
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for inner in [panel, *panel.get("panels", [])]
        for target in inner.get("targets", [])
    ]
    exprs += [v["query"]["query"] for v in dashboard.get("templating", {}).get("list", [])]
    assert exprs
    return {name for expr in exprs for name in re.findall(r"\bwingsmith_[a-z0-9_]+", expr)}


async def test_every_metric_the_dashboard_queries_is_scraped(fleet: Fleet) -> None:
    await seed(fleet)
    await wait_for(
        lambda: _named(fleet, "wingsmith_allocated_gpu_seconds_total"),
        60,
        "a deployment to hold devices",
    )
    scraped = {name for name, _ in await scrape(fleet.hub_metrics)}
    scraped |= {name for name, _ in await scrape(fleet.projector_metrics)}
    dashboard = json.loads(DASHBOARD.read_text())
    missing = queried_names(dashboard) - scraped
    assert not missing, f"the dashboard queries metrics no process exposes: {sorted(missing)}"


async def _named(fleet: Fleet, name: str) -> bool:
    samples = await scrape_when_up(fleet.projector_metrics)
    return any(n == name and value > 0 for (n, _), value in samples.items())


async def test_the_metrics_listener_serves_only_metrics(fleet: Fleet) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(fleet.hub_metrics.replace("/metrics", "/other"))
    assert response.status_code == 404


def test_metrics_listen_is_read_from_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "WINGSMITH_METRICS_LISTEN": "0.0.0.0:9464",
            "WINGSMITH_PROJECTOR_METRICS_LISTEN": "127.0.0.1:9465",
        }
    )
    assert settings.metrics_listen == ("0.0.0.0", 9464)
    assert settings.projector_metrics_listen == ("127.0.0.1", 9465)
    with pytest.raises(ValueError, match="WINGSMITH_METRICS_LISTEN must be HOST:PORT"):
        Settings.from_env({"WINGSMITH_METRICS_LISTEN": "9464"})
    assert replace(settings, metrics_listen=None).metrics_listen is None
