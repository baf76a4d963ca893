from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from wingsmith.domain import releases
from wingsmith.domain.values import (
    ServingConfig,
    holds_stand_ins,
    is_stand_in,
    stand_in_device_id,
)

from .conftest import serving


def test_equal_configs_give_equal_digests() -> None:
    assert serving().digest() == serving().digest()
    assert serving().digest().startswith("svg_")


@pytest.mark.parametrize(
    "change",
    [
        {"engine_version": "0.9.3"},
        {"context_length": 65536},
        {"parallelism": {"tensor": 2}, "devices_per_replica": 2},
        {"quantization": "fp8"},
    ],
)
def test_any_serving_change_changes_the_digest(change: dict[str, object]) -> None:
    assert serving(**change).digest() != serving().digest()


def test_digest_ignores_how_the_config_was_spelled() -> None:
    spelled = ServingConfig.model_validate_json(serving().model_dump_json())
    assert spelled.digest() == serving().digest()


def test_devices_must_hold_the_parallelism() -> None:
    with pytest.raises(ValidationError, match="multiple of tensor x pipeline"):
        serving(devices_per_replica=3, parallelism={"tensor": 2})


# A config as the plane stored it before runtime releases existed, and the digest it had then.
STORED_BEFORE_RELEASES = (
    '{"model":"meta-llama/Llama-3.1-8B-Instruct","backend":"vllm","engine_version":"0.9.2",'
    '"image":null,"mode":"aggregated","devices_per_replica":2,'
    '"parallelism":{"tensor":2,"pipeline":1,"expert":1},"context_length":null,'
    '"quantization":null,"kv_cache":{"dtype":"fp8","block_size":null,"gpu_memory_utilization":null}}'
)


def test_a_config_stored_before_runtime_releases_keeps_its_digest_and_its_dump() -> None:
    loaded = ServingConfig.model_validate_json(STORED_BEFORE_RELEASES)
    assert loaded.digest() == "svg_d4b74ab7ca7923eb"
    assert loaded.runtime_release is None
    assert loaded.release == "0.9.2"  # its engine_version was the release, and still is
    assert loaded.model_dump_json() == STORED_BEFORE_RELEASES


def _released(**fields: object) -> ServingConfig:
    base = {"model": "Qwen/Qwen3-0.6B", "backend": "sglang", "devices_per_replica": 1}
    return ServingConfig.model_validate(base | fields)


@pytest.mark.parametrize(
    ("backend", "release", "engine"),
    [("vllm", "1.0.1", "0.16.0"), ("sglang", "0.9.0", "0.5.8"), ("trtllm", "1.3.1", "1.3.0rc19")],
)
def test_the_engine_version_defaults_to_what_the_release_ships(
    backend: str, release: str, engine: str
) -> None:
    config = _released(backend=backend, runtime_release=release)
    assert (config.engine_version, config.release) == (engine, release)
    assert config.model_dump()["runtime_release"] == release


def test_an_unknown_runtime_release_is_refused_with_the_known_ones_listed() -> None:
    with pytest.raises(ValidationError, match=r"'0\.9\.2' is not a Dynamo release") as refused:
        _released(runtime_release="0.9.2", engine_version="0.5.8")
    assert ", ".join(releases.RELEASES) in str(refused.value)


def test_an_engine_version_the_release_does_not_ship_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"'0\.4\.9' contradicts runtime_release '1\.0\.1'"):
        _released(runtime_release="1.0.1", engine_version="0.4.9")
    own = _released(runtime_release="1.0.1", engine_version="0.4.9", image="r.local/sglang:mine")
    assert own.engine_version == "0.4.9"  # an image of one's own ships what it ships


def test_neither_an_engine_version_nor_a_release_is_refused() -> None:
    with pytest.raises(ValidationError, match="engine_version"):
        _released()


def test_naming_the_release_changes_the_digest() -> None:
    legacy = _released(engine_version="0.5.8")
    assert _released(runtime_release="0.9.0").digest() != legacy.digest()
    assert (
        _released(runtime_release="0.9.0").digest() != _released(runtime_release="0.9.1").digest()
    )


def test_the_schema_lists_the_releases_and_lets_the_engine_version_default() -> None:
    schema = ServingConfig.model_json_schema()
    assert "engine_version" not in schema["required"]
    enum = next(s["enum"] for s in schema["properties"]["runtime_release"]["anyOf"] if "enum" in s)
    assert enum == list(releases.RELEASES)


def test_the_hubs_strict_json_parsing_takes_a_release_and_lists_for_tuples() -> None:
    """As the hub parses a command: strict JSON, where arrays are the tuples' input."""
    body = {
        "model": "m",
        "backend": "vllm",
        "runtime_release": "1.0.1",
        "devices_per_replica": 1,
        "pod": {"secret_env": [{"name": "HF_TOKEN", "secret": "hf", "key": "token"}]},
    }
    config = ServingConfig.model_validate_json(json.dumps(body), strict=True)
    assert config.engine_version == releases.known("1.0.1").engine_version("vllm")
    assert config.pod is not None and config.pod.secret_env[0].name == "HF_TOKEN"
    with pytest.raises(ValidationError, match="required when runtime_release is not given"):
        ServingConfig.model_validate_json(
            json.dumps({"model": "m", "backend": "vllm", "devices_per_replica": 1}), strict=True
        )


@pytest.mark.parametrize(
    ("device_id", "stand_in"),
    [
        ("gpu-node-1/llama-worker-0/gpu0", True),
        ("ip-10-0-0-1.ec2.internal/llama.worker-0/gpu15", True),
        ("GPU-8f6c2a4e-1b2d-4c3e-9f0a-123456789abc", False),
        ("MIG-GPU-8f6c2a4e-1b2d-4c3e-9f0a-123456789abc/1/0", False),
        ("MIG-8f6c2a4e-1b2d-4c3e-9f0a-123456789abc", False),
        ("node/pod/gpu", False),
        ("node/pod/gpu01", False),
        ("a/b/c/gpu0", False),
    ],
)
def test_a_stand_in_is_told_from_a_devices_own_id(device_id: str, stand_in: bool) -> None:
    assert is_stand_in(device_id) is stand_in


def test_a_replica_holds_stand_ins_when_any_of_its_devices_is_one() -> None:
    uuid = "GPU-8f6c2a4e-1b2d-4c3e-9f0a-123456789abc"
    assert holds_stand_ins(["n1/pod-0/gpu0", "n1/pod-0/gpu1"])
    assert holds_stand_ins([uuid, "n1/pod-0/gpu1"])
    assert not holds_stand_ins([uuid, "MIG-GPU-8f6c2a4e/1/0"])
    assert not holds_stand_ins([])


def test_the_stand_in_the_operator_makes_is_one() -> None:
    made = stand_in_device_id("gpu-node-1", "llama-worker-0", 3)
    assert made == "gpu-node-1/llama-worker-0/gpu3"
    assert is_stand_in(made)
