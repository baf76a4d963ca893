"""Shared Kubernetes test fixtures: a kmock API emulator served over real HTTP, a `Kube` pointed
at it, object builders, and helpers that change the emulated cluster and read its request log.

kmock stores objects and streams watch events, but it ignores selectors and never answers 410;
tests that need those script kmock's responses themselves. `DynamoEmulator` adds what a real
API server does: a resourceVersion on every write (etcd's revision, in the order watches see
them, and a list's own), replacements (PUT) with optimistic concurrency; and what it does with
Dynamo's webhooks to DGDs: server-side apply (each field manager's fields; fields a manager
stops applying are removed) and the validating webhook's refusals of changes it forbids in
place, answered 422 with a Status.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml

from wingsmith.adapters.kube import RESOURCES, Change, Informer, Kind, Kube

Obj = dict[str, Any]
NAMESPACE = "wingsmith"

# kmock's resource keys for the kinds the adapter knows, e.g. "nvidia.com/v1beta1/..."
RESOURCE_KEYS: dict[Kind, str] = {
    kind: f"{r.group}/{r.version}/{r.plural}" if r.group else f"{r.version}/{r.plural}"
    for kind, r in RESOURCES.items()
}
KIND_NAMES: dict[Kind, str] = {
    "dgd/v1beta1": "DynamoGraphDeployment",
    "dgd/v1alpha1": "DynamoGraphDeployment",
    "pod": "Pod",
    "node": "Node",
    "lease": "Lease",
    "event": "Event",
    "resourceclaim/v1": "ResourceClaim",
    "resourceclaim/v1beta2": "ResourceClaim",
    "resourceclaim/v1beta1": "ResourceClaim",
    "resourceslice/v1": "ResourceSlice",
    "resourceslice/v1beta2": "ResourceSlice",
    "resourceslice/v1beta1": "ResourceSlice",
}


APPLY_PATCH = "application/apply-patch+yaml"
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
WEBHOOK = 'admission webhook "vdynamographdeployment.kb.io" denied the request'


def resource(kind: Kind) -> kmock.resource:
    """kmock's filter for one kind, e.g. `emulator[kmock.action.WATCH, resource("pod")]`."""
    r = RESOURCES[kind]
    return kmock.resource(r.group, r.version, r.plural)


