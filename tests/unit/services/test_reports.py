"""Reports from operators, kind by kind: every value a report carries is checked before it can
become a subject token, a key or an aggregate's state, and a refusal names the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from wingsmith.adapters.nats_bus import MAX_REPORT
from wingsmith.domain import commands as c
from wingsmith.services.hub.ingest import Refused, command_id_of, parse

REPLICA = {
    "cluster_id": "east",
    "deployment_id": "chat--east",
    "pod": "chat-worker-0.x",
    "node_id": "gpu-node-1.example.com",
    "device_ids": ["GPU-8f6c0f5e-1d2b-4c55-9c55-3a7b0a1f9d01", "MIG-GPU-1/1/0"],
    "serving_digest": "svg_0123456789abcdef",
    "engine_version": "0.9.2+cu124",
    "state": "ready",
    "version": 12345,
}
NODE = {
    "node_id": "gpu-node-1",
    "device_class": "NVIDIA-H100-80GB-HBM3",
    "devices": 8,
    "device_ids": [f"GPU-{i}" for i in range(8)],
    "topology_domain": "us-east-1a",
}
INVENTORY = {"cluster_id": "east", "nodes": [NODE]}
DEPLOYMENT = {
    "cluster_id": "east",
    "deployment_id": "chat--east",
    "status": {"phase": "ready", "ready_replicas": 2, "desired_replicas": 2, "reason": "Ok"},
    "live_digests": {"svg_0123456789abcdef": 2},
    "version": 7,
}
ACTION = {
    "cluster_id": "east",
    "deployment_id": "chat--east",
    "verb": "patch",
    "namespace": "models",
    "name": "chat.v1",
    "performed": False,
    "reason": "the operator is read-only",
}
HEARTBEAT = {
    "cluster_id": "east",
    "operator": {"instance": "0f3a9c", "version": "0.4.1", "read_only": False},
}
SIGHTING = {
    "namespace": "models",
    "name": "llama.v2",
    "api_version": "nvidia.com/v1alpha1",
    "backend": "vllm",
    "components": [
        {
            "name": "VllmWorker",
            "role": "worker",
            "replicas": 2,
            "gpus_per_replica": 1,
            "imported_args": ["--model", "meta-llama/Llama-3.1-8B-Instruct"],
        }
    ],
    "model": "meta-llama/Llama-3.1-8B-Instruct",
}
DISCOVERY = {"cluster_id": "east", "namespace": "models", "name": "llama.v2", "sighting": SIGHTING}
GOOD: dict[str, dict[str, Any]] = {
    "replica": REPLICA,
    "inventory": INVENTORY,
    "deployment": DEPLOYMENT,
    "action": ACTION,
    "heartbeat": HEARTBEAT,
    "discovery": DISCOVERY,
}


def report(kind: str, body: Any) -> c.Command:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return parse(f"wingsmith.obs.east.{kind}", data, f"east:{kind}:1")


def changed(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`body` with the value at a dotted path (list indexes as numbers) replaced."""
    copy = orjson.loads(orjson.dumps(body))
    *parents, last = path.split(".")
    target: Any = copy
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return copy  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_well_formed_report_of_every_kind_is_accepted(kind: str) -> None:
    command = report(kind, GOOD[kind])
    assert command.command_id == f"obs:east:{kind}:1"


