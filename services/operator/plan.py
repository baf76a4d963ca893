"""Reconcile plans: what to write to a cluster so that it runs a deployment's render object.

Pure: a plan compares the render object with the DynamoGraphDeployment the cluster holds (none,
one Wingsmith rendered, or one adopted from a running model) and names one write, or none and
why not. `KubeBackend.execute` is what performs it, or refuses to.

Writes are server-side applies as the `wingsmith` field manager: the body is what Wingsmith
declares, fields it stops declaring are removed, and fields others set stay. A rendered DGD is
applied whole, with `force` (Wingsmith is its only author: a field someone else took is taken
back). An adopted DGD is applied with only what the plane declares of it: its workers' replicas
and, once rewritten, the engine's command line; a worker with `scalingAdapter` is scaled through
its DynamoGraphDeploymentScalingAdapter instead, the only writer the webhook lets change it.
What Dynamo's webhook forbids changing in place (the set of components, `backendFramework`,
single-node against multinode) is a `replace`: delete, then create. A same-named DGD that
Wingsmith neither rendered nor adopted is never touched: that is a permanent refusal.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from wingsmith.services.operator.dgd import ANNOTATION_DEPLOYMENT_ID, render_dgd
from wingsmith.services.operator.inspect import Inspection, inspect_dgd, is_rendered_by_wingsmith

Obj = dict[str, Any]
Verb = Literal["create", "apply", "patch", "replace", "delete"]

APPLIED_ANNOTATION = "wingsmith.dev/applied"  # the digest of the body last applied
FOREIGN = "a DynamoGraphDeployment of this name exists that Wingsmith did not render or adopt"


class Action(NamedTuple):
    """One write to the cluster, or none (`verb` None) with the reason why not. `refused`: no
    write, because the cluster holds something the plane must not touch (permanent)."""

    verb: Verb | None
    namespace: str
    name: str
    version: str  # the DGD API version, e.g. v1beta1
    body: Obj | None
    why: str
    refused: bool = False
    # DynamoGraphDeploymentScalingAdapters to scale: (name, replicas), after `body` is applied
    scales: tuple[tuple[str, int], ...] = ()


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
    wanted = stamped(render_dgd(desired, namespace=namespace, api_version=api_version))
    name = wanted["metadata"]["name"]
    if current is None:
        return Action("create", namespace, name, version, wanted, "no DynamoGraphDeployment yet")
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    if not is_rendered_by_wingsmith(current) or annotations.get(ANNOTATION_DEPLOYMENT_ID) not in (
        None,
        deployment_id,
    ):
        return Action(None, namespace, name, version, None, FOREIGN, refused=True)
    if why := immutable_change(current, wanted):
        return Action("replace", namespace, name, version, wanted, why)
    # a DGD applied from another render may hold fields this one drops; one that carries no
    # digest (written before digests were) is compared field by field only
    applied = annotations.get(APPLIED_ANNOTATION)
    ours = {"metadata": _ours(wanted["metadata"]), "spec": wanted["spec"]}
    ours["metadata"]["annotations"] = {
        k: v for k, v in ours["metadata"]["annotations"].items() if k != APPLIED_ANNOTATION
    }
    digest = wanted["metadata"]["annotations"][APPLIED_ANNOTATION]
    if applied in (None, digest) and _covers(current, ours):
        return Action(None, namespace, name, version, None, "up to date")
    return Action("apply", namespace, name, version, wanted, "it differs from the desired state")


def stamped(body: Obj) -> Obj:
    """The body with the digest of itself: a DGD whose digest differs was applied from another
    render, whose fields that this one no longer has the apply removes."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    body = copy.deepcopy(body)
    body["metadata"].setdefault("annotations", {})[APPLIED_ANNOTATION] = digest
    return body


def immutable_change(current: Obj, wanted: Obj) -> str | None:
    """What Dynamo's validating webhook refuses to change in place, if `wanted` changes it:
    the set of components, `backendFramework`, a component's single-node or multinode."""
    before, after = components(current.get("spec") or {}), components(wanted.get("spec") or {})
    if {n.lower() for n in before} != {n.lower() for n in after}:
        return "its set of components changes"
    was, becomes = (current.get("spec") or {}), (wanted.get("spec") or {})
    if was.get("backendFramework") != becomes.get("backendFramework"):
        return "its backendFramework changes"
    lowered = {n.lower(): c for n, c in before.items()}
    for name, component in after.items():
        if _multinode(lowered.get(name.lower()) or {}) != _multinode(component):
            return f"component {name} changes between single-node and multinode"
    return None


def _multinode(component: Obj) -> bool:
    return int((component.get("multinode") or {}).get("nodeCount") or 1) > 1


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
    engines = {c.name for c in inspection.workers}  # a legacy `main` frontend is none
    workers = {name: c for name, c in components(spec).items() if name in engines}
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
    scales = tuple(
        (adapter_name(ref["name"], name), int(c.get("replicas", 1)))
        for name, c in workers.items()
        if _scaled_by_adapter(c)
    )
    body = _adopted_body(current, workers, ratio, rewrite=flags != _CANNOT_REWRITE)
    verb: Verb = "apply" if body is not None else "patch"
    why = "; ".join(changed)
    return Action(verb, ref["namespace"], ref["name"], version, body, why, scales=scales)


def adapter_name(dgd_name: str, component: str) -> str:
    """The DynamoGraphDeploymentScalingAdapter Dynamo creates for a component."""
    return f"{dgd_name}-{component.lower()}"


def _scaled_by_adapter(component: Obj) -> bool:
    """v1beta1 opts in with `scalingAdapter` present (even `{}`); v1alpha1 with `enabled`."""
    adapter = component.get("scalingAdapter")
    if not isinstance(adapter, dict):
        return False
    return bool(adapter.get("enabled")) if "componentType" in component else True


def _adopted_body(
    current: Obj, workers: Mapping[str, Obj], ratio: Mapping[str, int], *, rewrite: bool
) -> Obj | None:
    """What the plane declares of an adopted DGD, as an apply body: every worker's replicas
    (but those a scaling adapter scales), the single worker's main container's command line
    (the one the plane rewrites), and the proportions it was adopted with. None when there is
    nothing for the DGD itself. Fields the body leaves out stay as their owners set them."""
    declared = {n: c for n, c in workers.items() if not _scaled_by_adapter(c)}
    if not declared:
        return None
    meta = current.get("metadata") or {}
    v1beta1 = isinstance((current.get("spec") or {}).get("components"), list)
    entries: dict[str, Obj] = {}
    for name, component in declared.items():
        entry: Obj = {"replicas": int(component.get("replicas", 1))}
        container = _main_container(component) if len(workers) == 1 and rewrite else None
        if container is not None:
            line = {k: container[k] for k in ("command", "args") if k in container}
            if v1beta1:
                entry["podTemplate"] = {"spec": {"containers": [{"name": "main", **line}]}}
            else:
                entry["extraPodSpec"] = {"mainContainer": line}
        entries[name] = entry
    spec: Obj = (
        {"components": [{"name": n, **e} for n, e in entries.items()]}
        if v1beta1
        else {"services": entries}
    )
    return {
        "apiVersion": current.get("apiVersion", "nvidia.com/v1beta1"),
        "kind": "DynamoGraphDeployment",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            # the proportions it was adopted with, so that scaling to zero and back keeps them
            "annotations": {RATIO_ANNOTATION: json.dumps(dict(ratio), sort_keys=True)},
        },
        "spec": spec,
    }


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
