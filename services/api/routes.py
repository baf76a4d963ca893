"""The `/v1` endpoints: each write is one command, each read is composed from views.

The concept document's paths are kept exactly: `POST /v1/deployments/{ref}/authority` with
`{"authority": "managed"}`, and `/v1/discovered` with `/track`, `/ignore` and `/promote`.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Annotated, Any, cast

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from wingsmith.adapters import nats_bus
from wingsmith.domain import commands as c
from wingsmith.domain import names, subjects
from wingsmith.domain.contracts import views as v
from wingsmith.domain.contracts.replies import Accepted, Result
from wingsmith.domain.deployment import AdmissionPhase
from wingsmith.domain.workload import Workload
from wingsmith.projections.audit import (
    NAME_KIND,
    Entry,
    Timeline,
    incarnation_of,
    incarnations,
)
from wingsmith.services import wire
from wingsmith.services.api import resources as r
from wingsmith.services.api.gateway import Answered, Gateway, Views
from wingsmith.services.api.problems import PROBLEM_JSON, STATUS, Problem

MAX_BODY = 64 * 1024
HEADER_ID = re.compile(r"^[A-Za-z0-9][-_.:A-Za-z0-9]{0,127}$")
AGGREGATE = re.compile(r"^(?P<kind>[a-z_]{1,32})(:(?P<id>[-_:A-Za-z0-9]{1,400}))?$")
# command fields that the path gives, by the name the path gives them
WORKLOAD_REF = {"workload_id": "ref"}
DEPLOYMENT_REF = {"deployment_id": "ref"}
DISCOVERY_REF = {"discovery_id": "ref"}


def body_model(command: type[c.Command], *, without: tuple[str, ...] = ()) -> type[BaseModel]:
    """A request body with the command's fields, less the ones the path or headers give."""
    skip = {"command_id", "correlation_id", *without}
    fields: dict[str, Any] = {
        name: (info.annotation, info)
        for name, info in command.model_fields.items()
        if name not in skip
    }
    return create_model(
        f"{command.__name__}Request",
        __config__=ConfigDict(extra="forbid", frozen=True),
        __doc__=command.__doc__,
        **fields,
    )


CreateWorkloadBody = body_model(c.CreateWorkload)
ScaleBody = body_model(c.ScaleWorkload, without=("workload_id",))
ServingBody = body_model(c.ChangeServingConfig, without=("workload_id",))
PreferencesBody = body_model(c.SetPlacementPreferences, without=("workload_id",))
AuthorityBody = body_model(c.PromoteAuthority, without=("deployment_id",))
EngineArgsBody = body_model(c.SetEngineArgs, without=("deployment_id",))
PromoteBody = body_model(c.PromoteDiscovery, without=("discovery_id",))
QuotaBody = body_model(c.SetQuota, without=("project", "device_class"))
ClusterBody = body_model(c.RegisterCluster)
BODIES: list[type[BaseModel]] = [
    CreateWorkloadBody,
    ScaleBody,
    ServingBody,
    PreferencesBody,
    AuthorityBody,
    EngineArgsBody,
    PromoteBody,
    QuotaBody,
    ClusterBody,
]

BEARER = HTTPBearer(auto_error=False, description="A token from WINGSMITH_API_TOKENS")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


def _holder(request: Request, credentials: Credentials, *, write: bool) -> str:
    token = credentials.credentials if credentials else None
    name: str = request.app.state.tokens.check(token, write=write)
    return name


def _reader(request: Request, credentials: Credentials) -> str:
    return _holder(request, credentials, write=False)


def _writer(request: Request, credentials: Credentials) -> str:
    return _holder(request, credentials, write=True)


READ = [Depends(_reader)]
Writer = Annotated[str, Depends(_writer)]
Ref = Annotated[str, Path(min_length=1, max_length=400, description="An id or a readable name")]

# The problems (services/api/problems.py) each kind of endpoint may answer with; any other
# status is described by the document's `default` response, a problem too (app.py).
READ_PROBLEMS = (401, 422)
REF_PROBLEMS = (*READ_PROBLEMS, 404)
AMBIGUOUS_PROBLEMS = (*REF_PROBLEMS, 409)  # a readable name that fits several things
WRITE_PROBLEMS = (400, 401, 403, 404, 409, 413, 415, 422, 503)


