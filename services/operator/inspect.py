"""Read a DynamoGraphDeployment that Wingsmith did not render and say what runs in it.

Discovery reports other people's DGDs as sightings, and promotion turns a sighting into a
workload, so this reader has to cope with every shape real manifests take: both API versions,
roles spread over `type`, `subComponentType` and engine flags (and legacy `componentType: main`,
read by the module it runs), engine argv written as an exec list or as a shell script, with
`$(VAR)` and `${VAR:-default}` references to the container's env resolved as Kubernetes and the
shell would. It is pure (no cluster access): the operator, the CLI (`wingsmith inspect-dgd`) and
the tests all call the same functions.

Malformed manifests raise ValueError naming the path of the offending field; optional fields that
are missing get the value the Dynamo operator would give them.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import yaml

from wingsmith.domain.discovery import WORKER_ROLES
from wingsmith.domain.values import Backend, ServingMode
from wingsmith.services.operator.dgd import (
    GPU_RESOURCE,
    KIND,
    LABEL_MANAGED_BY,
    MAIN_CONTAINER,
    MANAGED_BY,
)
from wingsmith.services.operator.shell import DIGITS, shell_commands

# The init container that holds the Dynamo runtime in Dynamo's sidecar mode.
RUNTIME_CONTAINER: Final = "runtime"
# Dynamo's default for `multinode.nodeCount` when the block is present without it.
DEFAULT_NODE_COUNT: Final = 2


class ApiVersion(StrEnum):
    V1BETA1 = "nvidia.com/v1beta1"
    V1ALPHA1 = "nvidia.com/v1alpha1"


class Role(StrEnum):
    """Roles Dynamo knows; a manifest may carry others (legacy `main`), which are kept as found."""

    FRONTEND = "frontend"
    WORKER = "worker"
    PREFILL = "prefill"
    DECODE = "decode"
    PLANNER = "planner"
    EPP = "epp"
    UNKNOWN = "unknown"  # no type given and nothing in the argv tells


_KNOWN_ROLES: Final = frozenset(r.value for r in Role)
_DISAGG_ROLES: Final = (Role.PREFILL, Role.DECODE)
# Declared roles that engine flags may refine into prefill or decode.
_REFINABLE: Final = ("worker", "main")
# Older manifests' role for anything, frontends included; the module it runs says which.
_LEGACY_MAIN: Final = "main"
# The order in which a component stands for the whole graph when promoting: the aggregated
# worker, else decode (it produces the tokens), else prefill, else a legacy `main` engine.
_PRIMARY_ORDER: Final = ("worker", "decode", "prefill", "main")

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_SHELLS: Final = frozenset({"sh", "bash", "dash", "ash", "ksh", "zsh"})
# Python options that take a separate value; anything else before `-m` is a flag.
_PYTHON_VALUE_OPTIONS: Final = frozenset({"-W", "-X", "-Q"})
# A version as Dynamo admission reads it from an image tag: semver, optionally `v`-led.
_VERSION_TAG = re.compile(r"[vV]?\d+\.\d+\.\d+(-[0-9A-Za-z][0-9A-Za-z.-]*)?")
_ENV_REFERENCE = re.compile(r"\$(?:(?P<bare>[A-Za-z_]\w*)|\{(?P<braced>[A-Za-z_]\w*)\})")
# What expansion left in argv: Kubernetes' `$(NAME)`, the shell's `$NAME` and `${NAME...}`.
_LEFT_REFERENCE = re.compile(
    r"\$(?:\((?P<k8s>[A-Za-z_][A-Za-z0-9_]*)\)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)[^}]*\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)

_MODEL_FLAGS: Final = (("--model",), ("--model-path",))
_SERVED_NAME_FLAGS: Final = ("--served-model-name",)
_TP_FLAGS: Final = ("--tensor-parallel-size", "-tp", "--tp", "--tp-size")
_DISAGG_FLAG: Final = "--disaggregation-mode"
_LEGACY_ROLE_FLAGS: Final = (
    ("--is-prefill-worker", Role.PREFILL),
    ("--is-decode-worker", Role.DECODE),
)
# TRT-LLM keeps tensor parallelism in this YAML file (often a ConfigMap) rather than in argv.
_ENGINE_CONFIG_FLAG: Final = "--extra-engine-args"


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Component:
    """One component of the graph, as its manifest describes it."""

    name: str
    role: str  # a Role value, or the declared string when Dynamo's vocabulary has no match
    replicas: int
    gpus_per_replica: int  # across all nodes of a multinode replica
    imported_args: tuple[str, ...]  # the argv after `python3 -m <module>`
    module: str | None = None  # the Python module the container launches
    backend: Backend | None = None  # from the module
    image: str | None = None
    engine_version: str | None = None
    node_count: int = 1
    env: tuple[tuple[str, str], ...] = ()  # the main container's literal env values
    # env references the argv still holds, each with why: `valueFrom` (known only in the pod)
    # or `unset` (not in the container's env; the image or an envFrom may set it)
    unresolved: tuple[tuple[str, str], ...] = ()
    # `tensor_parallel_size` of the `--extra-engine-args` file, when a ConfigMap at hand has it
    engine_config_tensor_parallel: int | None = None

    @property
    def model(self) -> str | None:
        """The model the engine loads, as its flags name it (a `$VAR` resolved from env)."""
        for names in _MODEL_FLAGS:
            if (value := self._flag(names)) is not None:
                return value
        if self.imported_args and not self.imported_args[0].startswith("-"):
            return self._resolve(self.imported_args[0])  # `python3 -m dynamo.vllm Qwen/Qwen3 ...`
        return self._flag(_SERVED_NAME_FLAGS)

    @property
    def tensor_parallel(self) -> int | None:
        """The tensor-parallel degree; None when a config file or an unknown value decides it."""
        value = self._flag(_TP_FLAGS)
        if value is None and _ENGINE_CONFIG_FLAG in _flag_names(self.imported_args):
            return self.engine_config_tensor_parallel
        if value is None:
            return 1
        return int(value) if DIGITS.fullmatch(value) and int(value) >= 1 else None

    def _flag(self, names: Sequence[str]) -> str | None:
        value = _last_flag_value(self.imported_args, names)
        return None if value is None else self._resolve(value)

    def _resolve(self, value: str) -> str:
        """`$NAME` or `${NAME}` replaced by the literal env value the manifest gives it."""
        reference = _ENV_REFERENCE.fullmatch(value)
        if reference is None:
            return value
        return dict(self.env).get(reference["bare"] or reference["braced"], value)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": str(self.role),
            "replicas": self.replicas,
            "gpus_per_replica": self.gpus_per_replica,
            "imported_args": list(self.imported_args),
        }


@dataclass(frozen=True)
class Inspection:
    """What a DynamoGraphDeployment runs."""

    api_version: ApiVersion
    namespace: str | None
    name: str
    backend: Backend | None
    components: tuple[Component, ...]

    @property
    def primary(self) -> Component | None:
        """The engine component whose settings stand for the deployment's."""
        for role in _PRIMARY_ORDER:
            for component in self.components:
                if component.role == role and (role != "main" or component.module):
                    return component
        return None

    @property
    def workers(self) -> tuple[Component, ...]:
        """The components that run the engine (and so hold devices and are scaled)."""
        return tuple(c for c in self.components if c.role in WORKER_ROLES)

    @property
    def mode(self) -> ServingMode:
        """Disaggregated only with a prefill worker: a lone decode worker serves whole requests."""
        if any(c.role == Role.PREFILL for c in self.components):
            return ServingMode.DISAGGREGATED
        return ServingMode.AGGREGATED

    @property
    def model(self) -> str | None:
        return self.primary.model if self.primary else None

    @property
    def image(self) -> str | None:
        return self.primary.image if self.primary else None

    @property
    def engine_version(self) -> str | None:
        return self.primary.engine_version if self.primary else None

    @property
    def tensor_parallel(self) -> int | None:
        return self.primary.tensor_parallel if self.primary else None

    def summary(self) -> dict[str, Any]:
        """The JSON `wingsmith inspect-dgd` prints; `unresolved` only when there is any."""
        found: dict[str, Any] = {
            "api_version": str(self.api_version),
            "backend": self.backend.value if self.backend else None,
            "components": [c.summary() for c in self.components],
        }
        unresolved = [
            {"component": c.name, "variable": name, "why": why}
            for c in self.components
            for name, why in c.unresolved
        ]
        if unresolved:
            found["unresolved"] = unresolved
        return found


