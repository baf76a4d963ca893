"""Render a render object (what should run) into an NVIDIA Dynamo DynamoGraphDeployment.

The plane never sends Kubernetes manifests: it publishes the render object on
`wingsmith.render.<cluster>.<deployment>` and the operator in that cluster turns it into a DGD
here. Rendering is pure and deterministic because the operator diffs the result against what the
cluster holds: the same input must give the same manifest, or every pass would look like drift.

Two API versions are rendered: `nvidia.com/v1beta1` (what current Dynamo operators store) and
`nvidia.com/v1alpha1` (the only version operators released before May 2026 know). The shape of
the graph is fixed by the serving mode, one frontend plus either one `worker` or a `prefill` and
a `decode` component, because Dynamo forbids adding or removing components after creation.
A disaggregated replica is one prefill plus one decode worker, each with half of the replica's
devices, so the DGD requests exactly `devices_per_replica` per replica, as admission counted.
A worker wider than a node (`nodes_per_worker` > 1) is a multinode component: `nodeCount` pods
with an even share of its devices each; Dynamo's operator adds the backend's own multinode
launch (node rank, leader address, mpirun) to them.

The Dynamo runtime release (domain/releases.py) picks the image and the flags its workers
understand; a config stored before releases were named uses its engine_version as the release,
as it always did. Input the renderer cannot express raises ValueError naming the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import yaml
from pydantic import ValidationError

from wingsmith.domain import engine_flags, releases
from wingsmith.domain.contracts.render import LABEL_VALUE_MAX, RenderObject
from wingsmith.domain.pods import PodNeeds
from wingsmith.domain.values import Backend, ServingConfig, ServingMode
from wingsmith.services.operator import pods

V1BETA1: Final = "nvidia.com/v1beta1"
V1ALPHA1: Final = "nvidia.com/v1alpha1"
API_VERSIONS: Final = (V1BETA1, V1ALPHA1)
KIND: Final = "DynamoGraphDeployment"

LABEL_PREFIX: Final = "wingsmith.dev/"
LABEL_MANAGED_BY: Final = LABEL_PREFIX + "managed-by"
LABEL_WORKLOAD: Final = LABEL_PREFIX + "workload"
LABEL_DEPLOYMENT: Final = LABEL_PREFIX + "deployment"
LABEL_GENERATION: Final = LABEL_PREFIX + "generation"
LABEL_SERVING_DIGEST: Final = LABEL_PREFIX + "serving-digest"
ANNOTATION_DEPLOYMENT_ID: Final = LABEL_PREFIX + "deployment-id"
MANAGED_BY: Final = "wingsmith"

GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
MAIN_CONTAINER: Final = "main"

_LABEL_HASH_CHARS = 10

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A container image tag, as registries accept it.
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# What Dynamo's admission accepts as a version in an image tag: semver 2.0, optionally `v`-led.
_NUMBER = r"(0|[1-9][0-9]*)"
_PRERELEASE_ID = r"(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER_TAG = re.compile(
    rf"^[vV]?{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    rf"(-{_PRERELEASE_ID}(\.{_PRERELEASE_ID})*)?"
    r"(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
# runtimeVersionOverride: strict MAJOR.MINOR.PATCH, each part at most four digits (the CRD pattern).
RUNTIME_VERSION = re.compile(r"^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})$")


@dataclass(frozen=True)
class Component:
    """One DGD component, independent of the API version it is written in."""

    name: str
    role: str  # the v1beta1 type: frontend | worker | prefill | decode
    replicas: int
    image: str
    runtime_version: str | None
    command: tuple[str, ...]
    args: tuple[str, ...]
    gpus: int  # per pod; 0 means no device request and no node selector
    device_class: str
    labels: Mapping[str, str]
    pod: PodNeeds | None = None  # what its pods need besides the command line (pods.py)
    nodes: int = 1  # pods of one engine worker (multinode when > 1)


# --- public entry points ---------------------------------------------------------------------


def render_dgd(
    desired: Mapping[str, Any], *, namespace: str, api_version: str = V1BETA1
) -> dict[str, Any]:
    """The complete DynamoGraphDeployment for a render object, in the given API version."""
    obj = parse_render_object(desired)
    if not _DNS_LABEL.match(namespace) or len(namespace) > 63:
        raise ValueError(f"namespace: {namespace!r} is not a Kubernetes namespace name")
    components = [_with_pod(c, obj.serving.pod) for c in plan_components(obj)]
    if api_version == V1BETA1:
        spec = _spec_v1beta1(obj, components)
    elif api_version == V1ALPHA1:
        spec = _spec_v1alpha1(obj, components)
    else:
        raise ValueError(f"api_version: {api_version!r} is not one of {', '.join(API_VERSIONS)}")
    return {
        "apiVersion": api_version,
        "kind": KIND,
        "metadata": _metadata(obj, namespace),
        "spec": spec,
    }


def render_yaml(desired: Mapping[str, Any], *, namespace: str, api_version: str = V1BETA1) -> str:
    """The manifest as YAML, keys in the order they were rendered (for `wingsmith render`)."""
    dgd = render_dgd(desired, namespace=namespace, api_version=api_version)
    return str(yaml.safe_dump(dgd, sort_keys=False, default_flow_style=False, width=1000))


def parse_render_object(desired: Mapping[str, Any]) -> RenderObject:
    """Validate a render object; the error names each offending field by its path."""
    try:
        return RenderObject.model_validate(dict(desired))
    except ValidationError as e:
        problems = [
            f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}"
            for err in e.errors()
        ]
        raise ValueError("; ".join(problems)) from None


def deployment_label(deployment_id: str) -> str:
    """The `wingsmith.dev/deployment` label value: the id, or a prefix and a hash when too long.

    Deployment ids join two DNS labels and can reach 128 characters; label values stop at 63.
    The hash keeps shortened values distinct; the full id is in an annotation.
    """
    if len(deployment_id) <= LABEL_VALUE_MAX:
        return deployment_id
    digest = hashlib.sha256(deployment_id.encode()).hexdigest()[:_LABEL_HASH_CHARS]
    keep = LABEL_VALUE_MAX - _LABEL_HASH_CHARS - 1
    return f"{deployment_id[:keep]}-{digest}"


def runtime_image(serving: ServingConfig) -> str:
    """The configured image, or Dynamo's runtime image of the backend for the release."""
    if serving.image is not None:
        if serving.image != serving.image.strip() or any(c.isspace() for c in serving.image):
            raise ValueError(f"serving.image: {serving.image!r} contains whitespace")
        return serving.image
    if serving.runtime_release is not None:
        return releases.known(serving.runtime_release).image(serving.backend.value)
    # A config from before runtime releases: its engine_version was the image tag.
    if not _IMAGE_TAG.match(serving.engine_version):
        raise ValueError(
            f"serving.engine_version: {serving.engine_version!r} cannot be an image tag"
        )
    repository = releases.RUNTIME_REPOSITORIES[serving.backend.value]
    return f"{releases.RUNTIME_REGISTRY}/{repository}:{serving.engine_version}"


