"""A workload's pod needs, completed with its cluster's defaults and written into a
DynamoGraphDeployment's components.

Pure, like the renderer that calls it (services/operator/dgd.py): the operator reads its
cluster's defaults once, at start (`--pod-defaults` / `WINGSMITH_OPERATOR_POD_DEFAULTS`), fills
each render object's unset needs from them (`with_defaults`), and the renderer adds the needs
to each component, in whichever API version it writes:

- v1beta1: the `main` container's `env`, `volumeMounts` and `resources.requests`; the pod
  template's `volumes`, `tolerations`, `affinity`, `imagePullSecrets` and `priorityClassName`;
  the component's `sharedMemorySize`.
- v1alpha1: the service's `envs`, `volumeMounts` (naming a claim listed in the graph's `pvcs`
  with `create: false`), `resources.requests` (ephemeral storage as a custom resource) and
  `sharedMemory`; `extraPodSpec` for the rest.

The priority class goes on each pod rather than the graph's `priorityClassName`, which Dynamo's
webhook accepts only on the Grove path; a pod's own is honoured on every path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import yaml
from pydantic import ValidationError

from wingsmith.domain.pods import (
    HF_HOME,
    NodeRequirement,
    PodNeeds,
    Resources,
    RouterMode,
    Toleration,
)

T = TypeVar("T")

CACHE_VOLUME: Final = "model-cache"  # the v1beta1 pod volume holding the model cache
ENGINE_ROLES: Final = frozenset({"worker", "prefill", "decode"})
_NUMBER = re.compile(r"^[0-9]*\.?[0-9]*")  # a quantity's number, before its suffix


# --- a cluster's defaults ----------------------------------------------------------------------


def parse_defaults(text: str, source: str) -> PodNeeds:
    """A cluster's pod defaults from YAML or JSON (the `PodNeeds` shape); an error names the
    file and each offending field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: neither JSON nor YAML: {e}") from None
    if data is None:
        return PodNeeds()
    try:
        return PodNeeds.model_validate(data)
    except ValidationError as e:
        problems = [
            f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: "
            + err["msg"].removeprefix("Value error, ")
            for err in e.errors()
        ]
        raise ValueError(f"{source}: {'; '.join(problems)}") from None


def merge(own: PodNeeds | None, defaults: PodNeeds | None) -> PodNeeds | None:
    """The workload's needs, what it leaves unset taken from the defaults. Variables merge by
    name (plain and secret alike: the workload's of a name replaces the default's of it), as do
    the resource requests; anything else the workload gives replaces the default whole. A model
    cache and `HF_HOME` set on different sides: the workload's side wins."""
    if defaults is None:
        return own
    if own is None:
        return defaults
    named = {e.name for e in own.env} | {e.name for e in own.secret_env}
    if own.model_cache is not None:
        named.add(HF_HOME)
    model_cache = own.model_cache
    if model_cache is None and HF_HOME not in named:
        model_cache = defaults.model_cache
    return PodNeeds(
        env=tuple(e for e in defaults.env if e.name not in named) + own.env,
        secret_env=tuple(e for e in defaults.secret_env if e.name not in named) + own.secret_env,
        model_cache=model_cache,
        shared_memory=_first(own.shared_memory, defaults.shared_memory),
        resources=_resources(own.resources, defaults.resources),
        tolerations=_first(own.tolerations, defaults.tolerations),
        node_affinity=_first(own.node_affinity, defaults.node_affinity),
        image_pull_secrets=_first(own.image_pull_secrets, defaults.image_pull_secrets),
        priority_class=_first(own.priority_class, defaults.priority_class),
        frontend_replicas=_first(own.frontend_replicas, defaults.frontend_replicas),
        router_mode=_first(own.router_mode, defaults.router_mode),
    )


def _first(own: T | None, default: T | None) -> T | None:
    return default if own is None else own


def _resources(own: Resources | None, defaults: Resources | None) -> Resources | None:
    if own is None or defaults is None:
        return own or defaults
    return Resources(
        cpu=_first(own.cpu, defaults.cpu),
        memory=_first(own.memory, defaults.memory),
        ephemeral_storage=_first(own.ephemeral_storage, defaults.ephemeral_storage),
    )


def with_defaults(desired: Mapping[str, Any], defaults: PodNeeds | None) -> Mapping[str, Any]:
    """The render object with its serving config's pod needs completed from the cluster's
    defaults. Its digest is left as the plane computed it: defaults are the cluster's, not the
    workload's. An object whose needs cannot be read is left for the renderer to refuse."""
    if defaults is None or not isinstance(desired.get("serving"), dict):
        return desired
    serving = desired["serving"]
    try:
        own = None if serving.get("pod") is None else PodNeeds.model_validate(serving["pod"])
        merged = merge(own, defaults)
    except (ValidationError, ValueError):
        return desired
    pod = None if merged is None else merged.model_dump(mode="json", exclude_defaults=True)
    return {**desired, "serving": {**serving, "pod": pod or None}}


# --- rendering -----------------------------------------------------------------------------------