# ---------------------------------------------------------------------------------------------
# Entry points


def load_manifest(text: str) -> dict[str, Any]:
    """The first document of a YAML or JSON file, which must be a mapping."""
    try:
        document = _first_document(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML or JSON: {e}") from e
    if document is None:
        raise ValueError("no document found")
    if not isinstance(document, dict):
        raise ValueError(f"expected a mapping, got {_kind(document)}")
    return document


def inspect_file(text: str) -> list[Inspection]:
    """Each DynamoGraphDeployment of a manifest file, read with the ConfigMaps of its namespace
    that the file ships beside it (a TensorRT-LLM engine config, say)."""
    try:
        documents = _documents(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML or JSON: {e}") from e
    graphs = [d for d in documents if d.get("kind") == KIND]
    if not graphs:
        kinds = sorted({str(d.get("kind")) for d in documents})
        found = f"only {', '.join(kinds)}" if kinds else "no document"
        raise ValueError(f"no {KIND} in it ({found})")
    inspections = []
    for i, graph in enumerate(graphs):
        try:
            inspections.append(inspect_dgd(graph, _config_maps(documents, _namespace(graph))))
        except ValueError as e:
            if len(graphs) == 1:
                raise
            raise ValueError(f"{KIND} {_label(graph, i)}: {e}") from e
    return inspections


def _documents(text: str) -> list[dict[str, Any]]:
    if text.lstrip().startswith(("{", "[")):
        with contextlib.suppress(json.JSONDecodeError):  # a YAML flow mapping, perhaps
            return _flatten([json.loads(text)])
    return _flatten(list(yaml.safe_load_all(text)))


def _flatten(documents: list[Any]) -> list[dict[str, Any]]:
    """Mapping documents, the items of `kind: List` ones (what `kubectl get -o yaml` prints)."""
    found: list[dict[str, Any]] = []
    for document in documents:
        if isinstance(document, list):
            found += _flatten(document)
        elif isinstance(document, dict) and document.get("kind") == "List":
            found += _flatten(_list(document.get("items"), "items"))
        elif isinstance(document, dict):
            found.append(document)
    return found


def _namespace(document: Mapping[str, Any]) -> str | None:
    metadata = document.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return namespace if isinstance(namespace, str) else None


def _label(document: Mapping[str, Any], index: int) -> str:
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return repr(name) if isinstance(name, str) else f"#{index + 1}"


def _config_maps(
    documents: Sequence[Mapping[str, Any]], namespace: str | None
) -> dict[str, Mapping[str, Any]]:
    """ConfigMaps by name: those of the graph's namespace, or of none named (`kubectl -n`)."""
    found: dict[str, Mapping[str, Any]] = {}
    for document in documents:
        metadata, data = document.get("metadata"), document.get("data")
        if document.get("kind") != "ConfigMap" or not isinstance(metadata, Mapping):
            continue
        name, theirs = metadata.get("name"), _namespace(document)
        if isinstance(name, str) and isinstance(data, Mapping) and theirs in (None, namespace):
            found[name] = data
    return found


def is_rendered_by_wingsmith(dgd: Mapping[str, Any]) -> bool:
    metadata = dgd.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(LABEL_MANAGED_BY) == MANAGED_BY


def engine_component_names(dgd: Mapping[str, Any]) -> frozenset[str] | None:
    """The names of the components that run the engine, as inspection reads their roles (a
    legacy `main` frontend is none); None when the manifest cannot be read."""
    try:
        return frozenset(c.name for c in inspect_dgd(dgd).workers)
    except ValueError:
        return None


def inspect_dgd(
    dgd: Mapping[str, Any], config_maps: Mapping[str, Mapping[str, Any]] | None = None
) -> Inspection:
    """Say what a DynamoGraphDeployment runs; ValueError names the path of what is malformed.
    `config_maps` (name to `data`) are those its pods may mount, when they are at hand."""
    document = _mapping(dgd, "manifest")
    api_version = _api_version(document)
    metadata = _mapping(document.get("metadata"), "metadata")
    spec = _mapping(document.get("spec"), "spec")
    read = _READERS[api_version]
    components = tuple(_component(d, config_maps or {}) for d in read(spec))
    return Inspection(
        api_version=api_version,
        namespace=_optional_str(metadata.get("namespace"), "metadata.namespace"),
        name=_required_str(metadata, "name", "metadata"),
        backend=_graph_backend(spec, components),
        components=components,
    )


def _first_document(text: str) -> Any:
    # YAML reads most JSON too, but not JSON indented with tabs.
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # a YAML flow mapping, perhaps
    return next((d for d in yaml.safe_load_all(text) if d is not None), None)


def _api_version(document: Mapping[str, Any]) -> ApiVersion:
    kind = document.get("kind")
    if kind != KIND:
        raise ValueError(f"kind: expected {KIND}, got {kind!r}")
    value = document.get("apiVersion")
    if not isinstance(value, str) or value not in set(ApiVersion):
        known = " or ".join(v.value for v in ApiVersion)
        raise ValueError(f"apiVersion: expected {known}, got {value!r}")
    return ApiVersion(value)


# ---------------------------------------------------------------------------------------------
# The two API versions, brought to one shape


@dataclass(frozen=True)
class _Container:
    path: str  # for errors found while reading its argv
    image: str | None = None
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str | None], ...] = ()  # None: set by `valueFrom`, known in the pod
    config_mounts: tuple[_ConfigMount, ...] = ()


