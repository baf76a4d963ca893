"""Dynamo's admission rules for creating a DynamoGraphDeployment, as a checker for tests.

A rendered manifest has to be accepted by a real cluster, but tests run without one. The CRD's
openAPIV3Schema is checked with jsonschema elsewhere; this module checks what that cannot: the
CRD's CEL rules, the rules of Dynamo's validating webhook that apply on create (summarised in
the project's Dynamo notes, section 2) and Kubernetes' own rules for names, labels and
annotations. It is written independently of the renderer so that it can catch the renderer's
mistakes. `check` returns one message per problem, each starting with the field path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

V1BETA1 = "nvidia.com/v1beta1"
V1ALPHA1 = "nvidia.com/v1alpha1"

MAX_COMPONENTS = 25
# Grove budgets 45 characters for the PodCliqueSet name plus the component name; the set name
# shrinks to fit down to 8 characters, which leaves 37 for the component.
MAX_SAFE_COMPONENT_NAME = 37
MAX_ANNOTATIONS_BYTES = 256 * 1024

COMPONENT_TYPES = {"frontend", "worker", "prefill", "decode", "planner", "epp"}
WORKER_TYPES = {"worker", "prefill", "decode"}

_COMPONENT_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_STRICT_RUNTIME_VERSION = re.compile(
    r"^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})$"
)
_IDENT = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER = re.compile(
    r"^[vV]?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    rf"(?:-{_IDENT}(?:\.{_IDENT})*)?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)
_POSITIVE_INTEGER = re.compile(r"^[1-9][0-9]*$")

# Annotations whose values Dynamo's webhook restricts, on the DGD itself.
_DGD_ANNOTATION_VALUES: dict[str, set[str]] = {
    "nvidia.com/grove-update-strategy": {"RollingRecreate", "OnDelete"},
    "nvidia.com/dynamo-kube-discovery-mode": {"pod", "container"},
    "nvidia.com/workload-provider": {"component", "grove"},
}
VLLM_BACKEND_ANNOTATION = "nvidia.com/vllm-distributed-executor-backend"
ORIGIN_VERSION_ANNOTATION = "nvidia.com/dynamo-operator-origin-version"
GPU_POWER_LIMIT_ANNOTATION = "dynamo.nvidia.com/gpu-power-limit"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class _View:
    """One component seen the same way whichever API version wrote it."""

    path: str
    name: str
    type: str | None
    spec: Mapping[str, Any]
    main: Mapping[str, Any] | None
    main_path: str
    sidecars: list[tuple[str, Mapping[str, Any]]]
    init_containers: list[tuple[str, Mapping[str, Any]]]
    pod_meta: Mapping[str, Any]
    pod_meta_path: str
    pod_spec: Mapping[str, Any]
    pod_spec_path: str
    gpus: tuple[str, Any, Any]  # path, limit, request of the main container's GPUs


def check(dgd: Mapping[str, Any]) -> list[str]:
    """Every reason Dynamo or Kubernetes would refuse to create this DGD; empty when none."""
    problems = list(_check_kind(dgd))
    metadata = _mapping(dgd.get("metadata"))
    problems += _check_metadata(metadata)
    spec = _mapping(dgd.get("spec"))
    if "restart" in spec:
        problems.append("spec.restart: must be absent when the DGD is created")
    views = list(_views(dgd.get("apiVersion"), spec, problems))
    problems += _check_graph(views)
    for view in views:
        problems += _check_component(view)
    return problems


# --- the object ------------------------------------------------------------------------------


def _check_kind(dgd: Mapping[str, Any]) -> Iterator[str]:
    if dgd.get("apiVersion") not in (V1BETA1, V1ALPHA1):
        yield f"apiVersion: {dgd.get('apiVersion')!r} is not a served DGD version"
    if dgd.get("kind") != "DynamoGraphDeployment":
        yield f"kind: {dgd.get('kind')!r} is not DynamoGraphDeployment"


def _check_metadata(metadata: Mapping[str, Any]) -> list[str]:
    problems = []
    name = metadata.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        problems.append(f"metadata.name: {name!r} is not a DNS subdomain")
    namespace = metadata.get("namespace")
    if namespace is not None and not _is_dns_label(namespace):
        problems.append(f"metadata.namespace: {namespace!r} is not a DNS label")
    problems += label_problems("metadata.labels", metadata.get("labels"))
    annotations = metadata.get("annotations")
    problems += annotation_problems("metadata.annotations", annotations)
    problems += _dgd_annotation_values(_mapping(annotations))
    return problems


def _dgd_annotation_values(annotations: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, allowed in _DGD_ANNOTATION_VALUES.items():
        if key in annotations and annotations[key] not in allowed:
            problems.append(f"metadata.annotations[{key}]: must be one of {sorted(allowed)}")
    problems += _vllm_backend_value("metadata.annotations", annotations)
    origin = annotations.get(ORIGIN_VERSION_ANNOTATION)
    if origin is not None and not _is_semver(origin):
        problems.append(f"metadata.annotations[{ORIGIN_VERSION_ANNOTATION}]: must be semver")
    return problems


def _vllm_backend_value(path: str, annotations: Mapping[str, Any]) -> list[str]:
    value = annotations.get(VLLM_BACKEND_ANNOTATION)
    if value is not None and str(value).lower() not in ("mp", "ray"):
        return [f"{path}[{VLLM_BACKEND_ANNOTATION}]: must be mp or ray"]
    return []


# --- Kubernetes names, labels and annotations ------------------------------------------------


def _is_dns_label(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(_DNS_LABEL.match(value))


def qualified_key_problems(path: str, key: object) -> list[str]:
    """A label or annotation key: an optional DNS-subdomain prefix, a slash, a short name."""
    if not isinstance(key, str):
        return [f"{path}: key {key!r} is not a string"]
    prefix, slash, name = key.rpartition("/")
    problems = []
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        problems.append(f"{path}: key {key!r} has a prefix that is not a DNS subdomain")
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        problems.append(f"{path}: key {key!r} has an invalid name part")
    return problems


def label_problems(path: str, labels: object) -> list[str]:
    if labels is None:
        return []
    if not isinstance(labels, Mapping):
        return [f"{path}: must be a map of strings"]
    problems = []
    for key, value in labels.items():
        problems += qualified_key_problems(path, key)
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            problems.append(f"{path}[{key}]: {value!r} is not a valid label value")
    return problems


def annotation_problems(path: str, annotations: object) -> list[str]:
    if annotations is None:
        return []
    if not isinstance(annotations, Mapping):
        return [f"{path}: must be a map of strings"]
    problems = []
    size = 0
    for key, value in annotations.items():
        problems += qualified_key_problems(path, key)
        if not isinstance(value, str):
            problems.append(f"{path}[{key}]: value must be a string")
            continue
        size += len(str(key).encode()) + len(value.encode())
    if size > MAX_ANNOTATIONS_BYTES:
        problems.append(f"{path}: {size} bytes exceed the {MAX_ANNOTATIONS_BYTES}-byte limit")
    return problems


# --- components in either API version --------------------------------------------------------


def _views(api_version: object, spec: Mapping[str, Any], problems: list[str]) -> Iterator[_View]:
    if api_version == V1ALPHA1:
        services = spec.get("services")
        if not isinstance(services, Mapping):
            problems.append("spec.services: must be a map of components")
            return
        for name, service in services.items():
            yield _alpha_view(str(name), _mapping(service))
        return
    components = spec.get("components")
    if not isinstance(components, list):
        problems.append("spec.components: must be a list of components")
        return
    for i, component in enumerate(components):
        yield _beta_view(i, _mapping(component))


def _beta_view(index: int, component: Mapping[str, Any]) -> _View:
    path = f"spec.components[{index}]"
    template = _mapping(component.get("podTemplate"))
    pod_spec = _mapping(template.get("spec"))
    spec_path = f"{path}.podTemplate.spec"
    containers = _containers(spec_path + ".containers", pod_spec.get("containers"))
    main = [(p, c) for p, c in containers if c.get("name") == "main"]
    main_path, main_container = main[0] if main else (f"{spec_path}.containers[main]", None)
    resources = _mapping(_mapping(main_container).get("resources"))
    return _View(
        path=path,
        name=str(component.get("name", "")),
        type=component.get("type"),
        spec=component,
        main=main_container,
        main_path=main_path,
        sidecars=[(p, c) for p, c in containers if c.get("name") != "main"],
        init_containers=_containers(spec_path + ".initContainers", pod_spec.get("initContainers")),
        pod_meta=_mapping(template.get("metadata")),
        pod_meta_path=f"{path}.podTemplate.metadata",
        pod_spec=pod_spec,
        pod_spec_path=spec_path,
        gpus=(
            f"{main_path}.resources",
            _mapping(resources.get("limits")).get(GPU),
            _mapping(resources.get("requests")).get(GPU),
        ),
    )


def _alpha_view(name: str, service: Mapping[str, Any]) -> _View:
    path = f"spec.services[{name}]"
    extra = _mapping(service.get("extraPodSpec"))
    spec_path = f"{path}.extraPodSpec"
    main = extra.get("mainContainer")
    kind = service.get("componentType")
    if kind == "worker" and service.get("subComponentType") in ("prefill", "decode"):
        kind = service["subComponentType"]  # the conversion webhook maps these to v1beta1 types
    resources = _mapping(service.get("resources"))
    return _View(
        path=path,
        name=name,
        type=kind,
        spec=service,
        main=main if isinstance(main, Mapping) else None,
        main_path=f"{spec_path}.mainContainer",
        sidecars=_containers(spec_path + ".containers", extra.get("containers")),
        init_containers=_containers(spec_path + ".initContainers", extra.get("initContainers")),
        pod_meta=_mapping(service.get("extraPodMetadata")),
        pod_meta_path=f"{path}.extraPodMetadata",
        pod_spec=extra,
        pod_spec_path=spec_path,
        gpus=(
            f"{path}.resources",
            _mapping(resources.get("limits")).get("gpu"),
            _mapping(resources.get("requests")).get("gpu"),
        ),
    )


def _containers(path: str, value: object) -> list[tuple[str, Mapping[str, Any]]]:
    if not isinstance(value, list):
        return []
    return [(f"{path}[{i}]", _mapping(c)) for i, c in enumerate(value)]


# --- graph-wide rules ------------------------------------------------------------------------


def _check_graph(views: list[_View]) -> list[str]:
    problems = []
    if not 1 <= len(views) <= MAX_COMPONENTS:
        problems.append(f"spec: has {len(views)} components, needs 1 to {MAX_COMPONENTS}")
    seen: dict[str, str] = {}
    for view in views:
        folded = view.name.lower()
        if folded in seen:
            problems.append(
                f"{view.path}.name: {view.name!r} repeats {seen[folded]!r} ignoring case"
            )
        seen.setdefault(folded, view.name)
    if sum(1 for view in views if view.type == "epp") > 1:
        problems.append("spec: at most one component may have type epp")
    return problems


# --- per-component rules ---------------------------------------------------------------------


def _check_component(view: _View) -> list[str]:
    return [
        *_check_name(view),
        *_check_counts(view),
        *_check_epp(view),
        *_check_containers(view),
        *_check_runtime_version(view),
        *_check_shared_memory(view),
        *_check_pod_metadata(view),
        *_check_gpus(view),
        *_check_gpu_memory_service(view),
    ]


def _check_name(view: _View) -> list[str]:
    problems = []
    if not 1 <= len(view.name) <= 63 or not _COMPONENT_NAME.match(view.name):
        problems.append(f"{view.path}.name: {view.name!r} is not a valid component name")
    elif len(view.name) > MAX_SAFE_COMPONENT_NAME:
        problems.append(
            f"{view.path}.name: {view.name!r} is longer than {MAX_SAFE_COMPONENT_NAME} "
            "characters and may not fit Grove's pod-name budget"
        )
    if view.path.startswith("spec.components") and view.type not in COMPONENT_TYPES:
        problems.append(f"{view.path}.type: {view.type!r} is not a component type")
    return problems


def _check_counts(view: _View) -> list[str]:
    problems = []
    replicas = view.spec.get("replicas")
    if replicas is not None and (not _is_int(replicas) or replicas < 0):
        problems.append(f"{view.path}.replicas: {replicas!r} must be a non-negative integer")
    minimum = view.spec.get("minAvailable")
    if _is_int(minimum) and _is_int(replicas) and 0 < replicas < minimum:
        problems.append(f"{view.path}.minAvailable: must not exceed replicas")
    return problems


def _node_count(view: _View) -> int:
    count = _mapping(view.spec.get("multinode")).get("nodeCount", 1)
    return count if _is_int(count) else 1


def _check_epp(view: _View) -> list[str]:
    config = view.spec.get("eppConfig")
    if view.type != "epp":
        return [f"{view.path}.eppConfig: only allowed on type epp"] if config is not None else []
    problems = []
    if view.spec.get("replicas", 1) != 1:
        problems.append(f"{view.path}.replicas: an EPP component needs exactly 1 replica")
    if _node_count(view) > 1:
        problems.append(f"{view.path}.multinode: an EPP component cannot be multinode")
    if not isinstance(config, Mapping):
        return [*problems, f"{view.path}.eppConfig: required for an EPP component"]
    if ("configMapRef" in config) == ("config" in config):
        problems.append(f"{view.path}.eppConfig: needs exactly one of configMapRef or config")
    elif "configMapRef" in config and not _mapping(config["configMapRef"]).get("name"):
        problems.append(f"{view.path}.eppConfig.configMapRef.name: must not be empty")
    return problems


def _check_containers(view: _View) -> list[str]:
    problems = []
    if view.main is None:
        problems.append(f"{view.main_path}: a main container is required")
    elif not view.main.get("image"):
        problems.append(f"{view.main_path}.image: the main container needs an image")
    for path, container in view.sidecars + view.init_containers:
        if not container.get("image"):
            problems.append(f"{path}.image: required for container {container.get('name')!r}")
    names = [c.get("name") for _, c in view.sidecars + view.init_containers]
    if view.main is not None and view.main.get("name") is not None:
        names.append(view.main.get("name"))
    for name in names:
        if not _is_dns_label(name):
            problems.append(f"{view.pod_spec_path}: container name {name!r} is not a DNS label")
    if len(names) != len(set(map(str, names))):
        problems.append(f"{view.pod_spec_path}: container names must be unique")
    sidecar = view.spec.get("frontendSidecar")
    if sidecar is not None and sidecar not in names:
        problems.append(f"{view.path}.frontendSidecar: {sidecar!r} names no container")
    return problems


def _check_runtime_version(view: _View) -> list[str]:
    override = view.spec.get("runtimeVersionOverride")
    if override not in (None, ""):
        if not isinstance(override, str) or not _STRICT_RUNTIME_VERSION.match(override):
            return [f"{view.path}.runtimeVersionOverride: {override!r} is not MAJOR.MINOR.PATCH"]
        return []
    image = _mapping(view.main).get("image")
    if isinstance(image, str) and image and not _is_semver(_tag_of(image)):
        return [
            f"{view.path}.runtimeVersionOverride: required because the tag of image "
            f"{image!r} is not a semantic version"
        ]
    return []


def _tag_of(image: str) -> str:
    """The tag of an image reference, ignoring any digest; '' when there is none."""
    name = image.strip().partition("@")[0]
    last_part = name.rsplit("/", 1)[-1]
    return last_part.partition(":")[2] if ":" in last_part else ""


def _check_shared_memory(view: _View) -> list[str]:
    size = view.spec.get("sharedMemorySize")
    if size is not None and _negative_quantity(size):
        return [f"{view.path}.sharedMemorySize: must not be negative"]
    legacy = view.spec.get("sharedMemory")
    if isinstance(legacy, Mapping) and not legacy.get("disabled"):
        legacy_size = legacy.get("size")
        if legacy_size is None or _negative_quantity(legacy_size) or _zero_quantity(legacy_size):
            return [f"{view.path}.sharedMemory.size: required when sharedMemory is enabled"]
    return []


def _negative_quantity(value: object) -> bool:
    if _is_int(value) or isinstance(value, float):
        return value < 0
    return str(value).strip().startswith("-") and not _zero_quantity(value)


def _zero_quantity(value: object) -> bool:
    digits = re.match(r"^[+-]?([0-9.]+)", str(value).strip())
    return digits is not None and float(digits.group(1) or "0") == 0


def _check_pod_metadata(view: _View) -> list[str]:
    annotations = view.pod_meta.get("annotations")
    problems = label_problems(f"{view.pod_meta_path}.labels", view.pod_meta.get("labels"))
    problems += annotation_problems(f"{view.pod_meta_path}.annotations", annotations)
    problems += label_problems(
        f"{view.pod_spec_path}.nodeSelector", view.pod_spec.get("nodeSelector")
    )
    annotations = _mapping(annotations)
    problems += _vllm_backend_value(f"{view.pod_meta_path}.annotations", annotations)
    limit = annotations.get(GPU_POWER_LIMIT_ANNOTATION)
    path = f"{view.pod_meta_path}.annotations[{GPU_POWER_LIMIT_ANNOTATION}]"
    if limit is not None and not _POSITIVE_INTEGER.match(str(limit)):
        problems.append(f"{path}: must be a positive integer")
    if limit is not None and view.pod_spec.get("resourceClaims"):
        problems.append(f"{path}: cannot be combined with DRA resource claims")
    return problems


def _check_gpus(view: _View) -> list[str]:
    """GPUs are an extended resource: whole numbers, and a request must equal the limit."""
    path, limit, request = view.gpus
    problems = []
    for what, value in (("limit", limit), ("request", request)):
        if value is not None and _whole_number(value) is None:
            problems.append(f"{path}: GPU {what} {value!r} is not a whole number")
    if limit is not None and request is not None and _whole_number(limit) != _whole_number(request):
        problems.append(f"{path}: GPU request {request!r} must equal the limit {limit!r}")
    return problems


def _whole_number(value: object) -> int | None:
    if _is_int(value):
        return value if value >= 0 else None
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
        return int(value)
    return None


def _check_gpu_memory_service(view: _View) -> list[str]:
    if _mapping(view.spec.get("experimental")).get("gpuMemoryService") is None:
        return []
    path = f"{view.path}.experimental.gpuMemoryService"
    if view.type not in WORKER_TYPES:
        return [f"{path}: only worker, prefill and decode components may use it"]
    if (_whole_number(view.gpus[1]) or 0) < 1:
        return [f"{path}: needs at least one nvidia.com/gpu on the main container"]
    return []


# --- helpers ---------------------------------------------------------------------------------


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_semver(value: object) -> bool:
    return isinstance(value, str) and bool(_SEMVER.match(value.strip()))