def image_tag(image: str) -> str:
    """The tag of an image reference, '' when it has none (a digest is not a tag)."""
    reference = image.split("@", 1)[0]
    colon = reference.rfind(":")
    return reference[colon + 1 :] if colon > reference.rfind("/") else ""


def runtime_version_override(serving: ServingConfig, image: str) -> str | None:
    """What Dynamo needs in runtimeVersionOverride: nothing when the image tag is a version."""
    if is_version_tag(image_tag(image)):
        return None
    if serving.runtime_release is not None:
        return serving.runtime_release  # every known release is MAJOR.MINOR.PATCH
    if RUNTIME_VERSION.match(serving.engine_version):
        return serving.engine_version
    raise ValueError(
        f"serving.engine_version: {serving.engine_version!r} must be MAJOR.MINOR.PATCH (each part "
        f"at most 4 digits) because the tag of image {image!r} is not a semantic version"
    )


def is_version_tag(tag: str) -> bool:
    """Whether Dynamo reads a runtime version from this image tag."""
    match = _SEMVER_TAG.match(tag.strip())
    if match is None:
        return False
    # Dynamo parses each core number into 64 bits; a larger one is no version to it.
    return all(int(match.group(i)) < 2**64 for i in (1, 2, 3))


def plan_components(obj: RenderObject) -> list[Component]:
    """The graph's components in a fixed order: frontend first, then the workers."""
    serving = obj.serving
    image = runtime_image(serving)
    override = runtime_version_override(serving, image)
    engine_flags.check_engine_args(serving, obj.engine_args)
    gpus = _gpus_per_pod(serving, obj.nodes_per_worker)
    labels = pod_labels(obj)
    workers = obj.replicas if obj.enabled else 0
    frontend = Component(
        name="frontend",
        role="frontend",
        replicas=1 if workers > 0 else 0,
        image=image,
        runtime_version=override,
        command=("python3", "-m", "dynamo.frontend"),
        args=(),
        gpus=0,
        device_class=obj.device_class,
        labels=labels,
    )
    roles = ("worker",) if serving.mode is ServingMode.AGGREGATED else ("prefill", "decode")
    module = f"dynamo.{serving.backend.value}"
    return [frontend] + [
        Component(
            name=role,
            role=role,
            replicas=workers,
            image=image,
            runtime_version=override,
            command=("python3", "-m", module),
            args=tuple(engine_argv(serving, role, obj.engine_args)),
            gpus=gpus,
            device_class=obj.device_class,
            labels=labels,
            nodes=obj.nodes_per_worker,
        )
        for role in roles
    ]