@dataclass(frozen=True)
class _ConfigMount:
    """A ConfigMap volume mounted into the main container."""

    mount_path: str
    config_map: str
    sub_path: str | None
    items: tuple[tuple[str, str], ...]  # (key, path in the volume); empty: every key by name

    def key_of(self, file: str) -> str | None:
        """The ConfigMap key a file in the container reads, if it is in this mount."""
        if self.sub_path is not None:
            inner = self.sub_path if file == self.mount_path else None
        else:
            prefix = self.mount_path.rstrip("/") + "/"
            inner = file[len(prefix) :] if file.startswith(prefix) else None
        if inner is None or not self.items:
            return inner
        return next((key for key, path in self.items if path == inner), None)


@dataclass(frozen=True)
class _Declared:
    """A component as declared, before its argv is read."""

    name: str
    declared_role: str | None
    sub_role: str | None
    replicas: int
    gpus_per_replica: int
    node_count: int
    main: _Container
    version_image: str | None  # the image whose tag names the Dynamo runtime version
    version_override: str | None


def _v1beta1_components(spec: Mapping[str, Any]) -> list[_Declared]:
    items = _list(spec.get("components"), "spec.components")
    if not items:
        raise ValueError("spec.components: a DynamoGraphDeployment needs at least one component")
    return [_v1beta1_component(item, f"spec.components[{i}]") for i, item in enumerate(items)]


