"""The REST API (`/v1`): the command API and the projections' views over HTTP.

Every write is one of the hub's commands, sent over NATS like any other client's, so it is
validated, idempotent and audited the same way; every read is a projection view. Request bodies
are the commands' own fields (strictly validated: no coercion, no unknown fields) and errors are
RFC 7807 problems naming the field at fault. `Idempotency-Key` becomes the command_id (resending
with it has the effect of once) and `X-Correlation-Id` the correlation id. A request without a
valid bearer token is refused before anything is sent.
"""

from __future__ import annotations

import hmac
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from starlette.exceptions import HTTPException

from adapters import nats_bus
from projections.audit import Timeline
from services import commands as c
from services.api import resources as r
from services.api.gateway import Gateway, Views
from services.api.problems import PROBLEM_JSON, STATUS, Problem

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
COMMAND_ID = re.compile(r"^[A-Za-z0-9][-_.:A-Za-z0-9]{0,127}$")
AGGREGATE = re.compile(r"^(?P<kind>[a-z]{1,32})(:(?P<id>[-_:A-Za-z0-9]{1,400}))?$")


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens by the name they stand for: writers may do everything, readers only
    read."""

    writers: Mapping[str, str]  # token -> name
    readers: Mapping[str, str]

    def check(self, token: str | None, *, write: bool) -> str:
        """The name the token stands for, if it may read (or write)."""
        if not token:
            raise Problem("unauthorized", "send Authorization: Bearer <token>")
        name = _lookup(self.writers, token)
        if name is not None:
            return name
        name = _lookup(self.readers, token)
        if name is None:
            raise Problem("unauthorized", "the bearer token is not valid")
        if write:
            raise Problem("forbidden", f"token {name!r} may only read")
        return name


def _lookup(tokens: Mapping[str, str], token: str) -> str | None:
    """Compare with every token, each in constant time, so timing tells nothing."""
    found = None
    for known, name in tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            found = name
    return found


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
AuthorityBody = body_model(c.PromoteAuthority, without=("deployment_id",))
EngineArgsBody = body_model(c.SetEngineArgs, without=("deployment_id",))
PromoteBody = body_model(c.PromoteDiscovery, without=("discovery_id",))
QuotaBody = body_model(c.SetQuota, without=("project", "device_class"))
ClusterBody = body_model(c.RegisterCluster)
BODIES: list[type[BaseModel]] = [
    CreateWorkloadBody,
    ScaleBody,
    ServingBody,
    AuthorityBody,
    EngineArgsBody,
    PromoteBody,
    QuotaBody,
    ClusterBody,
]

BEARER = HTTPBearer(auto_error=False, description="A token from WINGSMITH_API_TOKENS")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


def _reader(request: Request, credentials: Credentials) -> str:
    tokens: Tokens = request.app.state.tokens
    return tokens.check(credentials.credentials if credentials else None, write=False)


def _writer(request: Request, credentials: Credentials) -> str:
    tokens: Tokens = request.app.state.tokens
    return tokens.check(credentials.credentials if credentials else None, write=True)


Ref = Annotated[str, Path(min_length=1, max_length=400, description="An id or a readable name")]


def create_app(gateway: Gateway, tokens: Tokens) -> FastAPI:
    """The API over `gateway`, open to `tokens`."""
    app = FastAPI(
        title="Wingsmith",
        version="1",
        description=__doc__,
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.tokens = tokens
    Read = Depends(_reader)
    Write = Depends(_writer)

    def views() -> Views:  # the gateway swaps its mirror after a restart
        return gateway.views

    async def act(
        request: Request,
        command: type[c.Command],
        fields: dict[str, Any],
        body: type[BaseModel] | None = None,
        path: Mapping[str, str] = {},
    ) -> dict[str, Any]:
        """Send the command made of `fields`, the request's body and its headers; the hub's
        reply, or its refusal as a problem (`path` renames command fields to path parameters)."""
        values = dict(fields)
        if body is not None:
            values |= (await _read_body(request, body)).model_dump()
        values |= _ids(request)
        try:
            cmd = command.model_validate(values)
        except ValidationError as e:
            raise Problem.from_validation(e) from None
        try:
            reply = await gateway.send(cmd)
        except TimeoutError as e:
            raise Problem("unavailable", f"the hub did not answer: {e}") from None
        except nats_bus.NatsError as e:
            raise Problem("unavailable", f"NATS: {e}") from None
        if not reply.get("ok"):
            raise Problem.from_hub(reply["error"], dict(path))
        return reply

    def answer(
        reply: dict[str, Any], render: Callable[[], Any], status: int = 200, **headers: str
    ) -> JSONResponse:
        """The resource as it now is; 202 with the hub's result when the views have not caught
        up with the command yet."""
        if reply.get("duplicate"):
            headers["Idempotent-Replayed"] = "true"
        headers["Wingsmith-Command-Id"] = reply["result"]["command_id"]
        if not reply.get("consistent"):
            return JSONResponse({"result": reply["result"], "consistent": False}, 202, headers)
        return JSONResponse(render(), status, headers)

    _install_errors(app)
    _install_openapi(app)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        ready = gateway.ready.is_set() and gateway.nc.is_connected
        return JSONResponse({"ready": ready}, 200 if ready else 503)

    # Workloads

    @app.post(
        "/v1/workloads",
        status_code=201,
        tags=["workloads"],
        openapi_extra=_body(CreateWorkloadBody),
    )
    async def create_workload(request: Request, who: str = Write) -> JSONResponse:
        """Declare a workload: placement spreads it over clusters (or it is pinned to one)."""
        reply = await act(request, c.CreateWorkload, {}, CreateWorkloadBody)
        key = reply["result"]["workload_id"]
        location = f"/v1/workloads/{key}"
        return answer(reply, lambda: r.workload(views(), key), 201, Location=location)

    @app.get("/v1/workloads", tags=["workloads"])
    async def list_workloads(
        project: str | None = None,
        phase: Literal["pending", "admitted", "placed", "running", "failed"] | None = None,
        who: str = Read,
    ) -> dict[str, Any]:
        return {"workloads": r.workloads(views(), project=project, phase=phase)}

    @app.get("/v1/workloads/{ref}", tags=["workloads"])
    async def get_workload(ref: Ref, who: str = Read) -> dict[str, Any]:
        return r.workload(views(), r.workload_id(views(), ref))

    @app.post("/v1/workloads/{ref}/scale", tags=["workloads"], openapi_extra=_body(ScaleBody))
    async def scale_workload(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Change the workload's total replicas; its deployments' shares follow."""
        key = r.workload_id(views(), ref)
        reply = await act(request, c.ScaleWorkload, {"workload_id": key}, ScaleBody, _REF_W)
        return answer(reply, lambda: r.workload(views(), key))

    @app.put("/v1/workloads/{ref}/serving", tags=["workloads"], openapi_extra=_body(ServingBody))
    async def change_serving(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Serve the workload differently: every deployment rolls out a new generation."""
        key = r.workload_id(views(), ref)
        fields = {"workload_id": key}
        reply = await act(request, c.ChangeServingConfig, fields, ServingBody, _REF_W)
        return answer(reply, lambda: r.workload(views(), key))

    @app.delete("/v1/workloads/{ref}", status_code=202, tags=["workloads"])
    async def delete_workload(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Delete the workload and its deployments; the operators remove what they rendered."""
        key = r.workload_id(views(), ref)
        reply = await act(request, c.DeleteWorkload, {"workload_id": key}, path=_REF_W)
        return answer(reply, lambda: reply["result"], 202)

    # Deployments

    @app.get("/v1/deployments", tags=["deployments"])
    async def list_deployments(
        workload: str | None = None, cluster: str | None = None, who: str = Read
    ) -> dict[str, Any]:
        return {"deployments": r.deployments(views(), workload=workload, cluster=cluster)}

    @app.get("/v1/deployments/{ref:path}", tags=["deployments"])
    async def get_deployment(ref: Ref, who: str = Read) -> dict[str, Any]:
        return r.deployment(views(), r.deployment_id(views(), ref))

    @app.post(
        "/v1/deployments/{ref:path}/authority",
        tags=["deployments"],
        openapi_extra=_body(AuthorityBody),
    )
    async def promote_authority(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Hand an observed deployment to its operator: `{"authority": "managed"}`."""
        key = r.deployment_id(views(), ref)
        fields = {"deployment_id": key}
        reply = await act(request, c.PromoteAuthority, fields, AuthorityBody, _REF_D)
        return answer(reply, lambda: r.deployment(views(), key))

    @app.post("/v1/deployments/{ref:path}/enable", tags=["deployments"])
    async def enable(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Let the operator reconcile the deployment again."""
        key = r.deployment_id(views(), ref)
        reply = await act(request, c.EnableDeployment, {"deployment_id": key}, path=_REF_D)
        return answer(reply, lambda: r.deployment(views(), key))

    @app.post("/v1/deployments/{ref:path}/disable", tags=["deployments"])
    async def disable(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Scale the deployment to zero and stop reconciling it."""
        key = r.deployment_id(views(), ref)
        reply = await act(request, c.DisableDeployment, {"deployment_id": key}, path=_REF_D)
        return answer(reply, lambda: r.deployment(views(), key))

    @app.put(
        "/v1/deployments/{ref:path}/engine-args",
        tags=["deployments"],
        openapi_extra=_body(EngineArgsBody),
    )
    async def set_engine_args(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Set the engine arguments the deployment should run with."""
        key = r.deployment_id(views(), ref)
        fields = {"deployment_id": key}
        reply = await act(request, c.SetEngineArgs, fields, EngineArgsBody, _REF_D)
        return answer(reply, lambda: r.deployment(views(), key))

    # Discovered models

    @app.get("/v1/discovered", tags=["discovered"])
    async def list_discovered(
        include_ignored: bool = False, cluster: str | None = None, who: str = Read
    ) -> dict[str, Any]:
        """Models found running that the plane did not declare; ignored ones only if asked."""
        found = r.discovered(views(), include_ignored=include_ignored, cluster=cluster)
        return {"discovered": found}

    @app.get("/v1/discovered/{ref:path}", tags=["discovered"])
    async def get_discovered(ref: Ref, who: str = Read) -> dict[str, Any]:
        view = views().get("discovered", r.discovery_id(views(), ref))
        assert view is not None  # resolved just now
        return view

    def discovery(command: type[c.Command]) -> Callable[..., Any]:
        async def act_on(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
            key = r.discovery_id(views(), ref)
            reply = await act(request, command, {"discovery_id": key}, path=_REF_X)
            return answer(reply, lambda: views().get("discovered", key))

        act_on.__doc__ = command.__doc__
        return act_on

    app.post("/v1/discovered/{ref:path}/track", tags=["discovered"], name="track")(
        discovery(c.TrackDiscovery)
    )
    app.post("/v1/discovered/{ref:path}/ignore", tags=["discovered"], name="ignore")(
        discovery(c.IgnoreDiscovery)
    )

    @app.post(
        "/v1/discovered/{ref:path}/promote",
        status_code=201,
        tags=["discovered"],
        openapi_extra=_body(PromoteBody),
    )
    async def promote(request: Request, ref: Ref, who: str = Write) -> JSONResponse:
        """Adopt the model: a workload pinned to its cluster, with one observed deployment."""
        key = r.discovery_id(views(), ref)
        reply = await act(request, c.PromoteDiscovery, {"discovery_id": key}, PromoteBody, _REF_X)
        workload = reply["result"]["workload_id"]
        location = f"/v1/workloads/{workload}"
        return answer(reply, lambda: r.workload(views(), workload), 201, Location=location)

    # Projects and quotas

    @app.get("/v1/projects", tags=["projects"])
    async def list_projects(who: str = Read) -> dict[str, Any]:
        return {"projects": r.projects(views())}

    @app.get("/v1/projects/{project}", tags=["projects"])
    async def get_project(project: Ref, who: str = Read) -> dict[str, Any]:
        return r.project(views(), project)

    @app.put(
        "/v1/projects/{project}/quotas/{device_class}",
        tags=["projects"],
        openapi_extra=_body(QuotaBody),
    )
    async def set_quota(
        request: Request, project: Ref, device_class: Ref, who: str = Write
    ) -> JSONResponse:
        """Set how many devices of one class the project's deployments may hold."""
        fields = {"project": project, "device_class": device_class}
        reply = await act(request, c.SetQuota, fields, QuotaBody)
        return answer(reply, lambda: r.project(views(), project))

    # Clusters and capacity

    @app.post("/v1/clusters", status_code=201, tags=["clusters"], openapi_extra=_body(ClusterBody))
    async def register_cluster(request: Request, who: str = Write) -> JSONResponse:
        """Make a cluster known before its operator first reports."""
        reply = await act(request, c.RegisterCluster, {}, ClusterBody)
        key = reply["result"]["cluster_id"]
        return answer(reply, lambda: r.cluster(views(), key), 201, Location=f"/v1/clusters/{key}")

    @app.get("/v1/clusters", tags=["clusters"])
    async def list_clusters(who: str = Read) -> dict[str, Any]:
        return {"clusters": r.clusters(views())}

    @app.get("/v1/clusters/{ref}", tags=["clusters"])
    async def get_cluster(ref: Ref, who: str = Read) -> dict[str, Any]:
        return r.cluster(views(), ref)

    @app.get("/v1/capacity", tags=["clusters"])
    async def capacity(
        cluster: str | None = None, device_class: str | None = None, who: str = Read
    ) -> dict[str, Any]:
        """Devices per cluster and class: total, allocated, reserved by admission, free."""
        rows = [
            row
            for row in views().all("capacity")
            if cluster in (None, row["cluster_id"]) and device_class in (None, row["device_class"])
        ]
        return {"capacity": sorted(rows, key=lambda row: (row["cluster_id"], row["device_class"]))}

    # Audit

    @app.get("/v1/events", tags=["events"])
    async def events(
        aggregate: Annotated[
            str | None,
            Query(
                max_length=433,
                description="`<kind>:<id>` (e.g. `deployment:llama--east`) or a kind",
            ),
        ] = None,
        correlation_id: Annotated[str | None, Query(max_length=128)] = None,
        since: Annotated[int, Query(ge=1, le=2**53, description="Stream sequence")] = 1,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        who: str = Read,
    ) -> dict[str, Any]:
        """History, oldest first, each event with the fields it changed (before and after);
        `next` is the `since` that continues where this page ends."""
        timeline, entries, last = Timeline(), [], None
        async for message in gateway.history(_events_subject(aggregate), since, limit):
            e, last = orjson.loads(message.data), message.seq
            if correlation_id in (None, e["event"]["correlation_id"]):
                entry = timeline.apply(e)
                if entry is not None:
                    entries.append(entry.as_dict() | {"seq": message.seq})
        return {"events": entries, "next": None if last is None else last + 1}

    return app


_REF_W = {"workload_id": "ref"}
_REF_D = {"deployment_id": "ref"}
_REF_X = {"discovery_id": "ref"}


def _events_subject(aggregate: str | None) -> str:
    if aggregate is None:
        return "wingsmith.evt.>"
    match = AGGREGATE.match(aggregate)
    if match is None:
        raise Problem(
            "validation_error",
            f"{aggregate!r} is not `<kind>:<id>` or a kind (e.g. deployment:llama--east)",
            field="query.aggregate",
        )
    kind, key = match["kind"], match["id"]
    return f"wingsmith.evt.{kind}.{key}.*" if key else f"wingsmith.evt.{kind}.>"


def _body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def _read_body(request: Request, model: type[BaseModel]) -> BaseModel:
    media = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if media != "application/json":
        raise Problem("unsupported_media_type", f"send application/json, not {media!r}")
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise Problem("payload_too_large", f"the body is {len(raw)} bytes; at most {MAX_BODY}")
    try:
        return model.model_validate_json(raw or b"null", strict=True)
    except ValidationError as e:
        raise Problem.from_validation(e) from None


def _ids(request: Request) -> dict[str, str]:
    """command_id from Idempotency-Key (or a new one), correlation_id from X-Correlation-Id."""
    ids = {"command_id": request.headers.get("idempotency-key") or f"api-{uuid.uuid4().hex}"}
    correlation = request.headers.get("x-correlation-id")
    for header, value in (
        ("Idempotency-Key", ids["command_id"]),
        ("X-Correlation-Id", correlation),
    ):
        if value is not None and not COMMAND_ID.match(value):
            raise Problem(
                "bad_request",
                f"{header} must be 1-128 letters, digits and -_.: starting with a letter or digit",
                field=f"header.{header}",
            )
    return ids | ({"correlation_id": correlation} if correlation else {})


class ProblemDocument(BaseModel):
    """RFC 7807 problem details; `field` names the field at fault, `errors` lists every one."""

    model_config = ConfigDict(extra="allow", title="Problem")
    type: str
    title: str
    status: int
    detail: str
    instance: str
    code: str
    field: str | None = None
    errors: list[dict[str, str]] | None = None


def _install_openapi(app: FastAPI) -> None:
    """The request bodies (read by the handlers themselves, strictly) as schema components, and
    every error response as a problem document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        models: list[type[BaseModel]] = [*BODIES, ProblemDocument]
        for model in models:
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        problem = {
            "description": "A problem (RFC 7807)",
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/ProblemDocument"}}},
        }
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation["responses"].pop("422", None)
                operation["responses"]["default"] = problem
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _install_errors(app: FastAPI) -> None:
    """Every error as a problem document."""

    def respond(request: Request, problem: Problem) -> JSONResponse:
        headers = {}
        if problem.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if problem.status == 503:
            headers["Retry-After"] = "1"
        return JSONResponse(
            problem.body(request.url.path), problem.status, headers, media_type=PROBLEM_JSON
        )

    @app.exception_handler(Problem)
    async def on_problem(request: Request, e: Problem) -> Response:
        return respond(request, e)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError) -> Response:
        errors = [
            {"field": ".".join(str(p) for p in err["loc"]), "problem": err["msg"]}
            for err in e.errors()
        ]
        summary = "; ".join(f"{x['field']}: {x['problem']}" for x in errors[:5])
        return respond(
            request, Problem("validation_error", summary, field=errors[0]["field"], errors=errors)
        )

    @app.exception_handler(HTTPException)
    async def on_http(request: Request, e: HTTPException) -> Response:
        code = {v: k for k, v in reversed(STATUS.items())}.get(e.status_code, "bad_request")
        return respond(request, Problem(code, str(e.detail)))

    @app.exception_handler(Exception)
    async def on_crash(request: Request, e: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return respond(request, Problem("internal", "the API failed; the error is logged"))