def _with_pod(c: Component, needs: PodNeeds | None) -> Component:
    """The component with the workload's pod needs, and the frontend they ask for."""
    if c.role != "frontend":
        return replace(c, pod=needs)
    replicas = pods.frontend_replicas(needs) if c.replicas else 0
    return replace(c, pod=needs, replicas=replicas, args=c.args + pods.frontend_args(needs))


def _gpus_per_pod(serving: ServingConfig, nodes: int) -> int:
    """A worker's devices split evenly over its nodes, as admission counted them."""
    if serving.devices_per_worker % nodes:
        raise ValueError(
            f"nodes_per_worker: {nodes} does not divide a worker's "
            f"{serving.devices_per_worker} devices evenly"
        )
    return serving.devices_per_worker // nodes


def pod_labels(obj: RenderObject) -> dict[str, str]:
    """Labels on every component's pods, so pods can be matched to deployments and digests."""
    return {
        LABEL_DEPLOYMENT: deployment_label(obj.deployment_id),
        LABEL_SERVING_DIGEST: obj.serving_digest,
        LABEL_GENERATION: str(obj.generation),
    }


# --- engine arguments ------------------------------------------------------------------------


def engine_argv(serving: ServingConfig, role: str, engine_args: Sequence[str] = ()) -> list[str]:
    """The worker's arguments after `python3 -m dynamo.<backend>`.

    The serving config is spelled in the backend's own flags; the deployment's engine_args come
    last so that, with argparse's last-one-wins, they override anything rendered before them.
    """
    disaggregation = None if role == "worker" else role
    return [*_BACKEND_ARGS[serving.backend](serving, disaggregation), *engine_args]


def _opt(flag: str, value: object) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _data_parallel(serving: ServingConfig) -> int:
    """Engine copies inside one worker: its devices left after tensor x pipeline.

    Counted per worker, not per replica: a disaggregated replica's prefill and decode workers
    each run on half of its devices.
    """
    p = serving.parallelism
    return serving.devices_per_worker // (p.tensor * p.pipeline)


def _vllm_args(serving: ServingConfig, disaggregation: str | None) -> list[str]:
    p, kv = serving.parallelism, serving.kv_cache
    dp = _data_parallel(serving)
    return [
        *("--model", serving.model),
        *("--tensor-parallel-size", str(p.tensor)),
        *("--pipeline-parallel-size", str(p.pipeline)),
        *_opt("--data-parallel-size", dp if dp > 1 else None),
        # vLLM sizes expert parallelism itself (tensor x data parallel); it only needs turning on.
        *(["--enable-expert-parallel"] if p.expert > 1 else []),
        *_opt("--max-model-len", serving.context_length),
        *_opt("--quantization", serving.quantization),
        *_opt("--kv-cache-dtype", kv.dtype),
        *_opt("--block-size", kv.block_size),
        *_opt("--gpu-memory-utilization", kv.gpu_memory_utilization),
        *_vllm_disaggregation(serving.release, disaggregation),
    ]


_NIXL_TRANSFER = json.dumps(
    {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":")
)


def _vllm_disaggregation(release: str, disaggregation: str | None) -> list[str]:
    """Dynamo 1.0 replaced `--is-prefill-worker` with `--disaggregation-mode`; later releases
    also require an explicit KV connector on prefill workers (given to both sides so they agree).
    """
    if disaggregation is None:
        return []
    if not releases.vllm_disaggregation_mode(release):
        return ["--is-prefill-worker"] if disaggregation == "prefill" else []
    return ["--disaggregation-mode", disaggregation, "--kv-transfer-config", _NIXL_TRANSFER]


# SGLang names fp8 KV caches by their exact encoding; plain "fp8" means e4m3 elsewhere.
_SGLANG_KV_DTYPES = {"fp8": "fp8_e4m3"}


