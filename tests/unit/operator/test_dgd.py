"""The DGD renderer: every render object becomes a manifest Dynamo and Kubernetes would admit.

Admission is checked two ways without a cluster: against the CRD's openAPIV3Schema for the
API version (copied into tests/fixtures/dynamo, closed so that a field the CRD does not know
fails instead of being silently pruned) and against `dynamo_rules.check`, which covers the CEL
rules, Dynamo's webhook and Kubernetes' metadata rules.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wingsmith.domain.values import Backend, ServingConfig
from wingsmith.services.operator import dgd as render
from wingsmith.services.operator.dgd import V1ALPHA1, V1BETA1, render_dgd, render_yaml

from . import dynamo_rules

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dynamo"
VERSIONS = {V1BETA1: "v1beta1", V1ALPHA1: "v1alpha1"}
H100 = "NVIDIA-H100-80GB-HBM3"


# --- the CRD schema --------------------------------------------------------------------------


def _closed(schema: Any) -> Any:
    """The schema with unknown fields rejected where the API server would prune them."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
        open_ended = schema.get("x-kubernetes-preserve-unknown-fields")
        if "additionalProperties" not in schema and not open_ended:
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _closed(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _closed(schema["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_closed(s) for s in schema[key]]
    return out


@functools.cache
def schema_validator(api_version: str) -> jsonschema.Draft7Validator:
    """Loaded once per session: the schemas are large and every example uses them."""
    path = FIXTURES / f"dgd-{VERSIONS[api_version]}.schema.json"
    schema = _closed(json.loads(path.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(manifest: dict[str, Any]) -> list[str]:
    validator = schema_validator(manifest["apiVersion"])
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]


def assert_admissible(manifest: dict[str, Any]) -> None:
    assert schema_errors(manifest) == []
    assert dynamo_rules.check(manifest) == []


# --- render objects --------------------------------------------------------------------------


def serving(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "backend": "vllm",
        "engine_version": "1.3.0",
        "devices_per_replica": 2,
        "parallelism": {"tensor": 2},
    }
    return ServingConfig.model_validate(base | changes).model_dump(mode="json")


def desired(serving_config: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    config = serving_config or serving()
    base: dict[str, Any] = {
        "deployment_id": "llama--east",
        "workload_id": "llama",
        "cluster_id": "east",
        "project": "research",
        "device_class": H100,
        "generation": 3,
        "serving": config,
        "serving_digest": ServingConfig.model_validate(config).digest(),
        "engine_args": ["--max-num-seqs", "64"],
        "replicas": 2,
        "enabled": True,
        "authority": "managed",
        "adopted": None,
    }
    return base | changes


def components(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in manifest["spec"]["components"]}


def main_container(component: dict[str, Any]) -> dict[str, Any]:
    containers = component["podTemplate"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "main")


def args_of(manifest: dict[str, Any], name: str) -> list[str]:
    return list(main_container(components(manifest)[name])["args"])


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


@st.composite
def dns_labels(draw: st.DrawFn, min_size: int = 1) -> str:
    size = draw(st.integers(min_size, 63))
    if size == 1:
        return draw(st.sampled_from(_ALNUM))
    inner = draw(st.text(_ALNUM + "-", min_size=size - 2, max_size=size - 2))
    return draw(st.sampled_from(_ALNUM)) + inner + draw(st.sampled_from(_ALNUM))


ids = st.one_of(dns_labels(), st.integers(55, 63).flatmap(lambda n: dns_labels(min_size=n)))
strict_versions = st.tuples(*[st.integers(0, 9999)] * 3).map(lambda v: "{}.{}.{}".format(*v))
loose_versions = st.sampled_from(["main", "latest", "1.2", "v1.2.3", "1.2.3-rc1", "nightly-0812"])
semver_tags = st.one_of(
    strict_versions,
    st.sampled_from(["v1.3.0", "1.4.0-rc2", "0.9.0-cuda13.post1", "v2.0.0-alpha.1", "1.0.0+b7"]),
)
other_tags = st.sampled_from(["latest", "my-tag", "sha-1a2b3c", "1.2", "2026.08.21"])
registries = st.sampled_from(
    ["nvcr.io/nvidia/ai-dynamo/vllm-runtime", "registry.local:5000/team/dynamo", "dynamo"]
)
DIGEST = "@sha256:" + "ab" * 32


@st.composite
def images(draw: st.DrawFn) -> tuple[str | None, str, bool]:
    """(image, engine_version, whether runtimeVersionOverride is expected), all admissible."""
    case = draw(st.sampled_from(["default", "semver-tag", "no-version"]))
    if case == "default":
        version = draw(st.one_of(strict_versions, st.sampled_from(["v1.3.0", "1.4.0-rc2"])))
        return None, version, False
    repository = draw(registries)
    if case == "semver-tag":
        digest = draw(st.sampled_from(["", DIGEST]))
        version = draw(st.one_of(strict_versions, loose_versions))
        return f"{repository}:{draw(semver_tags)}{digest}", version, False
    suffix = draw(st.one_of(other_tags.map(lambda t: ":" + t), st.sampled_from(["", DIGEST])))
    return f"{repository}{suffix}", draw(strict_versions), True


@st.composite
def servings(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A valid serving config (built through ServingConfig) and whether it needs an override."""
    backend = draw(st.sampled_from(list(Backend)))
    tensor = draw(st.sampled_from([1, 2, 4, 8]))
    pipeline = draw(st.sampled_from([1, 2]))
    data = 1 if backend is Backend.TRTLLM else draw(st.sampled_from([1, 2, 4]))
    mode = draw(st.sampled_from(["aggregated", "disaggregated"]))
    workers = 2 if mode == "disaggregated" else 1  # a prefill and a decode worker per replica
    image, version, needs_override = draw(images())
    config = ServingConfig(
        model=draw(st.one_of(st.sampled_from(["Qwen/Qwen3-0.6B"]), st.text(min_size=1))),
        backend=backend,
        engine_version=version,
        image=image,
        mode=mode,
        devices_per_replica=workers * tensor * pipeline * data,
        parallelism={
            "tensor": tensor,
            "pipeline": pipeline,
            "expert": draw(st.sampled_from([1, 2, 4, 8, 16])),
        },
        context_length=draw(st.none() | st.integers(1, 10_000_000)),
        quantization=draw(st.none() | st.sampled_from(["fp8", "awq", "gptq", "nvfp4"])),
        kv_cache={
            "dtype": draw(st.none() | st.sampled_from(["fp8", "auto", "fp8_e5m2"])),
            "block_size": draw(st.none() | st.sampled_from([8, 16, 32, 64, 128])),
            "gpu_memory_utilization": draw(st.none() | st.floats(0.05, 1.0)),
        },
    )
    return config.model_dump(mode="json"), needs_override


@st.composite
def render_objects(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    config, needs_override = draw(servings())
    workload, cluster = draw(ids), draw(ids)
    adopted = draw(st.none() | st.fixed_dictionaries({"namespace": dns_labels(), "name": ids}))
    obj = desired(
        config,
        deployment_id=f"{workload}--{cluster}",
        workload_id=workload,
        cluster_id=cluster,
        device_class=draw(st.sampled_from([H100, "NVIDIA-A100-SXM4-80GB", "L40S", "gb200_nvl"])),
        generation=draw(st.integers(1, 10**9)),
        engine_args=draw(st.lists(st.text(min_size=1, max_size=40), max_size=6)),
        replicas=draw(st.integers(0, 16)),
        enabled=draw(st.booleans()),
        adopted=adopted,
    )
    return obj, needs_override


# --- properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=render_objects())
def test_every_render_object_renders_an_admissible_dgd(
    api_version: str, case: tuple[dict[str, Any], bool]
) -> None:
    obj, needs_override = case
    manifest = render_dgd(obj, namespace="wingsmith", api_version=api_version)
    again = render_dgd(copy.deepcopy(obj), namespace="wingsmith", api_version=api_version)
    text = render_yaml(obj, namespace="wingsmith", api_version=api_version)

    assert_admissible(manifest)
    assert again == manifest
    assert yaml.safe_load(text) == manifest
    _assert_follows_the_render_object(manifest, obj, needs_override)


def _assert_follows_the_render_object(
    manifest: dict[str, Any], obj: dict[str, Any], needs_override: bool
) -> None:
    """What each component must say, read through whichever API version rendered it."""
    workers = obj["replicas"] if obj["enabled"] else 0
    roles = ["worker"] if obj["serving"]["mode"] == "aggregated" else ["prefill", "decode"]
    config = ServingConfig.model_validate(obj["serving"])
    views = _component_views(manifest)
    assert list(views) == ["frontend", *roles]
    for name, view in views.items():
        assert view["labels"][render.LABEL_SERVING_DIGEST] == obj["serving_digest"]
        assert view["labels"][render.LABEL_GENERATION] == str(obj["generation"])
        assert ("runtimeVersionOverride" in view["spec"]) is needs_override
        if name == "frontend":
            assert view["replicas"] == (1 if workers else 0)
            assert view["gpus"] is None
            continue
        assert view["replicas"] == workers
        assert view["gpus"] == str(config.devices_per_worker)
        assert view["node_selector"] == {render.GPU_PRODUCT_LABEL: obj["device_class"]}
        assert view["container"]["command"] == [
            "python3",
            "-m",
            f"dynamo.{obj['serving']['backend']}",
        ]
        args = view["container"]["args"]
        assert args[len(args) - len(obj["engine_args"]) :] == obj["engine_args"]
    # Admission counted devices_per_replica per replica: the workers of one replica request it all.
    assert sum(int(views[role]["gpus"]) for role in roles) == config.devices_per_replica
    metadata = manifest["metadata"]
    assert metadata["annotations"] == {render.ANNOTATION_DEPLOYMENT_ID: obj["deployment_id"]}
    label = metadata["labels"][render.LABEL_DEPLOYMENT]
    assert label == obj["deployment_id"] or len(obj["deployment_id"]) > 63
    expected_name = (obj["adopted"] or {}).get("name", obj["workload_id"])
    assert metadata["name"] == expected_name


def _component_views(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if manifest["apiVersion"] == V1BETA1:
        return {c["name"]: _beta_view(c) for c in manifest["spec"]["components"]}
    return {name: _alpha_view(s) for name, s in manifest["spec"]["services"].items()}


def _beta_view(component: dict[str, Any]) -> dict[str, Any]:
    container = main_container(component)
    limits = container.get("resources", {}).get("limits", {})
    return {
        "spec": component,
        "replicas": component["replicas"],
        "labels": component["podTemplate"]["metadata"]["labels"],
        "container": container,
        "gpus": limits.get(render.GPU_RESOURCE),
        "node_selector": component["podTemplate"]["spec"].get("nodeSelector"),
    }


def _alpha_view(service: dict[str, Any]) -> dict[str, Any]:
    return {
        "spec": service,
        "replicas": service["replicas"],
        "labels": service["extraPodMetadata"]["labels"],
        "container": service["extraPodSpec"]["mainContainer"],
        "gpus": service.get("resources", {}).get("limits", {}).get("gpu"),
        "node_selector": service["extraPodSpec"].get("nodeSelector"),
    }


@settings(max_examples=60, deadline=None)
@given(
    repository=registries,
    tag=st.one_of(other_tags.map(lambda t: ":" + t), st.just("")),
    version=loose_versions,
)
def test_an_unversioned_image_needs_a_strict_engine_version(
    repository: str, tag: str, version: str
) -> None:
    obj = desired(serving(image=f"{repository}{tag}", engine_version=version))
    with pytest.raises(ValueError, match=r"serving\.engine_version"):
        render_dgd(obj, namespace="wingsmith")


@settings(max_examples=30, deadline=None)
@given(
    tensor=st.sampled_from([1, 2, 4]),
    data=st.sampled_from([2, 4]),
    mode=st.sampled_from(["aggregated", "disaggregated"]),
)
def test_trtllm_refuses_devices_it_would_leave_idle(tensor: int, data: int, mode: str) -> None:
    workers = 2 if mode == "disaggregated" else 1
    config = serving(
        backend="trtllm",
        mode=mode,
        devices_per_replica=workers * tensor * data,
        parallelism={"tensor": tensor},
    )
    with pytest.raises(ValueError, match=r"serving\.devices_per_replica") as refused:
        render_dgd(desired(config), namespace="wingsmith")
    assert f"({workers * tensor})" in str(refused.value)  # says what the field must be


def test_disaggregated_trtllm_uses_all_of_a_replicas_devices() -> None:
    config = serving(
        backend="trtllm", mode="disaggregated", devices_per_replica=4, parallelism={"tensor": 2}
    )
    manifest = render_dgd(desired(config), namespace="wingsmith")
    for role in ("prefill", "decode"):
        assert main_container(components(manifest)[role])["resources"]["limits"] == {
            "nvidia.com/gpu": "2"
        }


# --- the validators can fail -----------------------------------------------------------------


def _broken(manifest: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    broken = copy.deepcopy(manifest)
    target = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return broken


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["spec", "components", 0, "type"], "router"),
        (["spec", "components", 1, "replicas"], -1),
        (["spec", "components", 1, "runtimeVersionOverride"], "latest"),
        (["spec", "components", 1, "podTemplat"], {}),
        (["spec", "backendFramework"], "tgi"),
        (
            ["spec", "components", 1, "podTemplate", "spec", "containers", 0, "resources"],
            {"limits": {"nvidia.com/gpu": "two"}},
        ),
        (["spec", "components", 0, "name"], "front end"),
        (["spec", "components"], [{"name": f"c{i}"} for i in range(26)]),
        (["spec", "restarts"], {"id": "x"}),
    ],
)
def test_the_v1beta1_schema_rejects_a_bad_manifest(path: list[Any], value: Any) -> None:
    manifest = render_dgd(desired(), namespace="wingsmith")
    assert schema_errors(manifest) == []
    assert schema_errors(_broken(manifest, path, value)) != []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["spec", "services"], [{"componentType": "worker"}]),
        (["spec", "services", "worker", "replicas"], "two"),
        (["spec", "services", "worker", "resources", "limits", "gpus"], "2"),
        (["spec", "services", "worker", "extraPodSpec", "mainContainer", "args"], "--model x"),
    ],
)
def test_the_v1alpha1_schema_rejects_a_bad_manifest(path: list[Any], value: Any) -> None:
    manifest = render_dgd(desired(), namespace="wingsmith", api_version=V1ALPHA1)
    assert schema_errors(manifest) == []
    assert schema_errors(_broken(manifest, path, value)) != []


BETA_WORKER = ["spec", "components", 1]
BETA_MAIN = [*BETA_WORKER, "podTemplate", "spec", "containers", 0]


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (["spec", "components"], [], "needs 1 to 25"),
        (
            ["spec", "components"],
            [{"name": f"c{i}", "type": "worker"} for i in range(26)],
            "needs 1 to 25",
        ),
        ([*BETA_WORKER, "name"], "Frontend", "ignoring case"),
        ([*BETA_WORKER, "name"], "worker_1", "not a valid component name"),
        ([*BETA_WORKER, "name"], "w" * 40, "Grove"),
        ([*BETA_MAIN, "name"], "engine", "main container is required"),
        ([*BETA_MAIN, "image"], "", "needs an image"),
        ([*BETA_MAIN, "image"], "dynamo:latest", "runtimeVersionOverride: required"),
        ([*BETA_MAIN, "image"], "dynamo@sha256:" + "0" * 64, "runtimeVersionOverride: required"),
        ([*BETA_WORKER, "runtimeVersionOverride"], "1.2", "not MAJOR.MINOR.PATCH"),
        ([*BETA_WORKER, "runtimeVersionOverride"], "12345.0.0", "not MAJOR.MINOR.PATCH"),
        (["spec", "restart"], {"id": "again"}, "spec.restart"),
        ([*BETA_WORKER, "eppConfig"], {"config": {}}, "only allowed on type epp"),
        ([*BETA_WORKER, "sharedMemorySize"], "-1Gi", "must not be negative"),
        (
            [*BETA_WORKER, "podTemplate", "metadata", "annotations"],
            {"dynamo.nvidia.com/gpu-power-limit": "0"},
            "positive integer",
        ),
        (
            [*BETA_WORKER, "podTemplate", "metadata", "annotations"],
            {"nvidia.com/vllm-distributed-executor-backend": "slurm"},
            "mp or ray",
        ),
        (
            ["metadata", "annotations", "nvidia.com/workload-provider"],
            "kubernetes",
            "must be one of",
        ),
        (
            ["metadata", "annotations", "nvidia.com/dynamo-operator-origin-version"],
            "v1",
            "must be semver",
        ),
        (["metadata", "name"], "Llama_3", "DNS subdomain"),
        (["metadata", "namespace"], "a" * 64, "DNS label"),
        (["metadata", "labels", "wingsmith.dev/deployment"], "x" * 64, "label value"),
        (["metadata", "labels", "wingsmith.dev/deployment"], "-llama", "label value"),
        (["metadata", "labels"], {"wingsmith.dev/": "x"}, "invalid name part"),
        (["metadata", "labels"], {"Wingsmith_Dev/x": "x"}, "not a DNS subdomain"),
        (
            [*BETA_MAIN, "resources"],
            {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}},
            "must equal the limit",
        ),
        ([*BETA_MAIN, "resources"], {"limits": {"nvidia.com/gpu": "1.5"}}, "whole number"),
        (
            [*BETA_WORKER, "podTemplate", "spec", "nodeSelector"],
            {"nvidia.com/gpu.product": "H100 80GB"},
            "label value",
        ),
    ],
)
def test_the_rules_reject_a_bad_v1beta1_manifest(
    path: list[Any], value: Any, complaint: str
) -> None:
    manifest = render_dgd(desired(), namespace="wingsmith")
    assert dynamo_rules.check(manifest) == []
    problems = dynamo_rules.check(_broken(manifest, path, value))
    assert any(complaint in p for p in problems), problems


def _epp(**fields: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "nvcr.io/nvidia/ai-dynamo/frontend:1.3.0"}
    base = {"name": "epp", "type": "epp", "podTemplate": {"spec": {"containers": [container]}}}
    return base | fields


@pytest.mark.parametrize(
    ("epps", "complaint"),
    [
        ([_epp(eppConfig={"configMapRef": {"name": "c"}}), _epp(name="epp2")], "at most one"),
        ([_epp(replicas=2, eppConfig={"config": {}})], "exactly 1 replica"),
        ([_epp()], "required for an EPP component"),
        ([_epp(eppConfig={"config": {}, "configMapRef": {"name": "c"}})], "exactly one of"),
        ([_epp(eppConfig={"configMapRef": {"name": ""}})], "must not be empty"),
        ([_epp(eppConfig={"config": {}}, multinode={"nodeCount": 2})], "cannot be multinode"),
    ],
)
def test_the_rules_hold_epp_components_to_dynamos_limits(
    epps: list[dict[str, Any]], complaint: str
) -> None:
    manifest = render_dgd(desired(), namespace="wingsmith")
    good = _broken(
        manifest,
        ["spec", "components"],
        [*manifest["spec"]["components"], _epp(eppConfig={"configMapRef": {"name": "epp-config"}})],
    )
    assert dynamo_rules.check(good) == []
    bad = _broken(manifest, ["spec", "components"], [*manifest["spec"]["components"], *epps])
    problems = dynamo_rules.check(bad)
    assert any(complaint in p for p in problems), problems


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (["spec", "services", "worker", "extraPodSpec", "mainContainer"], None, "required"),
        (["spec", "services", "worker", "extraPodSpec", "mainContainer", "image"], "", "image"),
        (
            ["spec", "services", "worker", "extraPodSpec", "mainContainer", "image"],
            "localhost:5000/dynamo",
            "runtimeVersionOverride: required",
        ),
        (["spec", "services", "worker", "resources", "limits", "gpu"], "x", "whole number"),
        (["spec", "services", "Worker"], {"componentType": "worker"}, "ignoring case"),
        (["spec", "services", "worker", "sharedMemory"], {"disabled": False}, "size: required"),
    ],
)
def test_the_rules_reject_a_bad_v1alpha1_manifest(
    path: list[Any], value: Any, complaint: str
) -> None:
    manifest = render_dgd(desired(), namespace="wingsmith", api_version=V1ALPHA1)
    assert dynamo_rules.check(manifest) == []
    problems = dynamo_rules.check(_broken(manifest, path, value))
    assert any(complaint in p for p in problems), problems


# --- examples --------------------------------------------------------------------------------


def test_aggregated_vllm_with_two_way_tensor_parallelism() -> None:
    manifest = render_dgd(desired(), namespace="wingsmith")

    assert manifest["apiVersion"] == "nvidia.com/v1beta1"
    assert manifest["kind"] == "DynamoGraphDeployment"
    assert manifest["metadata"]["name"] == "llama"
    assert manifest["metadata"]["namespace"] == "wingsmith"
    assert manifest["spec"]["backendFramework"] == "vllm"
    frontend, worker = manifest["spec"]["components"]
    pod_labels = {
        "wingsmith.dev/deployment": "llama--east",
        "wingsmith.dev/serving-digest": desired()["serving_digest"],
        "wingsmith.dev/generation": "3",
    }
    image = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.3.0"
    assert frontend == {
        "name": "frontend",
        "type": "frontend",
        "replicas": 1,
        "podTemplate": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "command": ["python3", "-m", "dynamo.frontend"],
                    }
                ]
            },
        },
    }
    assert worker == {
        "name": "worker",
        "type": "worker",
        "replicas": 2,
        "podTemplate": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "nodeSelector": {"nvidia.com/gpu.product": H100},
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "command": ["python3", "-m", "dynamo.vllm"],
                        "args": [
                            "--model",
                            "meta-llama/Llama-3.1-8B-Instruct",
                            "--tensor-parallel-size",
                            "2",
                            "--pipeline-parallel-size",
                            "1",
                            "--max-num-seqs",
                            "64",
                        ],
                        "resources": {
                            "limits": {"nvidia.com/gpu": "2"},
                            "requests": {"nvidia.com/gpu": "2"},
                        },
                    }
                ],
            },
        },
    }
    assert_admissible(manifest)


def test_vllm_spells_the_serving_config_in_its_own_flags() -> None:
    config = serving(
        devices_per_replica=8,
        parallelism={"tensor": 2, "pipeline": 2, "expert": 4},
        context_length=32768,
        quantization="fp8",
        kv_cache={"dtype": "fp8", "block_size": 32, "gpu_memory_utilization": 0.85},
    )
    args = args_of(render_dgd(desired(config), namespace="wingsmith"), "worker")

    assert flag(args, "--data-parallel-size") == "2"  # 8 devices / (2 x 2)
    assert "--enable-expert-parallel" in args
    assert flag(args, "--max-model-len") == "32768"
    assert flag(args, "--quantization") == "fp8"
    assert flag(args, "--kv-cache-dtype") == "fp8"
    assert flag(args, "--block-size") == "32"
    assert flag(args, "--gpu-memory-utilization") == "0.85"


def test_disaggregated_sglang_has_prefill_and_decode_workers() -> None:
    config = serving(
        backend="sglang",
        mode="disaggregated",
        devices_per_replica=8,  # 4 for the prefill worker, 4 for the decode worker
        parallelism={"tensor": 4, "expert": 2},
        context_length=8192,
        kv_cache={"dtype": "fp8", "block_size": 16, "gpu_memory_utilization": 0.8},
    )
    manifest = render_dgd(desired(config), namespace="wingsmith")

    by_name = components(manifest)
    assert list(by_name) == ["frontend", "prefill", "decode"]
    assert [c["type"] for c in by_name.values()] == ["frontend", "prefill", "decode"]
    for role in ("prefill", "decode"):
        args = args_of(manifest, role)
        assert main_container(by_name[role])["command"] == ["python3", "-m", "dynamo.sglang"]
        assert flag(args, "--model-path") == "meta-llama/Llama-3.1-8B-Instruct"
        assert flag(args, "--disaggregation-mode") == role
        assert flag(args, "--disaggregation-transfer-backend") == "nixl"
        assert flag(args, "--tp-size") == "4"
        assert flag(args, "--pp-size") == "1"
        assert flag(args, "--ep-size") == "2"
        assert flag(args, "--context-length") == "8192"
        assert flag(args, "--kv-cache-dtype") == "fp8_e4m3"
        assert flag(args, "--page-size") == "16"
        assert flag(args, "--mem-fraction-static") == "0.8"
        assert main_container(by_name[role])["resources"]["limits"] == {"nvidia.com/gpu": "4"}
        assert "--dp-size" not in args  # each worker's 4 devices are one tensor-parallel engine
    assert manifest["spec"]["backendFramework"] == "sglang"
    assert_admissible(manifest)


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
def test_a_disaggregated_replica_splits_its_devices_between_prefill_and_decode(
    api_version: str,
) -> None:
    config = serving(mode="disaggregated", devices_per_replica=4, parallelism={"tensor": 2})
    manifest = render_dgd(desired(config), namespace="wingsmith", api_version=api_version)

    views = _component_views(manifest)
    assert list(views) == ["frontend", "prefill", "decode"]
    for role in ("prefill", "decode"):
        args = views[role]["container"]["args"]
        assert views[role]["gpus"] == "2"
        assert flag(args, "--tensor-parallel-size") == "2"
        assert "--data-parallel-size" not in args  # 2 devices hold one 2-way engine, not two
    assert_admissible(manifest)


def test_trtllm_flags_and_engine_overrides() -> None:
    config = serving(
        backend="trtllm",
        mode="disaggregated",
        devices_per_replica=8,
        parallelism={"tensor": 2, "pipeline": 2, "expert": 2},
        context_length=16384,
        quantization="fp8",
        kv_cache={"dtype": "fp8", "block_size": 64, "gpu_memory_utilization": 0.7},
    )
    manifest = render_dgd(desired(config), namespace="wingsmith")

    prefill, decode = args_of(manifest, "prefill"), args_of(manifest, "decode")
    assert main_container(components(manifest)["prefill"])["command"] == [
        "python3",
        "-m",
        "dynamo.trtllm",
    ]
    assert flag(prefill, "--model-path") == "meta-llama/Llama-3.1-8B-Instruct"
    assert flag(prefill, "--tensor-parallel-size") == "2"
    assert flag(prefill, "--pipeline-parallel-size") == "2"
    assert flag(prefill, "--expert-parallel-size") == "2"
    assert flag(prefill, "--max-seq-len") == "16384"
    assert flag(prefill, "--kv-block-size") == "64"
    assert flag(prefill, "--free-gpu-memory-fraction") == "0.7"
    assert flag(prefill, "--disaggregation-mode") == "prefill"
    assert flag(decode, "--disaggregation-mode") == "decode"
    assert json.loads(flag(prefill, "--override-engine-args")) == {
        "cache_transceiver_config": {"backend": "DEFAULT"},
        "disable_overlap_scheduler": True,
        "kv_cache_config": {"dtype": "fp8"},
        "quant_config": {"quant_algo": "FP8"},
    }
    assert "disable_overlap_scheduler" not in json.loads(flag(decode, "--override-engine-args"))
    assert components(manifest)["prefill"]["podTemplate"]["spec"]["containers"][0]["image"] == (
        "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.3.0"
    )
    assert_admissible(manifest)


def test_aggregated_trtllm_without_extras_passes_no_overrides() -> None:
    config = serving(backend="trtllm", devices_per_replica=1, parallelism={"tensor": 1})
    args = args_of(render_dgd(desired(config), namespace="wingsmith"), "worker")
    assert "--override-engine-args" not in args
    assert "--disaggregation-mode" not in args
    assert "--expert-parallel-size" not in args


@pytest.mark.parametrize(
    ("engine_version", "prefill_flags", "decode_flags"),
    [
        (
            "1.3.0",
            ["--disaggregation-mode", "prefill", "--kv-transfer-config"],
            ["--disaggregation-mode", "decode", "--kv-transfer-config"],
        ),
        ("0.4.1", ["--is-prefill-worker"], []),
    ],
)
def test_vllm_disaggregation_flags_follow_the_dynamo_release(
    engine_version: str, prefill_flags: list[str], decode_flags: list[str]
) -> None:
    config = serving(mode="disaggregated", devices_per_replica=4, engine_version=engine_version)
    manifest = render_dgd(desired(config, engine_args=[]), namespace="wingsmith")

    prefill, decode = args_of(manifest, "prefill"), args_of(manifest, "decode")
    base = [
        "--model",
        config["model"],
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "1",
    ]
    assert prefill[: len(base)] == decode[: len(base)] == base
    assert [a for a in prefill[len(base) :] if not a.startswith("{")] == prefill_flags
    assert [a for a in decode[len(base) :] if not a.startswith("{")] == decode_flags
    if "--kv-transfer-config" in prefill:
        assert json.loads(flag(prefill, "--kv-transfer-config"))["kv_connector"] == "NixlConnector"


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
def test_a_latest_image_gets_a_runtime_version_override_on_every_component(
    api_version: str,
) -> None:
    config = serving(image="nvcr.io/nvidia/ai-dynamo/vllm-runtime:latest", engine_version="0.4.1")
    manifest = render_dgd(desired(config), namespace="wingsmith", api_version=api_version)

    overrides = [
        v["spec"].get("runtimeVersionOverride") for v in _component_views(manifest).values()
    ]
    assert overrides == ["0.4.1", "0.4.1"]
    assert_admissible(manifest)


@pytest.mark.parametrize(
    "image",
    [None, "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.1", "my.registry:5000/vllm:v0.4.1-cuda13"],
)
def test_a_versioned_image_needs_no_override(image: str | None) -> None:
    config = serving(image=image, engine_version="0.4.1")
    manifest = render_dgd(desired(config), namespace="wingsmith")

    assert all("runtimeVersionOverride" not in c for c in manifest["spec"]["components"])
    assert_admissible(manifest)


def test_engine_args_come_last_so_they_win() -> None:
    engine_args = ["--tensor-parallel-size", "4", "--enforce-eager"]
    manifest = render_dgd(desired(engine_args=engine_args), namespace="wingsmith")

    args = args_of(manifest, "worker")
    assert args[-3:] == engine_args
    assert args.index("--tensor-parallel-size") < len(args) - 3  # rendered earlier, overridden


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
def test_a_disabled_deployment_scales_everything_to_zero(api_version: str) -> None:
    manifest = render_dgd(
        desired(enabled=False, replicas=3), namespace="wingsmith", api_version=api_version
    )
    assert [v["replicas"] for v in _component_views(manifest).values()] == [0, 0]
    assert_admissible(manifest)


def test_zero_replicas_also_stop_the_frontend() -> None:
    manifest = render_dgd(desired(replicas=0), namespace="wingsmith")
    assert [c["replicas"] for c in manifest["spec"]["components"]] == [0, 0]


def test_the_same_input_renders_the_same_manifest() -> None:
    config = serving(
        backend="sglang", mode="disaggregated", devices_per_replica=4, quantization="fp8"
    )
    first = render_yaml(desired(config), namespace="wingsmith")
    again = render_yaml(json.loads(json.dumps(desired(config))), namespace="wingsmith")
    assert first == again
    assert render_dgd(desired(config), namespace="wingsmith") == yaml.safe_load(first)


def test_labels_carry_the_digest_and_the_generation() -> None:
    obj = desired(generation=7)
    manifest = render_dgd(obj, namespace="wingsmith")

    assert manifest["metadata"]["labels"] == {
        "wingsmith.dev/managed-by": "wingsmith",
        "wingsmith.dev/workload": "llama",
        "wingsmith.dev/deployment": "llama--east",
        "wingsmith.dev/generation": "7",
        "wingsmith.dev/serving-digest": obj["serving_digest"],
    }
    assert manifest["metadata"]["annotations"] == {"wingsmith.dev/deployment-id": "llama--east"}
    for component in manifest["spec"]["components"]:
        labels = component["podTemplate"]["metadata"]["labels"]
        assert labels["wingsmith.dev/serving-digest"] == obj["serving_digest"]
        assert labels["wingsmith.dev/generation"] == "7"
        assert labels["wingsmith.dev/deployment"] == "llama--east"


def test_a_long_deployment_id_is_shortened_with_a_hash_in_labels_only() -> None:
    workload, cluster = "w" * 60, "c" * 60
    first = f"{workload}--{cluster}"
    second = f"{workload}--{'c' * 59}d"
    manifests = [
        render_dgd(desired(deployment_id=d, workload_id=workload), namespace="wingsmith")
        for d in (first, second)
    ]

    labels = [m["metadata"]["labels"]["wingsmith.dev/deployment"] for m in manifests]
    assert all(len(label) == 63 for label in labels)
    assert labels[0] != labels[1]
    assert labels[0].endswith(hashlib.sha256(first.encode()).hexdigest()[:10])
    assert manifests[0]["metadata"]["annotations"]["wingsmith.dev/deployment-id"] == first
    pod_labels = manifests[0]["spec"]["components"][1]["podTemplate"]["metadata"]["labels"]
    assert pod_labels["wingsmith.dev/deployment"] == labels[0]
    for manifest in manifests:
        assert_admissible(manifest)


def test_v1alpha1_uses_services_with_worker_sub_component_types() -> None:
    config = serving(mode="disaggregated", devices_per_replica=8, parallelism={"tensor": 4})
    manifest = render_dgd(desired(config), namespace="wingsmith", api_version=V1ALPHA1)

    services = manifest["spec"]["services"]
    assert list(services) == ["frontend", "prefill", "decode"]
    assert services["frontend"]["componentType"] == "frontend"
    assert "resources" not in services["frontend"]
    for role in ("prefill", "decode"):
        service = services[role]
        assert service["componentType"] == "worker"
        assert service["subComponentType"] == role
        assert service["resources"] == {"limits": {"gpu": "4"}, "requests": {"gpu": "4"}}
        assert service["extraPodSpec"]["nodeSelector"] == {"nvidia.com/gpu.product": H100}
        main = service["extraPodSpec"]["mainContainer"]
        assert main["name"] == "main"
        assert flag(main["args"], "--disaggregation-mode") == role
    assert_admissible(manifest)


def test_an_adopted_deployment_renders_onto_the_dgd_it_came_from() -> None:
    obj = desired(adopted={"namespace": "team-a", "name": "llama-prod"})
    manifest = render_dgd(obj, namespace="wingsmith")
    assert (manifest["metadata"]["name"], manifest["metadata"]["namespace"]) == (
        "llama-prod",
        "team-a",
    )
    assert manifest["metadata"]["labels"]["wingsmith.dev/workload"] == "llama"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"replicas": -1}, "replicas"),
        ({"workload_id": "Llama"}, "workload_id"),
        ({"serving_digest": "svg/0"}, "serving_digest"),
        ({"serving": serving() | {"backend": "tgi"}}, "serving.backend"),
        ({"serving": serving() | {"devices_per_replica": 3}}, "serving"),
        (
            {"serving": serving(image="vllm:latest", engine_version="main")},
            "serving.engine_version",
        ),
        ({"serving": serving(engine_version="1.3/0")}, "serving.engine_version"),
        ({"serving": serving(image=" vllm:1.3.0")}, "serving.image"),
    ],
)
def test_unsupported_input_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"(^|; ){re.escape(field)}:"):
        render_dgd(desired() | changes, namespace="wingsmith")


def test_a_missing_field_is_named() -> None:
    obj = desired()
    del obj["device_class"]
    with pytest.raises(ValueError, match="device_class"):
        render_dgd(obj, namespace="wingsmith")


def test_unknown_api_versions_and_bad_namespaces_are_refused() -> None:
    with pytest.raises(ValueError, match="api_version"):
        render_dgd(desired(), namespace="wingsmith", api_version="nvidia.com/v2")
    with pytest.raises(ValueError, match="namespace"):
        render_dgd(desired(), namespace="Wingsmith")


def test_render_yaml_is_the_manifest() -> None:
    text = render_yaml(desired(), namespace="wingsmith", api_version=V1ALPHA1)
    assert text.startswith("apiVersion: nvidia.com/v1alpha1\nkind: DynamoGraphDeployment\n")
    assert yaml.safe_load(text) == render_dgd(
        desired(), namespace="wingsmith", api_version=V1ALPHA1
    )


def test_long_engine_arguments_survive_yaml() -> None:
    template = "x " * 1000  # wider than any line: YAML may fold it, but must give it back whole
    text = render_yaml(desired(engine_args=["--chat-template", template]), namespace="wingsmith")
    assert args_of(yaml.safe_load(text), "worker")[-1] == template
