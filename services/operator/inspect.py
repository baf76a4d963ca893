"""Read a DynamoGraphDeployment that Wingsmith did not render and say what runs in it.

Discovery reports other people's DGDs as sightings, and promotion turns a sighting into a
workload, so this reader has to cope with every shape real manifests take: both API versions,
roles spread over `type`, `subComponentType` and engine flags, and engine argv written as an exec
list or as a shell script. It is pure (no cluster access): the operator, the CLI
(`wingsmith inspect-dgd`) and the tests all call the same functions.

Malformed manifests raise ValueError naming the path of the offending field; optional fields that
are missing get the value the Dynamo operator would give them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import yaml

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
        if value is None:
            return None if _ENGINE_CONFIG_FLAG in _flag_names(self.imported_args) else 1
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
    def mode(self) -> ServingMode:
        if any(c.role in _DISAGG_ROLES for c in self.components):
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
        """The JSON `wingsmith inspect-dgd` prints."""
        return {
            "api_version": str(self.api_version),
            "backend": self.backend.value if self.backend else None,
            "components": [c.summary() for c in self.components],
        }


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


def is_rendered_by_wingsmith(dgd: Mapping[str, Any]) -> bool:
    metadata = dgd.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(LABEL_MANAGED_BY) == MANAGED_BY


def inspect_dgd(dgd: Mapping[str, Any]) -> Inspection:
    """Say what a DynamoGraphDeployment runs; ValueError names the path of what is malformed."""
    document = _mapping(dgd, "manifest")
    api_version = _api_version(document)
    metadata = _mapping(document.get("metadata"), "metadata")
    spec = _mapping(document.get("spec"), "spec")
    read = _READERS[api_version]
    components = tuple(_component(d) for d in read(spec))
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
    env: tuple[tuple[str, str], ...] = ()


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
        return _container(raw, main_path), _runtime_image(pod, template_path), gpus
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
        mains[name] = _container(raw, main_path)
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
    main = _container(raw, main_path)
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


def _container(raw: Mapping[str, Any], path: str) -> _Container:
    return _Container(
        path=path,
        image=_optional_str(raw.get("image"), f"{path}.image"),
        command=_strings(raw.get("command"), f"{path}.command"),
        args=_strings(raw.get("args"), f"{path}.args"),
        env=_literal_env(raw.get("env"), f"{path}.env"),
    )


def _literal_env(value: object, path: str) -> tuple[tuple[str, str], ...]:
    """Env entries with a literal value; `valueFrom` ones are only known inside the pod."""
    pairs = []
    for i, item in _mappings(value, path):
        name = _required_str(item, "name", f"{path}[{i}]")
        literal = _optional_str(item.get("value"), f"{path}[{i}].value")
        if literal is not None:
            pairs.append((name, literal))
    return tuple(pairs)


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


def _component(declared: _Declared) -> Component:
    try:
        launch = _launch(declared.main, declared.declared_role)
    except ValueError as e:  # the shell lexer does not know where its script came from
        raise ValueError(f"{declared.main.path}: {e}") from e
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
        env=declared.main.env,
    )


def _launch(main: _Container, declared_role: str | None) -> _Launch:
    """Find `python -m <module> <args>` in whichever form the manifest wrote it."""
    command, args = main.command, main.args
    if command and _basename(command[0]) in _SHELLS:
        script = _shell_script(command[1:] + args)
        return _launch_from_script(script) if script is not None else _NO_LAUNCH
    if (found := _launch_from_argv(command + args)) is not None:
        return found
    if not command and len(args) == 1 and any(c.isspace() for c in args[0]):
        return _launch_from_script(args[0])  # the operator runs a lone string with `sh -c`
    if not command and (declared_role or "").lower() == Role.FRONTEND:
        return _Launch("dynamo.frontend", args)  # the operator's default frontend command
    return _NO_LAUNCH


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


def _launch_from_script(script: str) -> _Launch:
    """The engine command of a shell script; preludes such as namespace clean-ups are skipped."""
    launches = [x for x in map(_launch_from_argv, shell_commands(script)) if x is not None]
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
    """Type or componentType, refined by subComponentType and then by the engine's flags."""
    base = (declared or "").strip().lower() or None
    if sub_role and sub_role.lower() in _DISAGG_ROLES and base in (None, *_REFINABLE):
        return Role(sub_role.lower())
    if base is None:
        base = _role_from_module(launch.module)
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