def _sglang_args(serving: ServingConfig, disaggregation: str | None) -> list[str]:
    p, kv = serving.parallelism, serving.kv_cache
    dp = _data_parallel(serving)
    kv_dtype = _SGLANG_KV_DTYPES.get(kv.dtype, kv.dtype) if kv.dtype else None
    return [
        *("--model-path", serving.model),
        *("--tp-size", str(p.tensor)),
        *("--pp-size", str(p.pipeline)),
        *_opt("--dp-size", dp if dp > 1 else None),
        *_opt("--ep-size", p.expert if p.expert > 1 else None),
        *_opt("--context-length", serving.context_length),
        *_opt("--quantization", serving.quantization),
        *_opt("--kv-cache-dtype", kv_dtype),
        *_opt("--page-size", kv.block_size),
        *_opt("--mem-fraction-static", kv.gpu_memory_utilization),
        *(_sglang_disaggregation(disaggregation) if disaggregation else []),
    ]


def _sglang_disaggregation(disaggregation: str) -> list[str]:
    """The prefill worker's bootstrap server must be reachable from decode pods: SGLang binds
    it to `--host`, 127.0.0.1 by default, so every upstream Kubernetes manifest binds 0.0.0.0."""
    return [
        *("--disaggregation-mode", disaggregation),
        *("--disaggregation-transfer-backend", "nixl"),
        *("--host", "0.0.0.0"),
    ]


# TensorRT-LLM's QuantAlgo names for the quantization spellings the other engines use.
_TRTLLM_QUANT_ALGOS = {"awq": "W4A16_AWQ", "gptq": "W4A16_GPTQ"}


def _trtllm_args(serving: ServingConfig, disaggregation: str | None) -> list[str]:
    p, kv = serving.parallelism, serving.kv_cache
    if _data_parallel(serving) != 1:
        # TensorRT-LLM's world is tensor x pipeline; devices beyond it would sit idle.
        raise ValueError(
            f"serving.devices_per_replica: {serving.devices_per_replica} must be "
            f"{_trtllm_footprint(serving)} for the trtllm backend"
        )
    return [
        # `--model-path` is the spelling every release accepts (newer ones also take `--model`).
        *("--model-path", serving.model),
        *("--tensor-parallel-size", str(p.tensor)),
        *("--pipeline-parallel-size", str(p.pipeline)),
        *_opt("--expert-parallel-size", p.expert if p.expert > 1 else None),
        *_opt("--max-seq-len", serving.context_length),
        *_opt("--kv-block-size", kv.block_size),
        *_opt("--free-gpu-memory-fraction", kv.gpu_memory_utilization),
        *_opt("--disaggregation-mode", disaggregation),
        *_opt("--override-engine-args", _trtllm_overrides(serving, disaggregation)),
    ]


def _trtllm_footprint(serving: ServingConfig) -> str:
    """The only devices_per_replica TensorRT-LLM can use, spelled out for an error message."""
    p = serving.parallelism
    world = p.tensor * p.pipeline
    if serving.mode is ServingMode.DISAGGREGATED:
        return f"2 workers x tensor x pipeline parallelism ({2 * world})"
    return f"tensor x pipeline parallelism ({world})"


# What Dynamo's TensorRT-LLM worker gives the engine when `--free-gpu-memory-fraction` is not
# set (components/src/dynamo/trtllm/backend_args.py).
_TRTLLM_MEMORY_FRACTION = 0.9


def _trtllm_overrides(serving: ServingConfig, disaggregation: str | None) -> str | None:
    """LLM-API settings as the one JSON `--override-engine-args` Dynamo's worker takes.

    The worker builds the engine's `kv_cache_config` from `--free-gpu-memory-fraction` alone
    (`--kv-block-size` only tells the KV router the block size) and then lays this override
    over it, so a `kv_cache_config` here must carry every KV-cache setting, the memory fraction
    included, or it drops the worker's. engine_args may not carry a second override
    (domain/engine_flags.py): it would replace this one whole.
    """
    overrides: dict[str, Any] = {}
    if kv_cache := _trtllm_kv_cache(serving):
        overrides["kv_cache_config"] = kv_cache
    if serving.quantization:
        algo = _TRTLLM_QUANT_ALGOS.get(serving.quantization, serving.quantization.upper())
        overrides["quant_config"] = {"quant_algo": algo}
    if disaggregation:
        # Prefill and decode workers exchange KV blocks through the cache transceiver.
        overrides["cache_transceiver_config"] = {"backend": "DEFAULT"}
    if disaggregation == "prefill":
        overrides["disable_overlap_scheduler"] = True  # not supported on prefill-only workers
    if not overrides:
        return None
    return json.dumps(overrides, sort_keys=True, separators=(",", ":"))