def frontend_args(needs: PodNeeds | None) -> tuple[str, ...]:
    """The frontend's flags: the router mode, when one is asked for."""
    mode: RouterMode | None = needs.router_mode if needs else None
    return () if mode is None else ("--router-mode", mode.value)


def frontend_replicas(needs: PodNeeds | None) -> int:
    """Frontends in front of the workers while any run."""
    return (needs.frontend_replicas if needs else None) or 1


def env(needs: PodNeeds) -> list[dict[str, Any]]:
    """The containers' environment: `HF_HOME` at the model cache, then plain, then secret."""
    out: list[dict[str, Any]] = []
    if needs.model_cache is not None:
        out.append({"name": HF_HOME, "value": needs.model_cache.mount_path})
    out.extend({"name": e.name, "value": e.value} for e in needs.env)
    out.extend(
        {"name": e.name, "valueFrom": {"secretKeyRef": {"name": e.secret, "key": e.key}}}
        for e in needs.secret_env
    )
    return out


def requests(needs: PodNeeds) -> dict[str, str]:
    """CPU, memory and ephemeral storage requests, as Kubernetes names them."""
    r = needs.resources or Resources()
    named = {"cpu": r.cpu, "memory": r.memory, "ephemeral-storage": r.ephemeral_storage}
    return {name: value for name, value in named.items() if value is not None}


def pod_spec(needs: PodNeeds) -> dict[str, Any]:
    """Where and how the pods are scheduled: PodSpec fields, the same in both API versions."""
    out: dict[str, Any] = {}
    if needs.tolerations is not None:
        out["tolerations"] = [_toleration(t) for t in needs.tolerations]
    if needs.node_affinity is not None:
        terms = [
            {"matchExpressions": [_requirement(r) for r in term.match_expressions]}
            for term in needs.node_affinity
        ]
        out["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    if needs.image_pull_secrets is not None:
        out["imagePullSecrets"] = [{"name": name} for name in needs.image_pull_secrets]
    if needs.priority_class is not None:
        out["priorityClassName"] = needs.priority_class
    return out


def _toleration(t: Toleration) -> dict[str, Any]:
    out: dict[str, Any] = {} if t.key is None else {"key": t.key}
    out["operator"] = t.operator.value
    if t.value:
        out["value"] = t.value
    if t.effect is not None:
        out["effect"] = t.effect.value
    if t.toleration_seconds is not None:
        out["tolerationSeconds"] = t.toleration_seconds
    return out


def _requirement(r: NodeRequirement) -> dict[str, Any]:
    out: dict[str, Any] = {"key": r.key, "operator": r.operator.value}
    if r.values:
        out["values"] = list(r.values)
    return out


def add_to_component_v1beta1(component: dict[str, Any], needs: PodNeeds | None) -> None:
    """Write the needs into a rendered v1beta1 component (its `main` container first)."""
    if needs is None:
        return
    engine = component["type"] in ENGINE_ROLES
    if engine and needs.shared_memory is not None:
        component["sharedMemorySize"] = needs.shared_memory
    spec = component["podTemplate"]["spec"]
    container = spec["containers"][0]
    if variables := env(needs):
        container["env"] = variables
    if needs.model_cache is not None:
        container["volumeMounts"] = [
            {"name": CACHE_VOLUME, "mountPath": needs.model_cache.mount_path}
        ]
        spec["volumes"] = [
            {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": needs.model_cache.claim}}
        ]
    if engine and (asked := requests(needs)):
        resources = container.setdefault("resources", {})
        resources["requests"] = asked | resources.get("requests", {})
    spec.update(pod_spec(needs))


def add_to_service_v1alpha1(service: dict[str, Any], needs: PodNeeds | None) -> None:
    """Write the needs into a rendered v1alpha1 service, in Dynamo's own fields where it has
    them."""
    if needs is None:
        return
    engine = service["componentType"] == "worker"
    if variables := env(needs):
        service["envs"] = variables
    if needs.model_cache is not None:
        mount = {"name": needs.model_cache.claim, "mountPoint": needs.model_cache.mount_path}
        service["volumeMounts"] = [mount]
    if engine and needs.shared_memory is not None:
        off = _is_zero(needs.shared_memory)  # v1alpha1 has no "0": it turns it off instead
        service["sharedMemory"] = {"disabled": True} if off else {"size": needs.shared_memory}
    if engine and (asked := requests(needs)):
        resources = service.setdefault("resources", {})
        own = {k: v for k, v in asked.items() if k in ("cpu", "memory")}
        custom = {k: v for k, v in asked.items() if k not in own}
        resources["requests"] = (
            own | ({"custom": custom} if custom else {}) | resources.get("requests", {})
        )
    service.setdefault("extraPodSpec", {}).update(pod_spec(needs))


def _is_zero(quantity: str) -> bool:
    match = _NUMBER.match(quantity)
    return match is not None and float(match.group() or "1") == 0


def add_to_spec_v1alpha1(spec: dict[str, Any], needs: PodNeeds | None) -> None:
    """A v1alpha1 graph lists the claims its services mount; Wingsmith's exists already."""
    if needs is not None and needs.model_cache is not None:
        spec["pvcs"] = [{"name": needs.model_cache.claim, "create": False}]
