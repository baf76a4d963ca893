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

from wingsmith.domain import engine_flags, releases
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


known_releases = st.sampled_from(list(releases.RELEASES))
ALL_BACKENDS = st.sampled_from(list(Backend))
ALL_MODES = st.sampled_from(["aggregated", "disaggregated"])


@st.composite
def images(draw: st.DrawFn) -> tuple[str | None, str | None, str | None, bool]:
    """(image, engine_version, runtime_release, whether runtimeVersionOverride is expected),
    all admissible. A config without a runtime release is one stored before they existed."""
    case = draw(
        st.sampled_from(["release", "release-image", "default", "semver-tag", "no-version"])
    )
    if case == "release":  # Dynamo's image of the release, with the engine version it ships
        return None, None, draw(known_releases), False
    if case == "release-image":  # an image of one's own: any engine version, the release's flags
        tag = draw(st.one_of(semver_tags, other_tags))
        image = f"{draw(registries)}:{tag}"
        return image, draw(loose_versions), draw(known_releases), not render.is_version_tag(tag)
    legacy_image, version, needs_override = draw(_legacy_images(case))
    return legacy_image, version, None, needs_override


@st.composite
def _legacy_images(draw: st.DrawFn, case: str) -> tuple[str | None, str, bool]:
    """(image, engine_version, whether runtimeVersionOverride is expected) of a legacy config,
    whose engine_version was the release."""
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
def servings(
    draw: st.DrawFn,
    backends: st.SearchStrategy[Backend] = ALL_BACKENDS,
    modes: st.SearchStrategy[str] = ALL_MODES,
    wide: bool = False,
) -> tuple[dict[str, Any], bool]:
    """A valid serving config (built through ServingConfig) and whether it needs an override;
    `wide` ones have workers of 2 devices or more, to spread over nodes."""
    backend = draw(backends)
    tensor = draw(st.sampled_from([1, 2, 4, 8]))
    pipeline = draw(st.sampled_from([1, 2]))
    data = 1 if backend is Backend.TRTLLM else draw(st.sampled_from([1, 2, 4]))
    if wide and tensor * pipeline * data == 1:
        tensor = 2
    mode = draw(modes)
    workers = 2 if mode == "disaggregated" else 1  # a prefill and a decode worker per replica
    image, version, release, needs_override = draw(images())
    versions = {"engine_version": version} if version is not None else {}
    config = ServingConfig(
        model=draw(st.one_of(st.sampled_from(["Qwen/Qwen3-0.6B"]), st.text(min_size=1))),
        backend=backend,
        **versions,
        runtime_release=release,
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


def _free_engine_args(config: dict[str, Any]) -> st.SearchStrategy[list[str]]:
    """Engine arguments that do not fight the rendered flags (those are refused: see
    test_engine_args_that_fight_the_rendered_flags_are_refused)."""
    rendered = engine_flags.rendered_flags(ServingConfig.model_validate(config))
    free = st.text(min_size=1, max_size=40).filter(lambda a: a.split("=", 1)[0] not in rendered)
    return st.lists(free, max_size=6)


@st.composite
def render_objects(
    draw: st.DrawFn,
    backends: st.SearchStrategy[Backend] = ALL_BACKENDS,
    modes: st.SearchStrategy[str] = ALL_MODES,
    multinode: bool | None = None,
) -> tuple[dict[str, Any], bool]:
    config, needs_override = draw(servings(backends, modes, wide=bool(multinode)))
    per_worker = ServingConfig.model_validate(config).devices_per_worker
    counts = [n for n in (2, 3, 4, 8, 16) if per_worker % n == 0]
    if multinode is None:
        counts = [1, *counts]
    nodes = 1 if multinode is False else draw(st.sampled_from(counts))
    workload, cluster = draw(ids), draw(ids)
    adopted = draw(st.none() | st.fixed_dictionaries({"namespace": dns_labels(), "name": ids}))
    obj = desired(
        config,
        deployment_id=f"{workload}--{cluster}",
        workload_id=workload,
        cluster_id=cluster,
        device_class=draw(st.sampled_from([H100, "NVIDIA-A100-SXM4-80GB", "L40S", "gb200_nvl"])),
        generation=draw(st.integers(1, 10**9)),
        engine_args=draw(_free_engine_args(config)),
        replicas=draw(st.integers(0, 16)),
        enabled=draw(st.booleans()),
        adopted=adopted,
        nodes_per_worker=nodes,
    )
    return obj, needs_override


# --- properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=render_objects())
def test_every_render_object_renders_an_admissible_dgd(
    api_version: str, case: tuple[dict[str, Any], bool]
) -> None:
    _assert_renders_admissibly(api_version, case)


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
@pytest.mark.parametrize("backend", list(Backend))
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
@pytest.mark.parametrize("multinode", [False, True], ids=["single-node", "multinode"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_backend_mode_and_width_renders_what_a_cluster_needs(
    api_version: str, backend: Backend, mode: str, multinode: bool, data: st.DataObject
) -> None:
    """Every backend x aggregated/disaggregated x single/multinode x API version, each drawn
    on its own so none depends on the luck of the draw above."""
    case = data.draw(render_objects(st.just(backend), st.just(mode), multinode))
    _assert_renders_admissibly(api_version, case)


def _assert_renders_admissibly(api_version: str, case: tuple[dict[str, Any], bool]) -> None:
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
    nodes = obj.get("nodes_per_worker", 1)
    for name, view in views.items():
        assert view["labels"][render.LABEL_SERVING_DIGEST] == obj["serving_digest"]
        assert view["labels"][render.LABEL_GENERATION] == str(obj["generation"])
        assert ("runtimeVersionOverride" in view["spec"]) is needs_override
        if needs_override and config.runtime_release is not None:
            assert view["spec"]["runtimeVersionOverride"] == config.runtime_release
        if config.image is None:  # Dynamo's image, tagged with the release that runs it
            assert render.image_tag(view["container"]["image"]) == config.release
        if name == "frontend":
            assert view["replicas"] == (1 if workers else 0)
            assert view["gpus"] is None
            assert "multinode" not in view["spec"]
            continue
        assert view["replicas"] == workers
        # A worker wider than a node: nodeCount pods, each with an even share of its devices.
        assert view["spec"].get("multinode") == ({"nodeCount": nodes} if nodes > 1 else None)
        assert int(view["gpus"]) * nodes == config.devices_per_worker
        assert view["node_selector"] == {render.GPU_PRODUCT_LABEL: obj["device_class"]}
        assert view["container"]["command"] == [
            "python3",
            "-m",
            f"dynamo.{obj['serving']['backend']}",
        ]
        args = view["container"]["args"]
        assert args[len(args) - len(obj["engine_args"]) :] == obj["engine_args"]
        _assert_backend_needs(config, name, args[: len(args) - len(obj["engine_args"])])
    # Admission counted devices_per_replica per replica: the workers of one replica request it all.
    assert sum(int(views[role]["gpus"]) * nodes for role in roles) == config.devices_per_replica
    metadata = manifest["metadata"]
    assert metadata["annotations"] == {render.ANNOTATION_DEPLOYMENT_ID: obj["deployment_id"]}
    label = metadata["labels"][render.LABEL_DEPLOYMENT]
    assert label == obj["deployment_id"] or len(obj["deployment_id"]) > 63
    expected_name = (obj["adopted"] or {}).get("name", obj["workload_id"])
    assert metadata["name"] == expected_name


def _assert_backend_needs(config: ServingConfig, role: str, rendered: list[str]) -> None:
    """What a real cluster needs of each backend's worker, beyond passing admission."""
    if config.backend is Backend.SGLANG and role != "worker":
        assert flag(rendered, "--host") == "0.0.0.0"  # decode must reach prefill's bootstrap
    if config.backend is Backend.VLLM and role != "worker":
        if releases.vllm_disaggregation_mode(config.release):
            assert flag(rendered, "--disaggregation-mode") == role
        else:
            assert ("--is-prefill-worker" in rendered) is (role == "prefill")
    if config.backend is Backend.TRTLLM:
        overrides = [a for a in rendered if a == "--override-engine-args"]
        assert len(overrides) == int(engine_flags.renders_trtllm_override(config))
        kv = config.kv_cache
        if overrides and (kv.dtype or kv.block_size or kv.gpu_memory_utilization):
            kv_config = json.loads(flag(rendered, "--override-engine-args"))["kv_cache_config"]
            assert kv_config.get("dtype") == kv.dtype
            assert kv_config.get("tokens_per_block") == kv.block_size
            fraction = kv.gpu_memory_utilization
            assert kv_config["free_gpu_memory_fraction"] == (0.9 if fraction is None else fraction)


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
        # One override carries every KV-cache setting, so the memory fraction is not dropped
        # and the block size reaches the engine.
        "kv_cache_config": {
            "dtype": "fp8",
            "free_gpu_memory_fraction": 0.7,
            "tokens_per_block": 64,
        },
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
    # A flag the renderer spells but may be tuned (a structural one is refused: below).
    engine_args = ["--max-model-len", "4096", "--enforce-eager"]
    obj = desired(serving(context_length=8192), engine_args=engine_args)
    manifest = render_dgd(obj, namespace="wingsmith")

    args = args_of(manifest, "worker")
    assert args[-3:] == engine_args
    assert args.index("--max-model-len") < len(args) - 3  # rendered earlier, overridden


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


# --- runtime releases ------------------------------------------------------------------------

# A render object stored before runtime releases existed renders exactly the manifest it did
# then: sha256 (first 16 hex digits) of `render_yaml` as the renderer wrote it before
# `runtime_release`, per (config change, API version).
_LEGACY = {"engine_version": "1.3.0"}
_BEFORE_RELEASES = [
    ({}, "bba300aa2deb74c6", "e654b74343fbb25b"),
    (
        {"mode": "disaggregated", "devices_per_replica": 4, "engine_version": "0.4.1"},
        "d0556e301f81e01c",
        "80f51e46ed051146",
    ),
    (
        {
            "mode": "disaggregated",
            "devices_per_replica": 4,
            "kv_cache": {"dtype": "fp8", "block_size": 32},
        },
        "dd10fe7a0435fd49",
        "6316b60c8917e3c3",
    ),
    (
        {"backend": "sglang", "engine_version": "0.9.2", "quantization": "fp8"},
        "70301a079cf9e857",
        "ef43938a3de6f8e6",
    ),
    (
        {"backend": "trtllm", "image": "registry.local/trtllm:latest", "engine_version": "1.0.0"},
        "c324c4f4ebfa711d",
        "4023a91385283dcd",
    ),
]


@pytest.mark.parametrize(("change", "beta", "alpha"), _BEFORE_RELEASES)
def test_a_config_stored_before_runtime_releases_renders_as_it_did(
    change: dict[str, Any], beta: str, alpha: str
) -> None:
    config = serving(**change)
    assert "runtime_release" not in config  # as stored then
    for api_version, expected in ((V1BETA1, beta), (V1ALPHA1, alpha)):
        text = render_yaml(desired(config), namespace="wingsmith", api_version=api_version)
        assert hashlib.sha256(text.encode()).hexdigest()[:16] == expected


@pytest.mark.parametrize("backend", list(Backend))
@pytest.mark.parametrize("release", ["0.9.1", "1.0.1", "1.3.1"])
def test_the_runtime_release_picks_the_image_and_the_engine_version(
    backend: Backend, release: str
) -> None:
    config = ServingConfig.model_validate(
        {"model": "Qwen/Qwen3-0.6B", "backend": backend, "runtime_release": release}
        | {"devices_per_replica": 1}
    )
    manifest = render_dgd(desired(config.model_dump(mode="json")), namespace="wingsmith")

    repository = {
        "vllm": "vllm-runtime",
        "sglang": "sglang-runtime",
        "trtllm": "tensorrtllm-runtime",
    }
    for component in manifest["spec"]["components"]:
        assert main_container(component)["image"] == (
            f"nvcr.io/nvidia/ai-dynamo/{repository[backend.value]}:{release}"
        )
        assert "runtimeVersionOverride" not in component
    assert config.engine_version == releases.RELEASES[release].engine_version(backend.value)
    assert_admissible(manifest)


@pytest.mark.parametrize(
    ("release", "prefill_flags", "decode_flags"),
    [
        ("0.9.1", ["--is-prefill-worker"], []),
        ("1.0.0", ["--disaggregation-mode", "prefill"], ["--disaggregation-mode", "decode"]),
        ("1.3.1", ["--disaggregation-mode", "prefill"], ["--disaggregation-mode", "decode"]),
    ],
)
def test_vllm_prefill_flags_follow_the_runtime_release_not_the_engine_version(
    release: str, prefill_flags: list[str], decode_flags: list[str]
) -> None:
    config = serving(
        engine_version=None, runtime_release=release, mode="disaggregated", devices_per_replica=4
    )
    manifest = render_dgd(desired(config, engine_args=[]), namespace="wingsmith")

    for role, flags in (("prefill", prefill_flags), ("decode", decode_flags)):
        args = args_of(manifest, role)
        role_flags = [a for a in args if a in ("--is-prefill-worker", "--disaggregation-mode")]
        assert role_flags == flags[:1]
        if flags[1:]:
            assert flag(args, "--disaggregation-mode") == role


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
def test_an_own_image_without_a_version_tag_gets_the_release_as_override(api_version: str) -> None:
    config = serving(
        engine_version="0.16.0-custom", runtime_release="1.0.1", image="registry.local/vllm:team"
    )
    manifest = render_dgd(desired(config), namespace="wingsmith", api_version=api_version)

    overrides = {
        v["spec"].get("runtimeVersionOverride") for v in _component_views(manifest).values()
    }
    assert overrides == {"1.0.1"}
    assert_admissible(manifest)


# --- what each backend needs -----------------------------------------------------------------


def test_disaggregated_sglang_workers_bind_to_all_interfaces() -> None:
    config = serving(backend="sglang", mode="disaggregated", devices_per_replica=4)
    manifest = render_dgd(desired(config), namespace="wingsmith")
    for role in ("prefill", "decode"):
        assert flag(args_of(manifest, role), "--host") == "0.0.0.0"
    aggregated = render_dgd(desired(serving(backend="sglang")), namespace="wingsmith")
    assert "--host" not in args_of(aggregated, "worker")


@pytest.mark.parametrize(
    ("kv_cache", "expected"),
    [
        ({"dtype": "fp8"}, {"dtype": "fp8", "free_gpu_memory_fraction": 0.9}),
        ({"block_size": 16}, {"tokens_per_block": 16, "free_gpu_memory_fraction": 0.9}),
        ({"gpu_memory_utilization": 0.6}, {"free_gpu_memory_fraction": 0.6}),
        (
            {"dtype": "fp8", "block_size": 64, "gpu_memory_utilization": 0.75},
            {"dtype": "fp8", "tokens_per_block": 64, "free_gpu_memory_fraction": 0.75},
        ),
    ],
)
def test_trtllm_kv_cache_settings_go_into_one_override(
    kv_cache: dict[str, Any], expected: dict[str, Any]
) -> None:
    """The worker builds the engine's kv_cache_config from its memory fraction and lays the
    override over it: the override carries every KV setting, the fraction included."""
    config = serving(backend="trtllm", devices_per_replica=2, kv_cache=kv_cache)
    args = args_of(render_dgd(desired(config), namespace="wingsmith"), "worker")

    assert args.count("--override-engine-args") == 1
    assert json.loads(flag(args, "--override-engine-args")) == {"kv_cache_config": expected}
    if "block_size" in kv_cache:
        assert flag(args, "--kv-block-size") == str(kv_cache["block_size"])  # for the router


@pytest.mark.parametrize(
    ("backend", "mode", "engine_args", "named"),
    [
        ("vllm", "aggregated", ["--tensor-parallel-size", "4"], "--tensor-parallel-size"),
        ("vllm", "aggregated", ["-tp=4"], "-tp"),
        ("vllm", "aggregated", ["--model=other/model"], "--model"),
        ("vllm", "disaggregated", ["--is-prefill-worker"], "--is-prefill-worker"),
        ("vllm", "aggregated", ["--nnodes", "2"], "--nnodes"),
        ("sglang", "aggregated", ["--tp", "8"], "--tp"),
        ("sglang", "disaggregated", ["--host", "127.0.0.1"], "--host"),
        ("sglang", "aggregated", ["--dist-init-addr", "x:1"], "--dist-init-addr"),
        ("trtllm", "aggregated", ["--model-path", "x"], "--model-path"),
        ("trtllm", "disaggregated", ["--override-engine-args", "{}"], "--override-engine-args"),
        ("trtllm", "aggregated", ["--disaggregation-mode", "prefill"], "--disaggregation-mode"),
    ],
)
def test_engine_args_that_fight_the_rendered_flags_are_refused(
    backend: str, mode: str, engine_args: list[str], named: str
) -> None:
    devices = 2 if mode == "aggregated" else 4
    config = serving(backend=backend, mode=mode, devices_per_replica=devices)
    with pytest.raises(ValueError, match=rf"^engine_args: {re.escape(named)} conflicts"):
        render_dgd(desired(config, engine_args=engine_args), namespace="wingsmith")


@pytest.mark.parametrize(
    ("backend", "mode", "engine_args"),
    [
        ("sglang", "aggregated", ["--host", "0.0.0.0"]),  # binding is the user's when aggregated
        ("trtllm", "aggregated", ["--override-engine-args", "{}"]),  # Wingsmith renders none
        ("vllm", "aggregated", ["--max-num-seqs", "8", "--enforce-eager"]),
    ],
)
def test_engine_args_that_fight_nothing_pass(
    backend: str, mode: str, engine_args: list[str]
) -> None:
    config = serving(backend=backend, mode=mode)
    args = args_of(
        render_dgd(desired(config, engine_args=engine_args), namespace="wingsmith"), "worker"
    )
    assert args[-len(engine_args) :] == engine_args


# --- multinode -------------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
def test_a_worker_wider_than_a_node_is_multinode(api_version: str) -> None:
    config = serving(
        backend="sglang", mode="disaggregated", devices_per_replica=16, parallelism={"tensor": 8}
    )
    obj = desired(config, nodes_per_worker=2, engine_args=[])
    manifest = render_dgd(obj, namespace="wingsmith", api_version=api_version)

    views = _component_views(manifest)
    assert "multinode" not in views["frontend"]["spec"]
    for role in ("prefill", "decode"):
        assert views[role]["spec"]["multinode"] == {"nodeCount": 2}
        assert views[role]["gpus"] == "4"  # 8 devices of the worker over 2 nodes
        args = views[role]["container"]["args"]
        assert flag(args, "--tp-size") == "8"  # the worker's whole width; Dynamo adds the rest
        assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(args)
    assert_admissible(manifest)


@pytest.mark.parametrize("backend", list(Backend))
def test_an_uneven_split_over_nodes_names_the_field(backend: Backend) -> None:
    config = serving(backend=backend.value, devices_per_replica=2)
    with pytest.raises(ValueError, match=r"^nodes_per_worker: 3 does not divide"):
        render_dgd(desired(config, nodes_per_worker=3), namespace="wingsmith")