def _v1beta1_component(item: object, path: str) -> _Declared:
    component = _mapping(item, path)
    nodes = _node_count(component.get("multinode"), f"{path}.multinode")
    main, runtime_image, gpus = _v1beta1_pods(component, nodes, path)
    return _Declared(
        name=_required_str(component, "name", path),
        declared_role=_optional_str(component.get("type"), f"{path}.type"),
        sub_role=None,  # v1beta1 has prefill and decode as types of their own
        replicas=_count(component.get("replicas"), f"{path}.replicas", default=1),
        gpus_per_replica=gpus,
        node_count=nodes,
        main=main,
        version_image=runtime_image or main.image,
        version_override=_optional_str(
            component.get("runtimeVersionOverride"), f"{path}.runtimeVersionOverride"
        ),
    )


def _v1beta1_pods(
    component: Mapping[str, Any], nodes: int, path: str
) -> tuple[_Container, str | None, int]:
    """The main container, the sidecar runtime image and the GPUs of one replica."""
    if component.get("podTemplate") is not None:
        template_path = f"{path}.podTemplate"
        pod = _pod_spec(component["podTemplate"], template_path)
        raw, main_path = _main_container(pod, template_path)
        gpus = _k8s_gpus(raw, main_path) * nodes
        main = _container(raw, main_path, pod)
        return main, _runtime_image(pod, template_path), gpus
    roles = _list(component.get("roles"), f"{path}.roles")
    if roles:
        return _role_pods(roles, nodes, f"{path}.roles")
    return _Container(f"{path}.podTemplate"), None, 0  # older objects may lack one


def _role_pods(roles: list[Any], nodes: int, path: str) -> tuple[_Container, str | None, int]:
    """Components whose roles (multinode leader/worker, LPX) carry their own pod templates."""
    mains: dict[str, _Container] = {}
    gpus = 0
    for i, item in enumerate(roles):
        role = _mapping(item, f"{path}[{i}]")
        name = _required_str(role, "name", f"{path}[{i}]")
        template_path = f"{path}[{i}].podTemplate"
        pod = _pod_spec(role.get("podTemplate"), template_path)
        raw, main_path = _main_container(pod, template_path)
        # Dynamo's defaults: one leader, the other nodes workers, one pod for any other role.
        default = nodes - 1 if name == "worker" else 1
        gpus += _k8s_gpus(raw, main_path) * _count(
            role.get("replicas"), f"{path}[{i}].replicas", default=default
        )
        mains[name] = _container(raw, main_path, pod)
    leader = mains.get("leader") or next(iter(mains.values()))
    return leader, None, gpus


