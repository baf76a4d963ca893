"""Reconcile plans: what to write to a cluster so that it runs a deployment's render object.

Pure: a plan compares the render object with the DynamoGraphDeployment the cluster holds (none,
one Wingsmith rendered, or one adopted from a running model) and names one write, or none and
why not. `KubeBackend.execute` is what performs it, or refuses to.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from wingsmith.domain.discovery import WORKER_ROLES
from wingsmith.services.operator.dgd import ANNOTATION_DEPLOYMENT_ID, render_dgd
from wingsmith.services.operator.inspect import Inspection, inspect_dgd

Obj = dict[str, Any]
Verb = Literal["create", "patch", "delete"]


class Action(NamedTuple):
    """One write to the cluster, or none (`verb` None) with the reason why not."""

    verb: Verb | None
    namespace: str
    name: str
    version: str  # the DGD API version, e.g. v1beta1
    body: Obj | None
    why: str


# -- planning (pure) -----------------------------------------------------------------------


def plan(
    deployment_id: str,
    desired: Mapping[str, Any] | None,
    current: Obj | None,
    *,
    namespace: str,
    api_version: str,
    previous: Mapping[str, Any] | None = None,
) -> Action:
    """What to write so that the cluster runs `desired` (None: the deployment was removed, and
    `previous` is what it was)."""
    version = api_version.split("/")[1]
    if desired is None:
        was = previous or {}
        name = was.get("workload_id", deployment_id.rsplit("--", 1)[0])
        annotations = ((current or {}).get("metadata") or {}).get("annotations") or {}
        if annotations.get(ANNOTATION_DEPLOYMENT_ID) != deployment_id or was.get("adopted"):
            return Action(None, namespace, name, version, None, "nothing of ours to remove")
        return Action("delete", namespace, name, version, None, "the deployment was removed")
    if desired.get("adopted"):
        return _plan_adopted(desired, current)
    wanted = render_dgd(desired, namespace=namespace, api_version=api_version)
    name = wanted["metadata"]["name"]
    if current is None:
        return Action("create", namespace, name, version, wanted, "no DynamoGraphDeployment yet")
    if _covers(current, {"metadata": _ours(wanted["metadata"]), "spec": wanted["spec"]}):
        return Action(None, namespace, name, version, None, "up to date")
    patch = {"metadata": _ours(wanted["metadata"]), "spec": wanted["spec"]}
    return Action("patch", namespace, name, version, patch, "it differs from the desired state")


def _plan_adopted(desired: Mapping[str, Any], current: Obj | None) -> Action:
    """An adopted DGD keeps its own manifest. Only what the plane declares changes: the
    workers' replicas, and the engine's flags when `engine_args` differ from the flags it runs
    with. A promotion whose engine_args equal those changes nothing that restarts a pod."""
    ref = desired["adopted"]
    version = (current or {}).get("apiVersion", "nvidia.com/v1beta1").split("/")[1]
    if current is None:
        return Action(None, ref["namespace"], ref["name"], version, None, "not on the cluster")
    try:
        inspection = inspect_dgd(current)
    except ValueError as e:
        return Action(None, ref["namespace"], ref["name"], version, None, f"unreadable: {e}")
    spec = copy.deepcopy(current.get("spec") or {})
    workers = {name: c for name, c in components(spec).items() if role(c) in WORKER_ROLES}
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    ratio = _ratio(annotations, workers)
    changed = []
    primary = inspection.primary
    if _rescale(workers, ratio, primary.name if primary else None, desired["replicas"]):
        changed.append("workers rescaled")
    flags = _flags_change(inspection, workers, list(desired.get("engine_args") or ()))
    if flags:
        changed.append(flags)
    if not changed or changed == [_CANNOT_REWRITE]:
        why = changed[0] if changed else "up to date"
        return Action(None, ref["namespace"], ref["name"], version, None, why)
    key = "components" if "components" in spec else "services"
    patch: Obj = {"spec": {key: spec[key]}}
    if RATIO_ANNOTATION not in annotations:  # remember the proportions it was adopted with
        patch["metadata"] = {"annotations": {RATIO_ANNOTATION: json.dumps(ratio, sort_keys=True)}}
    return Action("patch", ref["namespace"], ref["name"], version, patch, "; ".join(changed))


_CANNOT_REWRITE = "engine flags differ, but the manifest's command line cannot be rewritten"


RATIO_ANNOTATION = "wingsmith.dev/adopted-replicas"


def _ratio(annotations: Mapping[str, str], workers: Mapping[str, Obj]) -> dict[str, int]:
    """Each worker's replicas as adopted: recorded on the DGD the first time it is scaled, so
    scaling down (even to zero) and up again comes back to the same proportions."""
    try:
        recorded = json.loads(annotations.get(RATIO_ANNOTATION, "null"))
    except json.JSONDecodeError:
        recorded = None
    if isinstance(recorded, dict):
        return {str(k): int(v) for k, v in recorded.items()}
    return {name: int(c.get("replicas", 1)) for name, c in workers.items()}


def _rescale(
    workers: Mapping[str, Obj], ratio: Mapping[str, int], primary: str | None, replicas: int
) -> bool:
    """Scale the workers so that the primary one (the deployment's replicas) has `replicas`,
    the others in their adopted proportion to it (prefill to decode, say)."""
    base = ratio.get(primary or "", 0)
    changed = False
    for name, component in workers.items():
        share = ratio.get(name, 0)
        wanted = round(share * replicas / base) if base else replicas
        wanted = max(wanted, 1) if replicas else 0
        if wanted != int(component.get("replicas", 1)):
            component["replicas"], changed = wanted, True
    return changed


def _flags_change(
    inspection: Inspection, workers: Mapping[str, Obj], engine_args: list[str]
) -> str | None:
    """engine_args are the primary worker's flags: rewrite them when they differ from what it
    runs. What was done, or why it could not be; None when they are equal."""
    primary = inspection.primary
    if primary is None or list(primary.imported_args) == engine_args:
        return None
    if len(workers) != 1 or primary.module is None:
        return _CANNOT_REWRITE  # several workers (prefill and decode) run different flags
    container = _main_container(next(iter(workers.values())))
    if container is None or not _set_flags(container, primary.module, engine_args):
        return _CANNOT_REWRITE
    return "engine flags set to engine_args"


def _main_container(component: Obj) -> Obj | None:
    if isinstance(component.get("extraPodSpec"), dict):  # v1alpha1
        main = component["extraPodSpec"].get("mainContainer")
        return main if isinstance(main, dict) else None
    containers = ((component.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
    return next((c for c in containers if isinstance(c, dict) and c.get("name") == "main"), None)


def _set_flags(container: Obj, module: str, flags: list[str]) -> bool:
    """`python3 -m <module>` in the command with flags in args, or the module in args: set the
    flags. A shell command line is not rewritten."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if module in command and command[command.index(module) - 1 : command.index(module)] == ["-m"]:
        container["command"] = command[: command.index(module) + 1]
        container["args"] = flags
        return True
    if args[:2] == ["-m", module]:
        container["args"] = ["-m", module, *flags]
        return True
    return False


def role(component: Obj) -> str | None:
    role = (
        component.get("type") or component.get("subComponentType") or component.get("componentType")
    )
    return str(role) if role else None


def components(spec: Obj) -> dict[str, Obj]:
    """The graph's components by name: v1beta1 lists them, v1alpha1 maps names to them."""
    if isinstance(spec.get("components"), list):
        return {str(c.get("name")): c for c in spec["components"] if isinstance(c, dict)}
    services = spec.get("services")
    if not isinstance(services, dict):
        return {}
    return {str(name): s for name, s in services.items() if isinstance(s, dict)}


def _ours(metadata: Obj) -> Obj:
    return {"labels": metadata.get("labels", {}), "annotations": metadata.get("annotations", {})}


def _covers(current: Any, wanted: Any) -> bool:
    """Whether `current` holds everything `wanted` says: the API server and Dynamo's webhooks
    add defaults, which are no reason to write again."""
    if isinstance(wanted, dict):
        return isinstance(current, dict) and all(
            _covers(current.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(current, list)
            and len(current) == len(wanted)
            and all(_covers(c, w) for c, w in zip(current, wanted, strict=True))
        )
    return bool(current == wanted)