BAD = [
    # (kind, field, value, field named in the refusal)
    ("replica", "pod", "chat 0", "pod"),
    ("replica", "pod", "chat\t0", "pod"),
    ("replica", "pod", "chat\x0b0", "pod"),
    ("replica", "pod", "chat\x0c0", "pod"),
    ("replica", "pod", "chat.*", "pod"),
    ("replica", "pod", "chat>", "pod"),
    ("replica", "pod", "Chat-0", "pod"),
    ("replica", "pod", "", "pod"),
    ("replica", "pod", "p" * 254, "pod"),
    ("replica", "node_id", "node 1", "node_id"),
    ("replica", "deployment_id", "chat.east", "deployment_id"),
    ("replica", "deployment_id", "chat--east\n", "deployment_id"),
    ("replica", "device_ids", ["GPU 0"], "device_ids.0"),
    ("replica", "device_ids", ["GPU-0", "GPU-0"], "device_ids"),
    ("replica", "device_ids", [f"GPU-{i}" for i in range(257)], "device_ids"),
    ("replica", "device_ids", "GPU-0", "device_ids"),
    ("replica", "serving_digest", "svg 1", "serving_digest"),
    ("replica", "engine_version", "0.9\r", "engine_version"),
    ("replica", "engine_version", "", "engine_version"),
    ("replica", "state", "exploded", "state"),
    ("replica", "version", "5", "version"),
    ("replica", "version", -1, "version"),
    ("replica", "version", 1.5, "version"),
    ("inventory", "nodes.0.devices", "8", "nodes.0.devices"),
    ("inventory", "nodes.0.devices", 10_240_000, "nodes.0.devices"),
    ("inventory", "nodes.0.devices", 257, "nodes.0.devices"),
    ("inventory", "nodes.0.devices", -1, "nodes.0.devices"),
    ("inventory", "nodes.0.devices", True, "nodes.0.devices"),
    ("inventory", "nodes.0.devices", 2, "nodes.0.device_ids"),
    ("inventory", "nodes.0.device_ids", ["GPU-0", "GPU-0"], "nodes.0.device_ids"),
    ("inventory", "nodes.0.node_id", "n1 ", "nodes.0.node_id"),
    ("inventory", "nodes.0.device_class", "H100 SXM", "nodes.0.device_class"),
    ("inventory", "nodes.0.topology_domain", "rack 1", "nodes.0.topology_domain"),
    ("inventory", "nodes", [NODE] * 1000, "nodes"),
    (
        "inventory",
        "nodes",
        [{"node_id": f"n{i}", "device_class": "H", "devices": 0} for i in range(10_001)],
        "nodes",
    ),
    ("deployment", "status.ready_replicas", "2", "status.ready_replicas"),
    ("deployment", "status.ready_replicas", 10**9, "status.ready_replicas"),
    ("deployment", "status.phase", "exploded", "status.phase"),
    ("deployment", "live_digests", {"svg 1": 1}, "live_digests.svg 1.[key]"),
    ("deployment", "live_digests", {"svg_1": -1}, "live_digests.svg_1"),
    ("action", "namespace", "Models", "namespace"),
    ("action", "name", "chat v1", "name"),
    ("action", "reason", "r" * 257, "reason"),
    ("action", "reason", "line\nbreak", "reason"),
    ("action", "performed", "false", "performed"),
    ("heartbeat", "operator.instance", "a b", "operator.instance"),
    ("heartbeat", "operator.version", "", "operator.version"),
    ("heartbeat", "operator.read_only", 0, "operator.read_only"),
    ("discovery", "name", "llama v2", "name"),
    ("discovery", "sighting.components.0.replicas", 10**7, "sighting.components.0.replicas"),
    ("discovery", "sighting.components.0.name", "a b", "sighting.components.0.name"),
    ("discovery", "sighting.components.0.imported_args", ["x"] * 513, "sighting.components.0"),
    ("discovery", "sighting.model", "m" * 257, "sighting.model"),
    ("discovery", "sighting.api_version", "v1 beta", "sighting.api_version"),
]


@pytest.mark.parametrize(
    ("kind", "path", "value", "field"), BAD, ids=[f"{k}.{p}={v!r:.20}" for k, p, v, _ in BAD]
)
def test_each_bad_value_is_refused_naming_its_field(
    kind: str, path: str, value: Any, field: str
) -> None:
    with pytest.raises(Refused) as refused:
        report(kind, changed(GOOD[kind], path, value))
    assert f"wingsmith.obs.east.{kind}: {field}" in str(refused.value)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'{"cluster_id": "east", "cluster_id": "east", "nodes": []}', "cluster_id: key"),
        (b'{"cluster_id": "east", "nodes": [{"node_id": "a", "node_id": "b"}]}', "node_id: key"),
        (b'{"cluster_id": "east", "nodes": [], "x": NaN}', "(body): not JSON"),
        (b'{"cluster_id": "east", "nodes": []', "(body): not JSON"),
        (b"\xff\xfe", "(body): not JSON"),
        (b'["east"]', "must be a JSON object"),
        (b'{"cluster_id": "east", "nodes": [], "version": 1' + b"0" * 30 + b"}", "(body)"),
        (b'{"cluster_id": "east", "nodes": [], "extra": 1}', "extra: Extra inputs"),
        (b'{"cluster_id": "east", "nodes": [], "command_id": "c1"}', "command_id"),
        (b'{"cluster_id": "west", "nodes": []}', "cluster_id: 'west' is not the subject's"),
    ],
)
def test_a_report_that_is_not_one_clear_json_object_is_refused(data: bytes, problem: str) -> None:
    with pytest.raises(Refused, match=problem.replace("(", r"\(").replace(")", r"\)")):
        report("inventory", data)


def test_the_payload_size_is_checked_before_parsing() -> None:
    padded = orjson.dumps(INVENTORY)[:-1] + b"," + b" " * MAX_REPORT + b'"x": 1}'
    with pytest.raises(Refused, match=rf"\(body\): {len(padded)} bytes; .* {MAX_REPORT}"):
        report("inventory", padded)


def test_an_inventory_as_large_as_a_payload_allows_is_accepted() -> None:
    """About 2,000 nodes with 8 GPU UUIDs each fit: a large real cluster in one report."""
    uuid = "GPU-8f6c0f5e-1d2b-4c55-9c55-3a7b0a1f9d0"
    nodes = [
        NODE | {"node_id": f"node-{n}", "device_ids": [f"{uuid}{i}" for i in range(8)]}
        for n in range(1000)
    ]
    body = {"cluster_id": "east", "nodes": nodes}
    assert len(orjson.dumps(body)) < MAX_REPORT
    command = report("inventory", body)
    assert isinstance(command, c.ReportInventory) and len(command.nodes) == 1000


def test_long_or_odd_message_ids_make_safe_distinct_command_ids() -> None:
    long_a, long_b = "east:replica:" + "a" * 200, "east:replica:" + "a" * 199 + "b"
    assert command_id_of(long_a) != command_id_of(long_b)
    assert len(command_id_of(long_a)) <= 128
    assert command_id_of("east:replica:pod 1\t") == "obs:east:replica:pod-1-"