def _v1alpha1_components(spec: Mapping[str, Any]) -> list[_Declared]:
    services = _mapping(spec.get("services"), "spec.services")
    if not services:
        raise ValueError("spec.services: a DynamoGraphDeployment needs at least one service")
    declared = []
    for name, item in services.items():
        if not isinstance(name, str):
            raise ValueError(f"spec.services: service names must be strings, got {name!r}")
        declared.append(_v1alpha1_service(name, item, f"spec.services.{name}"))
    return declared


def _v1alpha1_service(name: str, item: object, path: str) -> _Declared:
    service = _mapping(item, path)
    nodes = _node_count(service.get("multinode"), f"{path}.multinode")
    pod = _optional_mapping(service.get("extraPodSpec"), f"{path}.extraPodSpec")
    raw, main_path = _v1alpha1_main(pod, f"{path}.extraPodSpec")
    main = _container(raw, main_path, pod)
    gpus = _dynamo_gpus(service, path)
    if gpus is None:
        gpus = _k8s_gpus(raw, main_path)
    return _Declared(
        name=name,
        declared_role=_optional_str(service.get("componentType"), f"{path}.componentType"),
        sub_role=_optional_str(service.get("subComponentType"), f"{path}.subComponentType"),
        replicas=_count(service.get("replicas"), f"{path}.replicas", default=1),
        gpus_per_replica=gpus * nodes,
        node_count=nodes,
        main=main,
        version_image=_runtime_image(pod, f"{path}.extraPodSpec") or main.image,
        version_override=_optional_str(
            service.get("runtimeVersionOverride"), f"{path}.runtimeVersionOverride"
        ),
    )


def _v1alpha1_main(pod: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any], str]:
    """v1alpha1 keeps the engine container in `mainContainer`; converted objects may not."""
    if pod.get("mainContainer") is not None:
        return _mapping(pod["mainContainer"], f"{path}.mainContainer"), f"{path}.mainContainer"
    for i, raw in _mappings(pod.get("containers"), f"{path}.containers"):
        if raw.get("name") == MAIN_CONTAINER:
            return raw, f"{path}.containers[{i}]"
    return {}, f"{path}.mainContainer"  # frontends often take the operator's defaults


def _dynamo_gpus(service: Mapping[str, Any], path: str) -> int | None:
    """GPUs from v1alpha1's own `resources` block (`limits.gpu: "N"`), if it sets them."""
    resources = _optional_mapping(service.get("resources"), f"{path}.resources")
    for side in ("limits", "requests"):
        amounts = _optional_mapping(resources.get(side), f"{path}.resources.{side}")
        if amounts.get("gpu") is not None:
            return _gpu_amount(amounts["gpu"], f"{path}.resources.{side}.gpu")
    return None


_READERS: Final = {
    ApiVersion.V1BETA1: _v1beta1_components,
    ApiVersion.V1ALPHA1: _v1alpha1_components,
}


# ---------------------------------------------------------------------------------------------
# Pods and containers


def _pod_spec(template: object, path: str) -> Mapping[str, Any]:
    return _optional_mapping(_mapping(template, path).get("spec"), f"{path}.spec")