def _problems(statuses: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    schema = {"$ref": "#/components/schemas/ProblemDocument"}
    return {
        status: {
            "description": "A problem: " + ", ".join(k for k, s in STATUS.items() if s == status),
            "content": {PROBLEM_JSON: {"schema": schema}},
        }
        for status in sorted(statuses)
    }


def _reads(document: Any, problems: tuple[int, ...] = READ_PROBLEMS) -> dict[str, Any]:
    """What a read endpoint answers: `document`, or a problem. The handler returns the
    document as the views hold it (no response model re-encodes it)."""
    return {
        "response_model": None,
        "dependencies": READ,
        "responses": {200: {"model": document, "description": "The resource"}}
        | _problems(problems),
    }


def _writes(
    document: Any,
    status: int = 200,
    described: str = "The resource, changed",
    also: Mapping[int, tuple[Any, str]] | None = None,
) -> dict[str, Any]:
    """What a write endpoint answers: `document` at `status` once the views show the command,
    `202` with the hub's result when they do not yet, or a problem; `also`: other successes,
    each a (document, description)."""
    answers: dict[int | str, dict[str, Any]] = {
        202: {"model": Accepted, "description": "Stored; the views do not show it yet"},
        status: {"model": document, "description": described},
    }
    answers |= {s: {"model": m, "description": d} for s, (m, d) in (also or {}).items()}
    answers |= _problems(WRITE_PROBLEMS)
    return {"response_model": None, "status_code": status, "responses": answers}


router = APIRouter(prefix="/v1")


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _views(request: Request) -> Views:
    return _gateway(request).views  # the gateway swaps its mirror after a restart


async def _act(
    request: Request,
    holder: str,
    command: type[c.Command],
    fields: Mapping[str, Any],
    body: type[BaseModel] | None = None,
    renamed: Mapping[str, str] | None = None,
) -> Answered:
    """Send the command made of `fields`, the request's body and its headers; the hub's reply,
    or its refusal as a problem (`renamed` gives command fields their names in the path)."""
    values = dict(fields)
    if body is not None:
        values |= (await _read_body(request, body)).model_dump()
    values |= _ids(request, holder)
    try:
        cmd = command.model_validate(values)
    except ValidationError as e:
        raise Problem.from_validation(e) from None
    try:
        reply = await _gateway(request).send(cmd)
    except (TimeoutError, nats_bus.NatsError) as e:
        raise Problem(
            "unavailable",
            f"the hub did not answer ({e}); it may have acted: resend with Idempotency-Key "
            f"{cmd.command_id}",
            details={"command_id": cmd.command_id},
        ) from None
    if not reply["ok"]:
        raise Problem.from_hub(reply["error"], renamed or {})
    return reply


def _answer(
    reply: Answered, render: Callable[[], Any], status: int = 200, **headers: str
) -> JSONResponse:
    """The resource as it now is; 202 with the hub's result when the views do not show the
    command yet (the change is stored either way)."""
    if reply.get("duplicate"):
        headers["Idempotent-Replayed"] = "true"
    headers["Wingsmith-Command-Id"] = reply["result"]["command_id"]
    if not reply["consistent"]:
        accepted: Accepted = {"result": reply["result"], "consistent": False}
        return JSONResponse(accepted, 202, headers)
    return JSONResponse(render(), status, headers)


async def _read_body(request: Request, model: type[BaseModel]) -> BaseModel:
    media = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if media != "application/json":
        raise Problem("unsupported_media_type", f"send application/json, not {media!r}")
    raw = bytearray()
    async for chunk in request.stream():  # stop reading as soon as it is too long
        raw += chunk
        if len(raw) > MAX_BODY:
            raise Problem("payload_too_large", f"the body is over {MAX_BODY} bytes")
    repeated = wire.duplicate_key(bytes(raw))
    if repeated is not None:  # the parser would keep the last silently
        detail = f"key {repeated!r} is given more than once in one object"
        raise Problem("invalid_json", detail, field=repeated)
    try:
        return model.model_validate_json(bytes(raw) or b"null", strict=True)
    except ValidationError as e:
        raise Problem.from_validation(e) from None


def _ids(request: Request, holder: str) -> dict[str, str]:
    """command_id from Idempotency-Key, else one naming the token's holder (so the history
    says who); correlation_id from X-Correlation-Id."""
    ids = {"command_id": request.headers.get("idempotency-key") or f"{holder}:{uuid.uuid4().hex}"}
    correlation = request.headers.get("x-correlation-id")
    given = (("Idempotency-Key", ids["command_id"]), ("X-Correlation-Id", correlation))
    for header, value in given:
        if value is not None and not HEADER_ID.match(value):
            raise Problem(
                "bad_request",
                f"{header} must be 1-128 letters, digits and -_.: starting with a letter or digit",
                field=f"header.{header}",
            )
    return ids | ({"correlation_id": correlation} if correlation else {})


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of an endpoint that reads `model` itself."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


# Workloads


@router.post(
    "/workloads",
    tags=["workloads"],
    openapi_extra=_body(CreateWorkloadBody),
    **_writes(v.Workload, 201),
)
async def create_workload(request: Request, holder: Writer) -> JSONResponse:
    """Declare a workload: placement spreads it over clusters (or it is pinned to one)."""
    reply = await _act(request, holder, c.CreateWorkload, {}, CreateWorkloadBody)
    key = _name(reply)
    render = lambda: r.workload(_views(request), key)  # noqa: E731
    return _answer(reply, render, 201, Location=f"/v1/workloads/{key}")


@router.get("/workloads", tags=["workloads"], **_reads(v.WorkloadList))
async def list_workloads(
    request: Request, project: str | None = None, phase: AdmissionPhase | None = None
) -> v.WorkloadList:
    found = r.workloads(_views(request), project=project, phase=phase)
    return {"workloads": found}


@router.get("/workloads/{ref}", tags=["workloads"], **_reads(v.Workload, REF_PROBLEMS))
async def get_workload(request: Request, ref: Ref) -> v.Workload:
    return r.workload(_views(request), r.workload_id(_views(request), ref))


@router.post(
    "/workloads/{ref}/scale",
    tags=["workloads"],
    openapi_extra=_body(ScaleBody),
    **_writes(v.Workload),
)
async def scale_workload(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Change the workload's total replicas; its deployments' shares follow."""
    key = r.workload_id(_views(request), ref)
    fields = {"workload_id": key}
    reply = await _act(request, holder, c.ScaleWorkload, fields, ScaleBody, WORKLOAD_REF)
    return _answer(reply, lambda: r.workload(_views(request), key))


@router.put(
    "/workloads/{ref}/serving",
    tags=["workloads"],
    openapi_extra=_body(ServingBody),
    **_writes(v.Workload),
)
async def change_serving(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Serve the workload differently: every deployment rolls out a new generation (or, when
    only where its pods run or its frontend change, keeps its generation and is re-rendered)."""
    key = r.workload_id(_views(request), ref)
    fields = {"workload_id": key}
    reply = await _act(request, holder, c.ChangeServingConfig, fields, ServingBody, WORKLOAD_REF)
    return _answer(reply, lambda: r.workload(_views(request), key))


@router.put(
    "/workloads/{ref}/preferences",
    tags=["workloads"],
    openapi_extra=_body(PreferencesBody),
    **_writes(v.Workload),
)
async def set_preferences(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Where the workload's replicas should rather run: new ones follow at once, the others
    move as rebalancing finds room (docs/scheduling.md, "Placement that moves")."""
    key = r.workload_id(_views(request), ref)
    fields = {"workload_id": key}
    reply = await _act(
        request, holder, c.SetPlacementPreferences, fields, PreferencesBody, WORKLOAD_REF
    )
    return _answer(reply, lambda: r.workload(_views(request), key))


@router.delete(
    "/workloads/{ref}",
    tags=["workloads"],
    **_writes(Result | Accepted, 202, "The hub's result; wrapped while the views lag behind"),
)
async def delete_workload(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Delete the workload and its deployments; the operators remove what they rendered. The
    answer is the hub's result: there is no resource left to show."""
    key = r.workload_id(_views(request), ref)
    fields = {"workload_id": key}
    reply = await _act(request, holder, c.DeleteWorkload, fields, renamed=WORKLOAD_REF)
    return _answer(reply, lambda: reply["result"], 202)


def _name(reply: Answered) -> str:
    """The name a workload's views are kept under (a receipt stored before names were reused
    has only the id, which was the name)."""
    result = reply["result"]
    return result.get("name") or result["workload_id"]


# Deployments


@router.get("/deployments", tags=["deployments"], **_reads(v.DeploymentList))
async def list_deployments(
    request: Request, workload: str | None = None, cluster: str | None = None
) -> v.DeploymentList:
    found = r.deployments(_views(request), workload=workload, cluster=cluster)
    return {"deployments": found}


@router.get(
    "/deployments/{ref:path}/explain",
    tags=["deployments"],
    **_reads(v.Explanation, AMBIGUOUS_PROBLEMS),
)
async def explain_deployment(request: Request, ref: Ref) -> v.Explanation:
    """What the deployment wants, holds and waits for; the constraint that binds it, with its
    numbers (quota, free devices per node, the blocker ahead of it and its place in the
    queue); and what change would unblock it. A workload that placement found nowhere to go
    (a device class no cluster reports) is explained without a deployment. Declared before
    `GET /deployments/{ref}`, whose path would take `…/explain` for a reference."""
    return r.explanation(_views(request), ref)


@router.get(
    "/deployments/{ref:path}", tags=["deployments"], **_reads(v.Deployment, AMBIGUOUS_PROBLEMS)
)
async def get_deployment(request: Request, ref: Ref) -> v.Deployment:
    return r.deployment(_views(request), r.deployment_id(_views(request), ref))


async def _on_deployment(
    request: Request,
    holder: str,
    ref: str,
    command: type[c.Command],
    body: type[BaseModel] | None = None,
) -> JSONResponse:
    key = r.deployment_id(_views(request), ref)
    fields = {"deployment_id": key}
    reply = await _act(request, holder, command, fields, body, DEPLOYMENT_REF)
    return _answer(reply, lambda: r.deployment(_views(request), key))


@router.post(
    "/deployments/{ref:path}/authority",
    tags=["deployments"],
    openapi_extra=_body(AuthorityBody),
    **_writes(v.Deployment),
)
async def promote_authority(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Hand an observed deployment to its operator: `{"authority": "managed"}`."""
    return await _on_deployment(request, holder, ref, c.PromoteAuthority, AuthorityBody)


@router.post("/deployments/{ref:path}/enable", tags=["deployments"], **_writes(v.Deployment))
async def enable(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Let the operator reconcile the deployment again."""
    return await _on_deployment(request, holder, ref, c.EnableDeployment)


@router.post("/deployments/{ref:path}/disable", tags=["deployments"], **_writes(v.Deployment))
async def disable(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Scale the deployment to zero and stop reconciling it."""
    return await _on_deployment(request, holder, ref, c.DisableDeployment)


@router.put(
    "/deployments/{ref:path}/engine-args",
    tags=["deployments"],
    openapi_extra=_body(EngineArgsBody),
    **_writes(v.Deployment),
)
async def set_engine_args(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Set the engine arguments the deployment should run with."""
    return await _on_deployment(request, holder, ref, c.SetEngineArgs, EngineArgsBody)


# Discovered models


@router.get("/discovered", tags=["discovered"], **_reads(v.DiscoveredList))
async def list_discovered(
    request: Request, include_ignored: bool = False, cluster: str | None = None
) -> v.DiscoveredList:
    """Models found running that the plane did not declare; ignored ones only if asked."""
    found = r.discovered(_views(request), include_ignored=include_ignored, cluster=cluster)
    return {"discovered": found}


@router.get(
    "/discovered/{ref:path}", tags=["discovered"], **_reads(v.DiscoveredView, AMBIGUOUS_PROBLEMS)
)
async def get_discovered(request: Request, ref: Ref) -> v.DiscoveredView:
    return r.sighting(_views(request), r.discovery_id(_views(request), ref))


async def _on_discovery(
    request: Request, holder: str, ref: str, command: type[c.Command]
) -> JSONResponse:
    key = r.discovery_id(_views(request), ref)
    reply = await _act(request, holder, command, {"discovery_id": key}, renamed=DISCOVERY_REF)
    return _answer(reply, lambda: r.sighting(_views(request), key))


@router.post("/discovered/{ref:path}/track", tags=["discovered"], **_writes(v.DiscoveredView))
async def track(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Keep it in the inventory, observed only; no deployment is created."""
    return await _on_discovery(request, holder, ref, c.TrackDiscovery)


@router.post("/discovered/{ref:path}/ignore", tags=["discovered"], **_writes(v.DiscoveredView))
async def ignore(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Not interesting: it leaves the default list."""
    return await _on_discovery(request, holder, ref, c.IgnoreDiscovery)


@router.post(
    "/discovered/{ref:path}/promote",
    tags=["discovered"],
    openapi_extra=_body(PromoteBody),
    **_writes(v.Workload, 201),
)
async def promote(request: Request, ref: Ref, holder: Writer) -> JSONResponse:
    """Adopt the model: a workload pinned to its cluster, with one observed deployment."""
    key = r.discovery_id(_views(request), ref)
    fields = {"discovery_id": key}
    reply = await _act(request, holder, c.PromoteDiscovery, fields, PromoteBody, DISCOVERY_REF)
    workload = _name(reply)
    render = lambda: r.workload(_views(request), workload)  # noqa: E731
    return _answer(reply, render, 201, Location=f"/v1/workloads/{workload}")


# Projects and quotas


@router.get("/projects", tags=["projects"], **_reads(v.ProjectList))
async def list_projects(request: Request) -> v.ProjectList:
    return {"projects": r.projects(_views(request))}


@router.get("/projects/{project}", tags=["projects"], **_reads(v.Project, REF_PROBLEMS))
async def get_project(request: Request, project: Ref) -> v.Project:
    return r.project(_views(request), project)


@router.put(
    "/projects/{project}/quotas/{device_class}",
    tags=["projects"],
    openapi_extra=_body(QuotaBody),
    **_writes(v.Project),
)
async def set_quota(
    request: Request, project: Ref, device_class: Ref, holder: Writer
) -> JSONResponse:
    """Set how many devices of one class the project's deployments may hold."""
    fields = {"project": project, "device_class": device_class}
    reply = await _act(request, holder, c.SetQuota, fields, QuotaBody)
    return _answer(reply, lambda: r.project(_views(request), project))


# Clusters and capacity


@router.post(
    "/clusters",
    tags=["clusters"],
    openapi_extra=_body(ClusterBody),
    **_writes(v.Cluster, 201, also={200: (v.Cluster, "Registered already: the cluster as it is")}),
)
async def register_cluster(request: Request, holder: Writer) -> JSONResponse:
    """Make a cluster known before its operator first reports."""
    reply = await _act(request, holder, c.RegisterCluster, {}, ClusterBody)
    key = reply["result"]["cluster_id"]
    render = lambda: r.cluster(_views(request), key)  # noqa: E731
    created = 201 if reply["result"]["events"] else 200  # it was registered already
    return _answer(reply, render, created, Location=f"/v1/clusters/{key}")


@router.get("/clusters", tags=["clusters"], **_reads(v.ClusterList))
async def list_clusters(request: Request) -> v.ClusterList:
    return {"clusters": r.clusters(_views(request))}


@router.get("/clusters/{ref}", tags=["clusters"], **_reads(v.Cluster, REF_PROBLEMS))
async def get_cluster(request: Request, ref: Ref) -> v.Cluster:
    return r.cluster(_views(request), ref)


@router.get("/clusters/{ref}/nodes", tags=["clusters"], **_reads(v.NodeList, REF_PROBLEMS))
async def cluster_nodes(request: Request, ref: Ref, device_class: str | None = None) -> v.NodeList:
    """The cluster's nodes: devices, whether unschedulable, held outside Wingsmith, held by
    live replicas, and free (negative when over-committed)."""
    return {"nodes": r.nodes(_views(request), ref, device_class=device_class)}


@router.get("/capacity", tags=["clusters"], **_reads(v.CapacityList))
async def capacity(
    request: Request, cluster: str | None = None, device_class: str | None = None
) -> v.CapacityList:
    """Devices per cluster and class: total, on unschedulable nodes, held outside Wingsmith,
    allocated, reserved by admission, and free (negative when over-committed)."""
    return {"capacity": r.capacity(_views(request), cluster=cluster, device_class=device_class)}


# Audit


@router.get("/events", tags=["events"], **_reads(v.AuditPage))
async def events(
    request: Request,
    aggregate: Annotated[
        str | None,
        Query(
            max_length=433, description="`<kind>:<id>` (e.g. `deployment:llama--east`) or a kind"
        ),
    ] = None,
    correlation_id: Annotated[str | None, Query(max_length=128)] = None,
    since: Annotated[int, Query(ge=1, le=2**53, description="Stream sequence")] = 1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> v.AuditPage:
    """History, oldest first, each event with the fields it changed (before and after) and the
    command that caused it. `next` is the `since` of the next page (null: none). One aggregate's
    history is folded from its first event, so `before` is right on every page; a kind's, or
    everything's, from `since`. `workload:<name>` is every incarnation of the name, each entry
    with its `incarnation` once the name was reused, and the name's record."""
    subject, whole = _subject(aggregate)
    numbered: dict[str, int] = {}
    if whole and subject.startswith(f"{names.EVENTS}.{Workload.kind}."):
        name = (aggregate or "").partition(":")[2]
        history, numbered = await _incarnations(_gateway(request), name)
    else:
        history = _gateway(request).history(subject, 1 if whole else since)
    timeline = Timeline()
    entries: list[v.AuditEntry] = []
    async with contextlib.aclosing(history):
        async for message in history:
            entry = timeline.apply(orjson.loads(message.data))
            if entry is None or message.seq < since:
                continue
            if correlation_id not in (None, entry.correlation_id):
                continue
            if len(entries) == limit:
                return {"events": entries, "next": message.seq}
            entries.append(_entry(entry, message.seq, incarnation_of(entry, numbered)))
    return {"events": entries, "next": None}


def _entry(entry: Entry, seq: int, incarnation: int | None) -> v.AuditEntry:
    shown = cast(v.AuditEntry, {**entry.as_dict(), "seq": seq})  # incarnation: set below
    if incarnation is not None:
        shown["incarnation"] = incarnation
    return shown


async def _incarnations(
    gateway: Gateway, name: str
) -> tuple[AsyncGenerator[nats_bus.StreamMessage, None], dict[str, int]]:
    """Every incarnation's history of the workload called `name`, with its name's record, in
    stream order; and each incarnation's number by its id (none for a name never reused)."""
    record = [m async for m in gateway.history(_events_of(NAME_KIND, name), 1)]
    numbered = incarnations(orjson.loads(m.data) for m in record)
    found = list(record)
    for workload_id in numbered or [name]:
        found += [m async for m in gateway.history(_events_of(Workload.kind, workload_id), 1)]

    async def in_order() -> AsyncGenerator[nats_bus.StreamMessage, None]:
        for message in sorted(found, key=lambda m: m.seq):
            yield message

    return in_order(), numbered


def _events_of(kind: str, key: str) -> str:
    return f"{names.EVENTS}.{kind}.{subjects.token(key)}.*"


def _subject(aggregate: str | None) -> tuple[str, bool]:
    """The events' subject, and whether it is one aggregate's whole history (small enough to
    fold from its first event)."""
    if aggregate is None:
        return names.every(names.EVENTS), False
    match = AGGREGATE.match(aggregate)
    if match is None:
        raise Problem(
            "validation_error",
            f"{aggregate!r} is not `<kind>:<id>` or a kind (e.g. deployment:llama--east)",
            field="query.aggregate",
        )
    if match["id"]:
        return _events_of(match["kind"], match["id"]), True
    return f"{names.EVENTS}.{match['kind']}.>", False
