"""The metrics' pure parts: a reply's outcome read without decoding it, device-seconds
integrated over time, and the compose file's Prometheus and Grafana pointing at files that
exist and scrape every process that serves metrics, and the operators of one process sharing
one registry."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from wingsmith.services.hub.metrics import DeviceSeconds
from wingsmith.services.hub.service import _ok_reply, busy_reply, error_reply, outcome
from wingsmith.services.metrics import new_registry
from wingsmith.services.operator.metrics import OperatorMetrics, Reconcile

ROOT = Path(__file__).parents[3]


def test_a_reply_says_its_outcome() -> None:
    assert outcome(_ok_reply({"command_id": "c", "events": []}, position=3)) == "ok"
    assert outcome(_ok_reply({"command_id": "c", "events": []}, duplicate=True)) == "ok"
    assert outcome(error_reply("validation_error", "serving: field required")) == "validation_error"
    assert outcome(busy_reply(0.5, "the hub is behind")) == "busy"


def test_device_seconds_count_what_was_held_between_samples() -> None:
    now = [0.0]
    held = {("research", "H100", "east"): 4}
    seconds = DeviceSeconds(lambda: dict(held), clock=lambda: now[0])
    assert seconds.sample() == {("research", "H100", "east"): 0.0}
    now[0] = 10.0
    held[("research", "H100", "east")] = 2  # released half at t=10
    assert seconds.sample() == {("research", "H100", "east"): 40.0}
    now[0] = 15.0
    del held[("research", "H100", "east")]
    assert seconds.sample() == {("research", "H100", "east"): 50.0}
    now[0] = 100.0
    assert seconds.sample() == {("research", "H100", "east"): 50.0}  # a counter stays


def _mounted(service: dict[str, object]) -> list[Path]:
    volumes = service["volumes"]
    assert isinstance(volumes, list)
    return [ROOT / v.split(":")[0] for v in volumes if v.startswith("./")]


def test_compose_provisions_prometheus_and_grafana_from_the_repository() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("prometheus", "grafana"):
        mounted = _mounted(compose[name])
        assert mounted, name
        for path in mounted:
            assert path.exists(), f"{name} mounts {path}, which does not exist"
    grafana = ROOT / "deploy" / "grafana"
    sources = yaml.safe_load((grafana / "provisioning/datasources/prometheus.yml").read_text())
    [source] = sources["datasources"]
    providers = yaml.safe_load((grafana / "provisioning/dashboards/wingsmith.yml").read_text())
    [provider] = providers["providers"]
    assert any(
        v.endswith(f":{provider['options']['path']}:ro") for v in compose["grafana"]["volumes"]
    )
    dashboard = json.loads((grafana / "dashboards" / "wingsmith.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {source["uid"]}
    assert source["url"] == "http://prometheus:9090"


def test_prometheus_scrapes_every_process_that_serves_metrics() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {
        t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    }
    serving = set()
    for name, service in compose.items():
        env = service.get("environment", {})
        for variable in ("WINGSMITH_METRICS_LISTEN", "WINGSMITH_PROJECTOR_METRICS_LISTEN"):
            if variable in env:
                serving.add(f"{name}:{env[variable].rpartition(':')[2]}")
        if "WINGSMITH_API_LISTEN" in env:  # the API serves /metrics beside itself
            serving.add(f"{name}:{env['WINGSMITH_API_LISTEN'].rpartition(':')[2]}")
    assert serving == targets


def test_operators_of_one_process_share_a_registry_each_with_its_own_series() -> None:
    registry = new_registry()  # `wingsmith up --simulated east=… --simulated west=…`
    east, west = OperatorMetrics("east", registry), OperatorMetrics("west", registry)
    east.reconciled(Reconcile.APPLIED)
    west.reconciled(Reconcile.APPLIED)
    west.reconciled(Reconcile.APPLIED)

    def applied(cluster: str) -> float | None:
        labels = {"cluster": cluster, "outcome": "applied"}
        return registry.get_sample_value("wingsmith_operator_reconciles_total", labels)

    assert (applied("east"), applied("west")) == (1.0, 2.0)