def _mappings(value: object, path: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    for i, item in enumerate(_list(value, path)):
        yield i, _mapping(item, f"{path}[{i}]")


def _main_container(pod: Mapping[str, Any], template_path: str) -> tuple[Mapping[str, Any], str]:
    """The `main` container and its path."""
    path = f"{template_path}.spec.containers"
    for i, raw in _mappings(pod.get("containers"), path):
        if raw.get("name") == MAIN_CONTAINER:
            return raw, f"{path}[{i}]"
    raise ValueError(f"{template_path}: no container named {MAIN_CONTAINER}")


def _runtime_image(pod: Mapping[str, Any], path: str) -> str | None:
    """In Dynamo's sidecar mode the runtime (and so its version) sits in an init container."""
    containers = _mappings(pod.get("initContainers"), f"{path}.spec.initContainers")
    for i, raw in containers:
        if raw.get("name") == RUNTIME_CONTAINER:
            return _optional_str(raw.get("image"), f"{path}.spec.initContainers[{i}].image")
    return None


def _container(raw: Mapping[str, Any], path: str, pod: Mapping[str, Any]) -> _Container:
    return _Container(
        path=path,
        image=_optional_str(raw.get("image"), f"{path}.image"),
        command=_strings(raw.get("command"), f"{path}.command"),
        args=_strings(raw.get("args"), f"{path}.args"),
        env=_container_env(raw.get("env"), f"{path}.env"),
        config_mounts=_config_mounts(raw, pod),
    )


def _config_mounts(raw: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[_ConfigMount, ...]:
    """The ConfigMap volumes the container mounts; only read for an engine config, so
    anything shaped otherwise is passed over rather than refused."""
    volumes = {}
    for volume in _loose_mappings(pod.get("volumes")):
        name, source = volume.get("name"), volume.get("configMap")
        if (
            isinstance(name, str)
            and isinstance(source, Mapping)
            and isinstance(source.get("name"), str)
        ):
            items = tuple(
                (item["key"], item["path"])
                for item in _loose_mappings(source.get("items"))
                if isinstance(item.get("key"), str) and isinstance(item.get("path"), str)
            )
            volumes[name] = (source["name"], items)
    mounts = []
    for mount in _loose_mappings(raw.get("volumeMounts")):
        name, path, sub_path = mount.get("name"), mount.get("mountPath"), mount.get("subPath")
        if isinstance(name, str) and name in volumes and isinstance(path, str):
            config_map, items = volumes[name]
            sub = sub_path if isinstance(sub_path, str) and sub_path else None
            mounts.append(_ConfigMount(path, config_map, sub, items))
    return tuple(mounts)


def _loose_mappings(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _container_env(value: object, path: str) -> tuple[tuple[str, str | None], ...]:
    """The container's env as Kubernetes builds it: a value may use `$(NAME)` of an entry
    before it, a later entry of the same name wins; `valueFrom` ones (None) are only known
    inside the pod."""
    env: dict[str, str | None] = {}
    for i, item in _mappings(value, path):
        name = _required_str(item, "name", f"{path}[{i}]")
        literal = _optional_str(item.get("value"), f"{path}[{i}].value")
        if item.get("valueFrom") is not None:
            env[name] = None
        else:
            env[name] = kubernetes_expand(literal or "", env)
    return tuple(env.items())


def kubernetes_expand(text: str, env: Mapping[str, str | None]) -> str:
    """Kubernetes' own expansion of command, args and env values: `$(NAME)` takes the value of
    the container's env entry, `$$` is a `$`; a reference to an unknown name (or one set by
    `valueFrom`, whose value only the pod knows) stays as written."""
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 == len(text):
            out.append(char)
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and (end := text.find(")", i + 2)) >= 0:
            value = env.get(text[i + 2 : end])
            out.append(value if value is not None else text[i : end + 1])
            i = end + 1
        else:
            out.append(text[i : i + 2])
            i += 2
    return "".join(out)


def _k8s_gpus(raw: Mapping[str, Any], path: str) -> int:
    resources = _optional_mapping(raw.get("resources"), f"{path}.resources")
    for side in ("limits", "requests"):
        amounts = _optional_mapping(resources.get(side), f"{path}.resources.{side}")
        if amounts.get(GPU_RESOURCE) is not None:
            return _gpu_amount(amounts[GPU_RESOURCE], f"{path}.resources.{side}.{GPU_RESOURCE}")
    return 0


def _gpu_amount(value: object, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and DIGITS.fullmatch(value.strip()):
        return int(value)
    raise ValueError(f"{path}: expected a whole number of GPUs, got {value!r}")


def _node_count(multinode: object, path: str) -> int:
    if multinode is None:
        return 1
    block = _mapping(multinode, path)
    return _count(block.get("nodeCount"), f"{path}.nodeCount", default=DEFAULT_NODE_COUNT, least=1)


# ---------------------------------------------------------------------------------------------
# Components: argv, role, backend, version


@dataclass(frozen=True)
class _Launch:
    module: str | None
    args: tuple[str, ...]


_NO_LAUNCH: Final = _Launch(None, ())


def _component(declared: _Declared, config_maps: Mapping[str, Mapping[str, Any]]) -> Component:
    try:
        launch = _launch(declared.main, _runs_default_frontend(declared))
    except ValueError as e:  # the shell lexer does not know where its script came from
        raise ValueError(f"{declared.main.path}: {e}") from e
    env = dict(declared.main.env)
    return Component(
        name=declared.name,
        role=_role(declared.declared_role, declared.sub_role, launch),
        replicas=declared.replicas,
        gpus_per_replica=declared.gpus_per_replica,
        imported_args=launch.args,
        module=launch.module,
        backend=_backend_of(launch.module),
        image=declared.main.image,
        engine_version=_engine_version(declared.version_image, declared.version_override),
        node_count=declared.node_count,
        env=tuple((k, v) for k, v in env.items() if v is not None),
        unresolved=_unresolved(launch.args, env),
        engine_config_tensor_parallel=_engine_config_tp(declared.main, launch, config_maps),
    )


def _engine_config_tp(
    main: _Container, launch: _Launch, config_maps: Mapping[str, Mapping[str, Any]]
) -> int | None:
    """`tensor_parallel_size` from the `--extra-engine-args` file, if a ConfigMap at hand
    holds it; None when it cannot be known here."""
    file = _last_flag_value(launch.args, (_ENGINE_CONFIG_FLAG,))
    for mount in main.config_mounts if file else ():
        key = mount.key_of(file or "")
        text = config_maps.get(mount.config_map, {}).get(key) if key else None
        if isinstance(text, str):
            return _tensor_parallel_size(text)
    return None


def _tensor_parallel_size(text: str) -> int | None:
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    value = config.get("tensor_parallel_size", 1) if isinstance(config, Mapping) else None
    valid = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if valid else None


def _runs_default_frontend(declared: _Declared) -> bool:
    """Whether a component without a command runs the operator's default, the frontend: a
    frontend, or a legacy `main` that looks like one (named so, or holding no GPUs)."""
    role = (declared.declared_role or "").strip().lower()
    if role == Role.FRONTEND:
        return True
    frontendish = "frontend" in declared.name.lower() or declared.gpus_per_replica == 0
    return role == _LEGACY_MAIN and frontendish


def _launch(main: _Container, default_frontend: bool) -> _Launch:
    """Find `python -m <module> <args>` in whichever form the manifest wrote it, after
    Kubernetes has expanded `$(VAR)` in command and args and the shell `$VAR` in its script."""
    env = dict(main.env)
    command = tuple(kubernetes_expand(word, env) for word in main.command)
    args = tuple(kubernetes_expand(word, env) for word in main.args)
    if command and _basename(command[0]) in _SHELLS:
        script = _shell_script(command[1:] + args)
        return _launch_from_script(script, env) if script is not None else _NO_LAUNCH
    if (found := _launch_from_argv(command + args)) is not None:
        return found
    if not command and len(args) == 1 and any(c.isspace() for c in args[0]):
        return _launch_from_script(args[0], env)  # the operator runs a lone string with `sh -c`
    if not command and default_frontend:
        return _Launch("dynamo.frontend", args)  # the operator's default frontend command
    return _NO_LAUNCH


def _unresolved(args: Sequence[str], env: Mapping[str, str | None]) -> tuple[tuple[str, str], ...]:
    """The env references still in the argv, each with why it could not be resolved."""
    found: dict[str, str] = {}
    for arg in args:
        for match in _LEFT_REFERENCE.finditer(arg):
            name = match["k8s"] or match["braced"] or match["bare"]
            if env.get(name) is None:  # a literal one is left only where no shell reads it
                found.setdefault(name, "valueFrom" if name in env else "unset")
    return tuple(found.items())


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _shell_script(shell_args: Sequence[str]) -> str | None:
    """The script of `sh [options] -c SCRIPT [$0 ...]`, or None when the shell runs a file."""
    takes_script, i = False, 0
    while i < len(shell_args) and shell_args[i][:1] in ("-", "+") and shell_args[i] != "-":
        option = shell_args[i]
        if option == "--":
            i += 1
            break
        if option in ("-o", "+o"):
            i += 1  # its value is the next word
        elif not option.startswith("--") and "c" in option[1:]:
            takes_script = True
        i += 1
    return shell_args[i] if takes_script and i < len(shell_args) else None


def _launch_from_argv(argv: Sequence[str]) -> _Launch | None:
    for i, word in enumerate(argv):
        if _PYTHON.fullmatch(_basename(word)):
            return _module_launch(argv[i + 1 :])
    return None


def _module_launch(python_args: Sequence[str]) -> _Launch | None:
    """Python's own options up to `-m MODULE`; anything else means it runs a file or a string."""
    i = 0
    while i < len(python_args) and python_args[i].startswith("-"):
        option = python_args[i]
        if option == "-m" and i + 1 < len(python_args):
            return _Launch(python_args[i + 1], tuple(python_args[i + 2 :]))
        if option.startswith("-m") and len(option) > 2:
            return _Launch(option[2:], tuple(python_args[i + 1 :]))
        if option == "-c":
            return None
        i += 2 if option in _PYTHON_VALUE_OPTIONS else 1
    return None


def _launch_from_script(script: str, env: Mapping[str, str | None]) -> _Launch:
    """The engine command of a shell script; preludes such as namespace clean-ups are skipped."""
    commands = shell_commands(script, env)
    launches = [x for x in map(_launch_from_argv, commands) if x is not None]
    for launch in launches:
        if _is_engine(launch.module):
            return launch
    return launches[0] if launches else _NO_LAUNCH


def _is_engine(module: str | None) -> bool:
    return _backend_of(module) is not None and ".utils" not in (module or "")


def _backend_of(module: str | None) -> Backend | None:
    for backend in Backend:
        prefix = f"dynamo.{backend.value}"
        if module == prefix or (module or "").startswith(prefix + "."):
            return backend
    return None


def _role(declared: str | None, sub_role: str | None, launch: _Launch) -> str:
    """Type or componentType, refined by subComponentType and then by the engine's flags. A
    legacy `main` is what its module runs: a frontend, a planner or an engine worker."""
    base = (declared or "").strip().lower() or None
    if base == _LEGACY_MAIN and launch.module == "dynamo.frontend":
        return Role.FRONTEND  # whatever subComponentType says, it serves HTTP, not tokens
    if sub_role and sub_role.lower() in _DISAGG_ROLES and base in (None, *_REFINABLE):
        return Role(sub_role.lower())
    if base is None or base == _LEGACY_MAIN:
        base = _role_from_module(launch.module) or base
    if base in _REFINABLE and (flagged := _flag_role(launch.args)):
        return flagged
    if base is None:
        return Role.UNKNOWN
    return Role(base) if base in _KNOWN_ROLES else (declared or base).strip()


def _role_from_module(module: str | None) -> str | None:
    if module is None:
        return None
    if module == "dynamo.frontend":
        return Role.FRONTEND
    if module.startswith("dynamo.planner"):
        return Role.PLANNER
    return Role.WORKER if _is_engine(module) else None


def _flag_role(args: Sequence[str]) -> Role | None:
    mode = _last_flag_value(args, (_DISAGG_FLAG,))
    if mode and mode.lower() in _DISAGG_ROLES:
        return Role(mode.lower())
    names = _flag_names(args)
    return next((role for flag, role in _LEGACY_ROLE_FLAGS if flag in names), None)


def _graph_backend(spec: Mapping[str, Any], components: Sequence[Component]) -> Backend | None:
    """`spec.backendFramework`, else the one backend the workers' modules agree on."""
    declared = spec.get("backendFramework")
    if declared is not None:
        if not isinstance(declared, str) or declared not in set(Backend):
            known = ", ".join(b.value for b in Backend)
            raise ValueError(f"spec.backendFramework: expected one of {known}, got {declared!r}")
        return Backend(declared)
    found = {c.backend for c in components if c.backend is not None}
    return found.pop() if len(found) == 1 else None  # none, or a mix Dynamo would refuse


def _engine_version(image: str | None, override: str | None) -> str | None:
    tag = _image_tag(image) if image else None
    if tag and _VERSION_TAG.fullmatch(tag):
        return tag
    return override


def _image_tag(image: str) -> str | None:
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]  # a digest does not name a version
    return name.split(":", 1)[1] if ":" in name else None


# ---------------------------------------------------------------------------------------------
# Flags


def _flag_names(args: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("-")}


def _last_flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of `--name value` / `--name=value` (argparse lets the last win)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name not in names:
            continue
        if eq:
            found = value
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            found = args[i + 1]
    return found


# ---------------------------------------------------------------------------------------------
# Reading raw JSON with paths in the errors


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if value is None:
        raise ValueError(f"{path}: missing")
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected a mapping, got {_kind(value)}")
    return value


def _optional_mapping(value: object, path: str) -> Mapping[str, Any]:
    return {} if value is None else _mapping(value, path)


def _list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{path}: expected a list, got {_kind(value)}")
    return value


def _optional_str(value: object, path: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{path}: expected a string, got {_kind(value)}")


def _required_str(parent: Mapping[str, Any], key: str, path: str) -> str:
    value = _optional_str(parent.get(key), f"{path}.{key}")
    if not value:
        raise ValueError(f"{path}.{key}: missing")
    return value


def _strings(value: object, path: str) -> tuple[str, ...]:
    items = _list(value, path)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            # Kubernetes refuses non-strings in argv; YAML makes them from unquoted numbers.
            raise ValueError(f"{path}[{i}]: expected a string, got {_kind(item)}")
    return tuple(items)


def _count(value: object, path: str, *, default: int, least: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{path}: expected a whole number of at least {least}, got {value!r}")
    return value