@attrs.define(kw_only=True)
class DynamoEmulator(kmock.KubernetesEmulator):
    """kmock with what a real API server does and kmock does not (a resourceVersion on every
    write and list; replacements (PUT), refused 409 when made as of a stale resourceVersion),
    and for DGDs server-side apply and Dynamo's validating webhook. `max_name`: the longest DGD
    name admitted (a real API server: 253)."""

    max_name: int = 253
    revisions: bool = True  # False: kmock's own way, for tests that script resourceVersions
    applied: dict[tuple[str, str, str, str], Obj] = attrs.field(factory=dict, init=False)
    _revision: int = attrs.field(default=0, init=False)  # the last one given
    _writes: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if not self.revisions or request.resource is None or request.method.value not in WRITES:
            return await self._serve(request)
        async with self._writes:  # one write at a time: watches see revisions in order
            if (stale := self._stale(request)) is not None:
                return aiohttp.web.json_response(stale, status=409)
            self._revision += 1
            revision = str(self._revision)
            if request.method.value == "DELETE":
                self._stamp_stored(request, revision)
                return await self._serve(request)
            if not isinstance(sent := request.data, dict):
                return await self._serve(request)
            # the object written carries it; the request log keeps what the client sent
            # (kmock's requests are frozen, and a copy would lose how kmock routes them)
            stamped = copy.deepcopy(sent)
            stamped.setdefault("metadata", {})["resourceVersion"] = revision
            object.__setattr__(request, "data", stamped)
            try:
                return await self._serve(request)
            finally:
                object.__setattr__(request, "data", sent)

    async def _serve_list(self, request: kmock.Request) -> Any:
        """A list is as of the last revision, as a real API server's is."""
        listing: Any = await super()._serve_list(request)
        if self.revisions:
            listing["metadata"]["resourceVersion"] = str(self._revision)
        return listing

    def _stale(self, request: kmock.Request) -> Obj | None:
        """A replacement (PUT) as of a resourceVersion the object no longer has: 409, as a
        real API server answers, so that of two writers who read the same version one wins."""
        sent = request.data if isinstance(request.data, dict) else {}
        expected = (sent.get("metadata") or {}).get("resourceVersion")
        if request.method.value != "PUT" or not expected or request.name is None:
            return None
        assert request.resource is not None
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        current = (self._objects[key].raw.get("metadata") or {}).get("resourceVersion")
        if current == expected:
            return None
        return status_body(
            409,
            "Conflict",
            f"Operation cannot be fulfilled on {request.resource.plural} {request.name!r}: the "
            "object has been modified; please apply your changes to the latest version",
        )

    def _stamp_stored(self, request: kmock.Request, revision: str) -> None:
        """The next resourceVersion, as etcd's revision on every write (kmock gives none)."""
        assert request.resource is not None and request.name is not None
        key = (request.resource, request.namespace, request.name)
        if key in self._objects and not self._objects[key].deleted:
            self._objects[key].patch({"metadata": {"resourceVersion": revision}})

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res, method = request.resource, request.method.value
        dgd = res is not None and res.plural == "dynamographdeployments" and not request.subresource
        writes = dgd and method in {"POST", "PATCH", "PUT"}
        if writes and (refusal := self._admit(request)) is not None:
            return aiohttp.web.json_response(refusal, status=refusal["code"])
        if method == "PUT" and res is not None and request.name and not request.subresource:
            return await self._replace(request)
        if dgd and method == "PATCH" and request.headers.get("Content-Type") == APPLY_PATCH:
            return await self._apply(request)
        return await super()._handle(request)

    async def _replace(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """A replacement (PUT), which kmock does not serve: the object becomes the body."""
        assert request.resource is not None and request.name is not None
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                missing = f"{request.resource.plural} {request.name!r} not found"
                return aiohttp.web.json_response(status_body(404, "NotFound", missing), status=404)
            self._objects[key].clear()
            self._objects[key].patch(request.data)
            raw = dict(self._objects[key].raw)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)

    def _current(self, request: kmock.Request, name: str) -> Obj | None:
        assert request.resource is not None
        key = (request.resource, request.namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(dict(self._objects[key].raw))

    def _admit(self, request: kmock.Request) -> Obj | None:
        """What the API server and Dynamo's validating webhook refuse, as a 422 Status."""
        body = request.data if isinstance(request.data, dict) else {}
        name = request.name or (body.get("metadata") or {}).get("name") or ""
        if len(name) > self.max_name:
            return status_body(
                422,
                "Invalid",
                f"DynamoGraphDeployment.nvidia.com {name!r} is invalid: metadata.name: Invalid "
                f"value: must be no more than {self.max_name} characters",
            )
        current = self._current(request, name) if request.method.value != "POST" else None
        if current is None:
            return None
        after = (
            ssa(current, {}, body)
            if request.headers.get("Content-Type") == APPLY_PATCH
            else merge_patch(current, body)
        )
        if why := forbidden_change(current, after):
            return status_body(422, "Forbidden", f"{WEBHOOK}: {why}")
        return None

    async def _apply(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Server-side apply by `fieldManager`: creates the object when absent; otherwise what
        the manager applied before and no longer applies goes, and the body is merged in."""
        assert request.resource is not None and request.name is not None
        manager = request.params.get("fieldManager", "")
        key = (request.resource, request.namespace, request.name)
        mine = (str(request.resource), request.namespace or "", request.name, manager)
        async with self._lock:
            current = self._current(request, request.name)
            if current is None:
                self._objects[key] = request.data
                event = "ADDED"
            else:
                new = ssa(current, self.applied.get(mine, {}), request.data)
                self._objects[key].clear()
                self._objects[key].patch(new)
                event = "MODIFIED"
            self.applied[mine] = copy.deepcopy(request.data)
            raw = dict(self._objects[key].raw)
            await self._buses[request.resource].put({"type": event, "object": raw})
        # the answer: a test's scripted reaction if one matches (the object changed anyway, as
        # kmock's own writes do), else the object; kmock's merge of the body is skipped
        return await super(kmock.KubernetesEmulator, self)._handle(request)


def status_body(code: int, reason: str, message: str = "") -> Obj:
    """A Kubernetes Status, as an API server answers an error."""
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _components(spec: Obj) -> dict[str, Obj]:
    if isinstance(spec.get("components"), list):
        return {str(c["name"]).lower(): c for c in spec["components"]}
    return {str(n).lower(): c for n, c in (spec.get("services") or {}).items()}


def forbidden_change(before: Obj, after: Obj) -> str | None:
    """Dynamo's update rules: the set of components, backendFramework and single-node against
    multinode are fixed once created."""
    old, new = _components(before.get("spec") or {}), _components(after.get("spec") or {})
    if set(old) != set(new):
        return "spec.components: Forbidden: components cannot be added or removed after creation"
    if (before.get("spec") or {}).get("backendFramework") != (after.get("spec") or {}).get(
        "backendFramework"
    ):
        return "spec.backendFramework: Forbidden: field is immutable"
    for name, c in new.items():
        nodes = (c.get("multinode") or {}).get("nodeCount", 1) > 1
        if nodes != ((old[name].get("multinode") or {}).get("nodeCount", 1) > 1):
            return f"spec.components[{name}]: Forbidden: cannot switch single-node and multinode"
    return None


def _is_list_map(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value)


def ssa(current: Obj, previous: Obj, body: Obj) -> Obj:
    """Server-side apply, simplified: what `previous` (the manager's last apply) has and `body`
    has not is removed, then `body` is merged in; lists of named items merge by name."""
    merged: Obj = _merge(_prune(copy.deepcopy(current), previous, body), body)
    return merged


def _prune(current: Any, previous: Any, body: Any) -> Any:
    if isinstance(current, dict) and isinstance(previous, dict):
        body = body if isinstance(body, dict) else {}
        for key, value in previous.items():
            if key not in body:
                current.pop(key, None)
            elif key in current:
                current[key] = _prune(current[key], value, body[key])
        return current
    if _is_list_map(current) and _is_list_map(previous):
        wanted = {i["name"]: i for i in body} if _is_list_map(body) else {}
        was = {i["name"]: i for i in previous}
        return [
            _prune(i, was[i["name"]], wanted[i["name"]]) if i["name"] in was else i
            for i in current
            if i["name"] in wanted or i["name"] not in was
        ]
    return current


def _merge(current: Any, body: Any) -> Any:
    if isinstance(current, dict) and isinstance(body, dict):
        return {**current, **{k: _merge(current.get(k), v) for k, v in body.items()}}
    if _is_list_map(current) and _is_list_map(body):
        merged = {i["name"]: i for i in current}
        for item in body:
            merged[item["name"]] = _merge(merged.get(item["name"]), item)
        return list(merged.values())
    return copy.deepcopy(body)


def merge_patch(current: Obj, patch: Obj) -> Obj:
    """A JSON merge patch (RFC 7386)."""
    merged = copy.deepcopy(current)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = value
    return merged


@contextlib.asynccontextmanager
async def kube_emulator(
    kinds: Iterable[Kind] = tuple(RESOURCES), *, revisions: bool = True, **kube_options: Any
) -> AsyncIterator[tuple[DynamoEmulator, kmock.Server, Kube]]:
    """A kmock emulator serving `kinds` (and DGD scaling adapters where it serves DGDs) over
    HTTP and a connected `Kube`, with a short backoff so that retries do not slow tests down
    (override with `backoff=(first, cap)`)."""
    kube_options.setdefault("backoff", (0.01, 0.05))
    async with DynamoEmulator(revisions=revisions) as emulator, kmock.Server(emulator) as server:
        for kind in kinds:
            r = RESOURCES[kind]
            info = kmock.ResourceInfo(kind=KIND_NAMES[kind], namespaced=r.namespaced)
            emulator.resources[RESOURCE_KEYS[kind]] = info
            if kind.startswith("dgd/"):
                adapters = f"nvidia.com/{r.version}/dynamographdeploymentscalingadapters"
                emulator.resources[adapters] = kmock.ResourceInfo(
                    kind="DynamoGraphDeploymentScalingAdapter", namespaced=True
                )
        async with Kube(host=str(server.url), **kube_options) as kube:
            yield emulator, server, kube


# --- object builders -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_operator(
    client: Any, backend: Any, *, read_only: bool = False
) -> AsyncIterator[None]:
    """The operator for cluster `east` on `backend`, running until the block ends."""
    from wingsmith.services.operator.runtime import OperatorOptions, run_operator

    options = OperatorOptions(cluster_id="east", read_only=read_only, heartbeat_every=0.5)
    task = asyncio.create_task(run_operator(client, backend, options))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig whose current context reaches `server_url` with a bearer token."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "emu", "cluster": {"server": server_url.rstrip("/")}}],
                "users": [{"name": "me", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "test", "context": {"cluster": "emu", "user": "me"}}],
            }
        )
    )
    return path


def dgd(
    name: str,
    namespace: str = NAMESPACE,
    *,
    labels: dict[str, str] | None = None,
    spec: Obj | None = None,
    version: str = "v1beta1",
) -> Obj:
    default_spec: Obj = (
        {"components": [{"name": "worker", "type": "worker", "replicas": 1}]}
        if version == "v1beta1"
        else {"services": {"worker": {"componentType": "worker", "replicas": 1}}}
    )
    return {
        "apiVersion": f"nvidia.com/{version}",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec if spec is not None else default_spec,
    }


def pod(
    name: str,
    namespace: str = NAMESPACE,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    phase: str = "Running",
    ready: bool = True,
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node(
    name: str, *, product: str = "NVIDIA-H100-80GB-HBM3", gpus: int = 8, ready: bool = True
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


# --- changing the emulated cluster over HTTP (so that open watches see it) -------------------


def collection_path(kind: Kind, namespace: str | None) -> str:
    r = RESOURCES[kind]
    base = f"/apis/{r.group}/{r.version}" if r.group else f"/api/{r.version}"
    scope = f"/namespaces/{namespace}" if r.namespaced and namespace else ""
    return f"{base}{scope}/{r.plural}"


def object_path(kind: Kind, obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{collection_path(kind, meta.get('namespace'))}/{meta['name']}"


async def cluster_create(emulator: kmock.KubernetesEmulator, kind: Kind, obj: Obj) -> None:
    """Create an object the way another client would (not through the adapter under test)."""
    path = collection_path(kind, obj["metadata"].get("namespace"))
    async with emulator.post(path, json=obj) as resp:
        assert resp.status < 300, await resp.text()


async def cluster_patch(
    emulator: kmock.KubernetesEmulator, kind: Kind, obj: Obj, patch: Obj
) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with emulator.patch(object_path(kind, obj), json=patch, headers=headers) as resp:
        assert resp.status < 300, await resp.text()


async def cluster_delete(emulator: kmock.KubernetesEmulator, kind: Kind, obj: Obj) -> None:
    async with emulator.delete(object_path(kind, obj)) as resp:
        assert resp.status < 300, await resp.text()


# --- reading the request log -----------------------------------------------------------------


def from_adapter(request: kmock.Request) -> bool:
    """True for requests the code under test sent; the cluster_* helpers above go through
    kmock's own client, whose User-Agent says so."""
    return not request.headers.get("User-Agent", "").startswith("kmock/")


def requests(
    emulator: kmock.KubernetesEmulator, action: kmock.action, kind: Kind | None = None
) -> list[kmock.Request]:
    """The adapter's requests of one action (and kind), oldest first."""
    view = emulator[action] if kind is None else emulator[action, resource(kind)]
    return [r for r in view if from_adapter(r)]


def write_requests(emulator: kmock.KubernetesEmulator) -> list[kmock.Request]:
    """Every request the code under test sent that would change the cluster, whatever its
    kind: read-only code must leave this empty."""
    return [r for r in emulator if r.method.value in WRITES and from_adapter(r)]


def object_writes(emulator: kmock.KubernetesEmulator) -> list[kmock.Request]:
    """The adapter's writes to the cluster's objects: every write but the Events recording
    them."""
    return [r for r in write_requests(emulator) if r.resource != resource("event")]


def recorded_events(emulator: kmock.KubernetesEmulator) -> list[Obj]:
    """The Events the adapter recorded, oldest first."""
    return [r.data for r in requests(emulator, kmock.action.CREATE, "event")]


# --- consuming informers -----------------------------------------------------------------------


async def next_change(informer: Informer, timeout: float = 5.0) -> Change:
    """The next change; the timeout only guards against a hung test."""
    return await asyncio.wait_for(anext(informer), timeout)


async def until_synced(informer: Informer, timeout: float = 5.0) -> list[Change]:
    """Changes up to and excluding the next SYNCED marker, after the RELISTING one."""
    assert (await next_change(informer, timeout)).type == "RELISTING"
    changes: list[Change] = []
    while (change := await next_change(informer, timeout)).type != "SYNCED":
        changes.append(change)
    return changes


def names(changes: Iterable[Change]) -> list[tuple[str, str]]:
    """(type, name) pairs: short to compare in assertions."""
    return [(c.type, c.obj.get("metadata", {}).get("name", "")) for c in changes]


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition on the emulator's state; the timeout only guards against a hung test."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)