def _trtllm_kv_cache(serving: ServingConfig) -> dict[str, Any]:
    """The engine's KV-cache config for what the serving config says; empty when it says
    nothing, so the worker keeps its own."""
    kv = serving.kv_cache
    if kv.dtype is None and kv.block_size is None and kv.gpu_memory_utilization is None:
        return {}
    fraction = kv.gpu_memory_utilization
    config: dict[str, Any] = {
        "free_gpu_memory_fraction": _TRTLLM_MEMORY_FRACTION if fraction is None else fraction
    }
    if kv.dtype is not None:
        config["dtype"] = kv.dtype
    if kv.block_size is not None:
        config["tokens_per_block"] = kv.block_size
    return config


_BACKEND_ARGS = {
    Backend.VLLM: _vllm_args,
    Backend.SGLANG: _sglang_args,
    Backend.TRTLLM: _trtllm_args,
}


# --- manifest shapes -------------------------------------------------------------------------


def _metadata(obj: RenderObject, namespace: str) -> dict[str, Any]:
    """The DGD is named after the workload, unless it is an adopted object that keeps its own."""
    name, ns = (obj.workload_id, namespace)
    if obj.adopted is not None:
        name, ns = obj.adopted.name, obj.adopted.namespace
    return {
        "name": name,
        "namespace": ns,
        "labels": {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_WORKLOAD: obj.workload_id,
            LABEL_DEPLOYMENT: deployment_label(obj.deployment_id),
            LABEL_GENERATION: str(obj.generation),
            LABEL_SERVING_DIGEST: obj.serving_digest,
        },
        "annotations": {ANNOTATION_DEPLOYMENT_ID: obj.deployment_id},
    }


def _spec_v1beta1(obj: RenderObject, components: list[Component]) -> dict[str, Any]:
    return {
        "backendFramework": obj.serving.backend.value,
        "components": [_component_v1beta1(c) for c in components],
    }


def _component_v1beta1(c: Component) -> dict[str, Any]:
    out: dict[str, Any] = {"name": c.name, "type": c.role, "replicas": c.replicas}
    if c.nodes > 1:
        out["multinode"] = {"nodeCount": c.nodes}
    if c.runtime_version is not None:
        out["runtimeVersionOverride"] = c.runtime_version
    pod_spec: dict[str, Any] = {}
    if c.gpus:
        pod_spec["nodeSelector"] = {GPU_PRODUCT_LABEL: c.device_class}
    container = _main_container(c)
    if c.gpus:
        count = str(c.gpus)
        container["resources"] = {
            "limits": {GPU_RESOURCE: count},
            "requests": {GPU_RESOURCE: count},
        }
    pod_spec["containers"] = [container]
    out["podTemplate"] = {"metadata": {"labels": dict(c.labels)}, "spec": pod_spec}
    pods.add_to_component_v1beta1(out, c.pod)
    return out


def _spec_v1alpha1(obj: RenderObject, components: list[Component]) -> dict[str, Any]:
    spec = {
        "backendFramework": obj.serving.backend.value,
        "services": {c.name: _service_v1alpha1(c) for c in components},
    }
    pods.add_to_spec_v1alpha1(spec, obj.serving.pod)
    return spec


def _service_v1alpha1(c: Component) -> dict[str, Any]:
    """v1alpha1 has no prefill/decode types: they are workers with a sub-component type."""
    disaggregated = c.role in ("prefill", "decode")
    out: dict[str, Any] = {"componentType": "worker" if disaggregated else c.role}
    if disaggregated:
        out["subComponentType"] = c.role
    out["replicas"] = c.replicas
    if c.nodes > 1:
        out["multinode"] = {"nodeCount": c.nodes}
    if c.runtime_version is not None:
        out["runtimeVersionOverride"] = c.runtime_version
    if c.gpus:
        count = str(c.gpus)  # Dynamo's own resources struct, turned into nvidia.com/gpu
        out["resources"] = {"limits": {"gpu": count}, "requests": {"gpu": count}}
    out["extraPodMetadata"] = {"labels": dict(c.labels)}
    pod_spec: dict[str, Any] = {}
    if c.gpus:
        pod_spec["nodeSelector"] = {GPU_PRODUCT_LABEL: c.device_class}
    pod_spec["mainContainer"] = _main_container(c)
    out["extraPodSpec"] = pod_spec
    pods.add_to_service_v1alpha1(out, c.pod)
    return out


def _main_container(c: Component) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": MAIN_CONTAINER,
        "image": c.image,
        "command": list(c.command),
    }
    if c.args:
        container["args"] = list(c.args)
    return container
