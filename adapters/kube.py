"""Kubernetes: the one module that talks to an API server (through kubernetes_asyncio).

The operator needs three things from a cluster: read and write DynamoGraphDeployments, watch
DGDs, pods and nodes the way a client-go informer does, and clear errors it can act on. Objects
stay plain JSON dicts here; turning them into Wingsmith's own values happens elsewhere.

On a cluster that allocates devices with Dynamic Resource Allocation, ResourceClaims and
ResourceSlices can be watched too, in the version `served_dra` finds the cluster serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple, Self

import aiohttp
import tenacity
from kubernetes_asyncio import client, config

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Kind = Literal[
    "dgd/v1beta1",
    "dgd/v1alpha1",
    "pod",
    "node",
    "lease",
    "event",
    "resourceclaim/v1",
    "resourceclaim/v1beta2",
    "resourceclaim/v1beta1",
    "resourceslice/v1",
    "resourceslice/v1beta2",
    "resourceslice/v1beta1",
]
DGD_GROUP = "nvidia.com"
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply (JSON is YAML)
FIELD_MANAGER = "wingsmith"
DRA_GROUP = "resource.k8s.io"  # Dynamic Resource Allocation
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preferred first: GA since Kubernetes 1.34
_RETRYING = tenacity.AsyncRetrying()  # only to give tenacity's wait strategy a call state


class KubeError(Exception):
    """The API server refused a request (status is 0 when it could not be reached)."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def permanent(self) -> bool:
        """Whether sending the same request again would get the same answer: a refusal of what
        was sent (400 bad request, 403 forbidden, 404 no such namespace, 422 invalid: a
        validating webhook or the schema). A conflict (409), a timeout (408), throttling
        (429), a server error (5xx) or no answer at all (0) may pass on another try."""
        return 400 <= self.status < 500 and self.status not in {408, 409, 429}


class KubeNotFound(KubeError):
    """404 where "absent" cannot be answered with None or False (a patch, a list)."""


class KubeConflict(KubeError):
    """409: the object already exists, or was changed by someone else meanwhile."""


class KindNotServed(KubeNotFound):
    """The server does not serve this kind at all: for DGDs, the CRD (or version) is missing."""


class Change(NamedTuple):
    """One informer event. RELISTING carries an empty obj: a (re)list's changes follow, in key
    order rather than resourceVersion order, until SYNCED says the consumer's view is complete
    again. SYNCED's obj holds only `metadata.resourceVersion`: the list's, which the view is
    as of (higher than any of its objects' when one was deleted since they last changed).
    DENIED says the API server refuses this client the kind (401 or 403: its credentials or
    RBAC); its obj is the Status (`code`, `message`). The informer goes on trying; the next
    SYNCED says it was let in."""

    type: Literal["ADDED", "MODIFIED", "DELETED", "RELISTING", "SYNCED", "DENIED"]
    obj: Obj


@dataclass(frozen=True)
class _Resource:
    group: str
    version: str
    plural: str
    namespaced: bool = True


RESOURCES: dict[Kind, _Resource] = {
    "dgd/v1beta1": _Resource(DGD_GROUP, "v1beta1", DGD_PLURAL),
    "dgd/v1alpha1": _Resource(DGD_GROUP, "v1alpha1", DGD_PLURAL),
    "pod": _Resource("", "v1", "pods"),
    "node": _Resource("", "v1", "nodes", namespaced=False),
    "lease": _Resource("coordination.k8s.io", "v1", "leases"),
    "event": _Resource("", "v1", "events"),
    "resourceclaim/v1": _Resource(DRA_GROUP, "v1", "resourceclaims"),
    "resourceclaim/v1beta2": _Resource(DRA_GROUP, "v1beta2", "resourceclaims"),
    "resourceclaim/v1beta1": _Resource(DRA_GROUP, "v1beta1", "resourceclaims"),
    "resourceslice/v1": _Resource(DRA_GROUP, "v1", "resourceslices", namespaced=False),
    "resourceslice/v1beta2": _Resource(DRA_GROUP, "v1beta2", "resourceslices", namespaced=False),
    "resourceslice/v1beta1": _Resource(DRA_GROUP, "v1beta1", "resourceslices", namespaced=False),
}


@dataclass(frozen=True)
class DraKinds:
    """The Dynamic Resource Allocation kinds to watch, in the version a cluster serves."""

    version: str
    claims: Kind
    slices: Kind


DRA_KINDS: dict[str, DraKinds] = {
    "v1": DraKinds("v1", "resourceclaim/v1", "resourceslice/v1"),
    "v1beta2": DraKinds("v1beta2", "resourceclaim/v1beta2", "resourceslice/v1beta2"),
    "v1beta1": DraKinds("v1beta1", "resourceclaim/v1beta1", "resourceslice/v1beta1"),
}


class _ApiClient(client.ApiClient):
    """Sends boolean query parameters as `true`/`false`. The generated client sends Python's
    `True`: API servers parse either, but kmock (our test server) only knows `watch=true`."""

    def parameters_to_tuples(self, params: Any, collection_formats: Any) -> list[tuple[str, Any]]:
        pairs: list[tuple[str, Any]] = super().parameters_to_tuples(params, collection_formats)
        return [(k, str(v).lower() if isinstance(v, bool) else v) for k, v in pairs]


class Kube:
    """An API server connection: `async with Kube(host=...)`, `Kube(kubeconfig=...)`,
    `Kube(in_cluster=True)`; with none of them, in-cluster when running in a pod, else
    the default kubeconfig."""

    def __init__(
        self,
        *,
        host: str | None = None,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        request_timeout: float = 30.0,
        watch_timeout: int = 300,
        backoff: tuple[float, float] = (0.2, 5.0),
    ) -> None:
        self._source = (host, kubeconfig, context, in_cluster)
        self._timeout = request_timeout
        self._watch_timeout = watch_timeout
        self._backoff = backoff  # first delay and cap, in seconds
        self._api: _ApiClient | None = None

    async def __aenter__(self) -> Self:
        self._api = _ApiClient(await _configuration(*self._source))
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    # --- DynamoGraphDeployments -----------------------------------------------------------

    async def get_dgd(self, namespace: str, name: str, version: str = "v1beta1") -> Obj | None:
        try:
            return await self._call(
                self._custom.get_namespaced_custom_object,
                DGD_GROUP,
                version,
                namespace,
                DGD_PLURAL,
                name,
            )
        except KubeNotFound:
            return None

    async def create_dgd(self, body: Obj) -> Obj:
        version = body.get("apiVersion", f"{DGD_GROUP}/v1beta1").rpartition("/")[2]
        namespace = body["metadata"]["namespace"]
        return await self._call(
            self._custom.create_namespaced_custom_object,
            DGD_GROUP,
            version,
            namespace,
            DGD_PLURAL,
            body,
        )

    async def patch_dgd(self, namespace: str, name: str, patch: Obj, version: str) -> Obj:
        """JSON merge patch: given fields replace, null removes, the rest stays. (The generated
        client would pick a JSON-patch content type for a dict body, so it is set explicitly.)"""
        return await self._call(
            self._custom.patch_namespaced_custom_object,
            DGD_GROUP,
            version,
            namespace,
            DGD_PLURAL,
            name,
            patch,
            _content_type=MERGE_PATCH,
        )

    async def apply_dgd(self, body: Obj, *, force: bool) -> Obj:
        """Server-side apply as the `wingsmith` field manager: the object's fields in `body`
        become Wingsmith's; fields Wingsmith owned and `body` no longer names are removed;
        fields others own stay. Creates the object when it does not exist. `force` takes over
        fields another manager owns instead of answering 409."""
        meta = body["metadata"]
        version = body.get("apiVersion", f"{DGD_GROUP}/v1beta1").rpartition("/")[2]
        return await self._call(
            self._custom.patch_namespaced_custom_object,
            DGD_GROUP,
            version,
            meta["namespace"],
            DGD_PLURAL,
            meta["name"],
            body,
            field_manager=FIELD_MANAGER,
            force=force,
            _content_type=APPLY_PATCH,
        )

    async def scale_adapter(self, namespace: str, name: str, replicas: int, version: str) -> Obj:
        """Set a DynamoGraphDeploymentScalingAdapter's replicas through its scale subresource,
        the way an autoscaler does: only its controller may change a DGD component that has
        `scalingAdapter`."""
        return await self._call(
            self._custom.patch_namespaced_custom_object_scale,
            DGD_GROUP,
            version,
            namespace,
            DGDSA_PLURAL,
            name,
            {"spec": {"replicas": replicas}},
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
        )

    async def serves(self, kind: Kind) -> bool:
        """Whether the API server serves a kind (for DGDs: the CRD and that version)."""
        try:
            await self._call(self._lister(kind, None), limit=1)
        except KubeNotFound:
            return False
        return True

    async def api_resources(self, group: str, version: str) -> frozenset[str] | None:
        """The resources (plurals, and `plural/subresource`) the API server serves in a group
        version, from its discovery document; None when it serves no such group version."""
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            listing = await self._call(
                self._client.call_api,
                path,
                "GET",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
        except KubeNotFound:
            return None
        items = listing.get("resources")
        return frozenset(
            str(r["name"])
            for r in (items if isinstance(items, list) else ())
            if isinstance(r, dict) and r.get("name")
        )

    async def delete_dgd(self, namespace: str, name: str, version: str) -> bool:
        """False when it was already gone."""
        try:
            await self._call(
                self._custom.delete_namespaced_custom_object,
                DGD_GROUP,
                version,
                namespace,
                DGD_PLURAL,
                name,
            )
        except KubeNotFound:
            return False
        return True

    # --- leases (leader election) --------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        lease = RESOURCES["lease"]
        try:
            return await self._call(
                self._custom.get_namespaced_custom_object,
                lease.group,
                lease.version,
                namespace,
                lease.plural,
                name,
            )
        except KubeNotFound:
            return None

    async def create_lease(self, body: Obj) -> Obj:
        """409 (KubeConflict) when someone created it first."""
        lease = RESOURCES["lease"]
        namespace = body["metadata"]["namespace"]
        return await self._call(
            self._custom.create_namespaced_custom_object,
            lease.group,
            lease.version,
            namespace,
            lease.plural,
            body,
        )

    async def replace_lease(self, body: Obj) -> Obj:
        """Replace it as of the resourceVersion `body` carries: 409 (KubeConflict) when it
        changed since, so two candidates never both take it."""
        lease, meta = RESOURCES["lease"], body["metadata"]
        return await self._call(
            self._custom.replace_namespaced_custom_object,
            lease.group,
            lease.version,
            meta["namespace"],
            lease.plural,
            meta["name"],
            body,
        )

    async def create_event(self, body: Obj) -> Obj:
        """A Kubernetes Event (core v1), as `kubectl describe` shows on the object it names."""
        return await self._call(
            self._core.create_namespaced_event, body["metadata"]["namespace"], body
        )

    # --- lists and informers ----------------------------------------------------------------

    async def list_objects(
        self, kind: Kind, namespace: str | None = None, label_selector: str | None = None
    ) -> list[Obj]:
        listing = await self._list(kind, namespace, label_selector)
        matches = selector_matcher(label_selector)
        return [item for item in listing.get("items", []) if matches(item)]

    async def list_nodes(self, label_selector: str | None = None) -> list[Obj]:
        return await self.list_objects("node", None, label_selector)

    def informer(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        known: Mapping[tuple[str, str], Obj] | None = None,
    ) -> Informer:
        """Changes of one kind (in one namespace, or all), lazily: nothing is requested until
        the first change is awaited. Close it (`async with`) to end its watch promptly.
        `known`: what an earlier informer had seen; the first list reports what changed or
        vanished since, as any relist does."""
        return Informer(self, kind, namespace, label_selector, known)

    # --- plumbing -----------------------------------------------------------------------------

    @property
    def _client(self) -> _ApiClient:
        if self._api is None:
            raise RuntimeError("use Kube inside `async with`")
        return self._api

    @property
    def _custom(self) -> Any:
        return client.CustomObjectsApi(self._client)

    @property
    def _core(self) -> Any:
        return client.CoreV1Api(self._client)

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> Obj:
        """One request, raw JSON back; errors become KubeError. Content is not preloaded so
        that every 2xx (200 or 201) returns the object and every status maps the same way."""
        try:
            resp = await method(*args, _preload_content=False, _request_timeout=self._timeout, **kw)
            async with resp:
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise KubeError(0, type(e).__name__, str(e)) from e
        data = _decode(body)
        if resp.status >= 400:
            raise _error(resp.status, data)
        return data

    async def _list(self, kind: Kind, namespace: str | None, selector: str | None) -> Obj:
        try:
            return await self._call(self._lister(kind, namespace), label_selector=selector)
        except KubeNotFound as e:
            raise _not_served(kind, e) from e

    def _lister(self, kind: Kind, namespace: str | None) -> Callable[..., Awaitable[Any]]:
        """The generated list function for a kind, its path arguments already bound."""
        res = RESOURCES[kind]
        if res.group:
            if namespace:
                return _bind(
                    self._custom.list_namespaced_custom_object,
                    res.group,
                    res.version,
                    namespace,
                    res.plural,
                )
            return _bind(
                self._custom.list_cluster_custom_object, res.group, res.version, res.plural
            )
        if not res.namespaced:
            return self._core.list_node  # type: ignore[no-any-return]
        if namespace:
            return _bind(self._core.list_namespaced_pod, namespace)
        return self._core.list_pod_for_all_namespaces  # type: ignore[no-any-return]

    async def _open_watch(
        self, kind: Kind, namespace: str | None, selector: str | None, rv: str | None
    ) -> aiohttp.ClientResponse:
        resp: aiohttp.ClientResponse = await self._lister(kind, namespace)(
            watch=True,
            resource_version=rv,
            label_selector=selector,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _preload_content=False,
            # A read that stays silent well past the server's own timeout means a dead peer.
            _request_timeout=(self._timeout, self._watch_timeout + self._timeout),
        )
        if resp.status < 400:
            return resp
        async with resp:
            error = _error(resp.status, _decode(await resp.read()))
        if resp.status == 410:
            raise _Gone()
        raise _not_served(kind, error) if isinstance(error, KubeNotFound) else error

    def _delay(self, failures: int) -> float:
        """The wait before the next try: the first delay, doubling with each failure in a row
        up to the cap, plus up to half a first delay at random, so that the informers of many
        operators that lost the same API server do not come back at one instant."""
        first, cap = self._backoff
        wait = tenacity.wait_exponential_jitter(multiplier=first, max=cap, jitter=first / 2)
        state = tenacity.RetryCallState(_RETRYING, None, (), {})
        state.attempt_number = max(1, failures)
        return float(wait(state))


async def served_dra(kube: Kube) -> DraKinds | None:
    """The ResourceClaim and ResourceSlice kinds to watch: v1, else v1beta2, else v1beta1,
    the first version that serves both; None on a cluster without Dynamic Resource Allocation.

    Asked of discovery (`/apis/resource.k8s.io/<version>`), not by listing: a list is
    authorized before it is routed, so on a cluster without the group an operator whose role
    does not name it would be told 403 rather than 404, while discovery is open to every
    authenticated client. Not knowing is not "no": an API server that cannot be reached or
    fails (KubeError) is raised, for the caller to try again."""
    for version in DRA_VERSIONS:
        served = await kube.api_resources(DRA_GROUP, version)
        if served is not None and {"resourceclaims", "resourceslices"} <= served:
            return DRA_KINDS[version]
    return None


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): only a fresh list can continue."""


class Informer:
    """List, then watch; rewatch from the last resourceVersion when a watch ends or drops;
    relist on 410 Gone. Emits only real changes against its own view, and SYNCED after each
    (re)list. Use as `async with kube.informer(...) as changes: async for change in changes`.
    Raises KindNotServed when the kind does not exist; retries everything else with backoff."""

    def __init__(
        self,
        kube: Kube,
        kind: Kind,
        namespace: str | None,
        selector: str | None,
        known: Mapping[tuple[str, str], Obj] | None = None,
    ):
        self.kind, self.namespace, self.selector = kind, namespace, selector
        # The view by (namespace, name); it can run ahead of changes not yet consumed.
        self.objects: dict[tuple[str, str], Obj] = dict(known or {})
        self._kube = kube
        self._matches = selector_matcher(selector)
        self._changes = self._run()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Change:
        return await anext(self._changes)

    async def aclose(self) -> None:
        await self._changes.aclose()

    async def _run(self) -> AsyncGenerator[Change, None]:
        rv: str | None = None  # None: the next step is a (re)list
        failures = 0
        while True:
            listed: list[Change] = []
            try:
                if rv is None:
                    rv, listed = await self._relist()
                # The watch is open before the list is handed out, so that whatever the
                # consumer does on SYNCED, later changes are already on their way.
                async with await self._open_watch(rv) as resp:
                    while listed:
                        yield listed.pop(0)
                    async for line in resp.content:
                        change, rv = self._on_line(line, rv)
                        failures = 0
                        if change is not None:
                            yield change
                failures += 1  # a clean end is normal; an instantly closing server must not spin
            except _Gone:
                log.info("informer %s: resourceVersion expired, relisting", self.kind)
                rv, failures = None, failures + 1
            except KindNotServed:
                raise
            except KubeError as e:
                failures += 1
                log.warning("informer %s: %s (attempt %d)", self.kind, e, failures)
                if e.status in (401, 403):
                    yield Change("DENIED", {"code": e.status, "message": str(e)})
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                failures += 1
                log.warning("informer %s: %s (attempt %d)", self.kind, e, failures)
            for change in listed:  # listed, but the watch failed to open: the view moved anyway
                yield change
            await asyncio.sleep(self._kube._delay(failures))

    async def _relist(self) -> tuple[str, list[Change]]:
        """A full list replaces the view: report what appeared, changed and vanished."""
        listing = await self._kube._list(self.kind, self.namespace, self.selector)
        fresh = {_key(item): item for item in listing.get("items", []) if self._matches(item)}
        changes = [Change("RELISTING", {})]
        changes += [c for item in fresh.values() if (c := self._upsert(item)) is not None]
        for key in [k for k in self.objects if k not in fresh]:
            changes.append(Change("DELETED", self.objects.pop(key)))
        rv = str(listing.get("metadata", {}).get("resourceVersion") or "")
        changes.append(Change("SYNCED", {"metadata": {"resourceVersion": rv}}))
        return rv, changes

    async def _open_watch(self, rv: str) -> aiohttp.ClientResponse:
        return await self._kube._open_watch(self.kind, self.namespace, self.selector, rv or None)

    def _on_line(self, line: bytes, rv: str) -> tuple[Change | None, str]:
        """One line of the watch stream: the change it makes (if any), and the newest
        resourceVersion seen."""
        if not line.strip():
            return None, rv
        event = json.loads(line)
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            raise ValueError(f"not a watch event: {line[:200]!r}")
        if event.get("type") == "ERROR":
            raise _Gone() if obj.get("code") == 410 else _error(obj.get("code", 500), obj)
        rv = obj.get("metadata", {}).get("resourceVersion") or rv
        return (None if event.get("type") == "BOOKMARK" else self._apply(event["type"], obj)), rv

    def _apply(self, type_: str, obj: Obj) -> Change | None:
        if type_ == "DELETED" or not self._matches(obj):
            # An object that stops matching the selector leaves the view, as on a real server.
            gone = self.objects.pop(_key(obj), None)
            return None if gone is None else Change("DELETED", obj)
        return self._upsert(obj)

    def _upsert(self, obj: Obj) -> Change | None:
        old = self.objects.get(_key(obj))
        self.objects[_key(obj)] = obj
        if old is None:
            return Change("ADDED", obj)
        return None if _same(old, obj) else Change("MODIFIED", obj)


# --- helpers ------------------------------------------------------------------------------------


async def _configuration(
    host: str | None, kubeconfig: str | Path | None, context: str | None, in_cluster: bool
) -> Any:
    cfg = client.Configuration()
    if host:
        cfg.host = host.rstrip("/")
    elif in_cluster or (kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        path = str(kubeconfig) if kubeconfig is not None else None
        await config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    return cfg


def _bind(method: Callable[..., Awaitable[Any]], *args: Any) -> Callable[..., Awaitable[Any]]:
    async def call(**kw: Any) -> Any:
        return await method(*args, **kw)

    return call


def _decode(body: bytes) -> Obj:
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return {"message": body[:500].decode(errors="replace")}
    return data if isinstance(data, dict) else {"items": data}


def _error(status: int, status_obj: Obj) -> KubeError:
    """A Kubernetes Status object (or whatever came back) as a named error."""
    reason = str(status_obj.get("reason") or "Error")
    message = str(status_obj.get("message") or "")
    cls = {404: KubeNotFound, 409: KubeConflict}.get(status, KubeError)
    return cls(status, reason, message)


def _not_served(kind: Kind, e: KubeError) -> KindNotServed:
    res = RESOURCES[kind]
    what = f"{res.plural}.{res.group}/{res.version}" if res.group else f"{res.version}/{res.plural}"
    hint = " (is the CRD installed, and does it serve this version?)" if res.group else ""
    return KindNotServed(e.status, e.reason, f"{what} is not served by the API server{hint}")


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace") or "", meta.get("name") or ""


def _same(a: Obj, b: Obj) -> bool:
    rv_a = a.get("metadata", {}).get("resourceVersion")
    rv_b = b.get("metadata", {}).get("resourceVersion")
    return rv_a == rv_b if rv_a and rv_b else a == b


_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[\w./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)|\s(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*"
)


def selector_matcher(selector: str | None) -> Callable[[Obj], bool]:
    """A label selector (equality- and set-based) as a predicate on objects. Servers filter
    too; filtering again costs little and keeps servers that ignore selectors honest."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for part in re.split(r",(?![^()]*\))", selector or ""):
        if not part.strip():
            continue
        m = _REQUIREMENT.fullmatch(part)
        if m is None:
            raise ValueError(f"unsupported label selector: {part!r}")
        checks.append(_requirement(m))
    return lambda obj: all(c(obj.get("metadata", {}).get("labels") or {}) for c in checks)


def _requirement(m: re.Match[str]) -> Callable[[dict[str, str]], bool]:
    key = m["key"]
    if m["op"]:
        value, negate = m["value"], m["op"] == "!="
        return lambda labels: (labels.get(key) == value) != negate
    if m["setop"]:
        values = {v.strip() for v in m["values"].split(",")}
        if m["setop"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    return lambda labels: (key in labels) != bool(m["neg"])


__all__ = [
    "DRA_KINDS",
    "Change",
    "DraKinds",
    "Informer",
    "KindNotServed",
    "Kube",
    "KubeConflict",
    "KubeError",
    "KubeNotFound",
    "selector_matcher",
    "served_dra",
]
