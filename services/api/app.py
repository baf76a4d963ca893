"""The REST API (`/v1`): the command API and the projections' views over HTTP.

Every write is one of the hub's commands, sent over NATS like any other client's, so it is
validated, idempotent and recorded in the event history the same way; every read is a
projection view. Request bodies are the commands' own fields (strictly validated: no coercion,
no unknown fields) and errors are RFC 7807 problems naming the field at fault.
`Idempotency-Key` becomes the command_id (resending with it has the effect of once) and
`X-Correlation-Id` the correlation id; without a key, the command_id names the token's holder.
A request without a valid bearer token is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from wingsmith.services import health
from wingsmith.services.api import docs, routes
from wingsmith.services.api.gateway import Gateway
from wingsmith.services.api.metrics import RequestMetrics
from wingsmith.services.api.problems import PROBLEM_JSON, STATUS, Problem, ProblemDocument

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens by the name they stand for: writers may do everything, readers only
    read. Kept as SHA-256 digests, so comparing them takes the same time whatever is sent."""

    writers: Mapping[str, str]  # token -> name
    readers: Mapping[str, str]
    _digests: dict[bytes, tuple[str, bool]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        digests = {_digest(t): (name, False) for t, name in self.readers.items()}
        digests |= {_digest(t): (name, True) for t, name in self.writers.items()}
        object.__setattr__(self, "_digests", digests)

    def check(self, token: str | None, *, write: bool) -> str:
        """The name the token stands for, if it may read (or write)."""
        if not token:
            raise Problem("unauthorized", "send Authorization: Bearer <token>")
        sent, found = _digest(token), None
        for known, holder in self._digests.items():
            if hmac.compare_digest(known, sent):
                found = holder
        if found is None:
            raise Problem("unauthorized", "the bearer token is not valid")
        name, may_write = found
        if write and not may_write:
            raise Problem("forbidden", f"token {name!r} may only read")
        return name


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def create_app(
    gateway: Gateway, tokens: Tokens, registry: CollectorRegistry | None = None
) -> FastAPI:
    """The API over `gateway`, open to `tokens`; its metrics, and whatever else `registry`
    holds (the hub's, in `wingsmith up`), on /metrics."""
    app = FastAPI(
        title="Wingsmith",
        version="1",
        description=__doc__,
        openapi_url="/openapi.json",
        docs_url=None,  # ours, served from this process: services.api.docs
        redoc_url=None,
    )
    app.state.tokens, app.state.gateway = tokens, gateway
    app.include_router(routes.router)
    app.include_router(docs.router)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        """Live: this process serves HTTP and its NATS client has not given up (a restart is
        the cure for neither being true). Says nothing of the hub."""
        alive = not gateway.nc.is_closed
        return JSONResponse({"status": "ok" if alive else "nats closed"}, 200 if alive else 503)

    hub_health = HubHealth(gateway)

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        """Ready: a write sent now is stored and shows in the views: NATS connected, the views
        mirrored, and the hub healthy (its store, relay, projector and scheduler)."""
        body = await readiness(gateway, hub_health)
        return JSONResponse(body, 200 if body["ready"] else 503)

    if registry is not None:
        _install_metrics(app, registry)
    _install_errors(app)
    _install_openapi(app)
    return app


def _install_metrics(app: FastAPI, registry: CollectorRegistry) -> None:
    """/metrics, without a token, as /healthz: Prometheus scrapes it (it names routes, no
    resource, and in `wingsmith up` the hub's families: projects, clusters)."""
    app.add_middleware(RequestMetrics, registry=registry)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


HUB_HEALTH_TIMEOUT = 2.0
HUB_HEALTH_TTL = 1.0  # seconds one answer of the hub serves /readyz


class HubHealth:
    """The hub's health report for /readyz, which needs no token: the hub is asked at most
    once a `HUB_HEALTH_TTL`, however often /readyz is called, and callers meanwhile wait for
    that one answer rather than each asking."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._lock = asyncio.Lock()
        self._answer: health.HealthReport | health.NoHealth | None = None
        self._at = 0.0

    async def report(self) -> health.HealthReport:
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self._answer is None or loop.time() - self._at >= HUB_HEALTH_TTL:
                try:
                    self._answer = await health.ask(self._gateway.nc, HUB_HEALTH_TIMEOUT)
                except health.NoHealth as e:
                    self._answer = e
                self._at = loop.time()
        if isinstance(self._answer, health.NoHealth):
            raise self._answer
        return self._answer


async def readiness(gateway: Gateway, hub_health: HubHealth) -> dict[str, Any]:
    """The API's own state and the hub's health report, and whether both are good."""
    problems = []
    if not gateway.nc.is_connected:
        problems.append("the API is not connected to NATS")
    if not gateway.ready.is_set():
        problems.append("the API has not mirrored the views yet")
    hub: dict[str, Any] | None = None
    if gateway.nc.is_connected:
        try:
            report = await hub_health.report()
        except health.NoHealth as e:
            problems.append(str(e))
        else:
            hub = report.model_dump(mode="json")
            problems += [
                f"hub {c.stage}: {c.detail}"
                for c in report.problems()
                if c.status is health.Status.FAILING
            ]
    return {"ready": not problems, "problems": problems, "hub": hub}


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
        models: list[type[BaseModel]] = [*routes.BODIES, ProblemDocument]
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
                responses = operation["responses"]
                if "HTTPValidationError" in str(responses.get("422")):  # FastAPI's, not ours
                    del responses["422"]
                responses["default"] = problem
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


STATUS_CODES = {status: code for code, status in reversed(STATUS.items())}


def _install_errors(app: FastAPI) -> None:
    """Every error as a problem document."""

    def respond(
        request: Request, problem: Problem, headers: Mapping[str, str] | None = None
    ) -> Response:
        extra = dict(headers or {})
        if problem.status == 401:
            extra["WWW-Authenticate"] = "Bearer"
        if problem.status == 503:  # the hub's hint, in whole seconds, or one second
            extra["Retry-After"] = str(-(-int(problem.details.get("retry_after_ms", 1000)) // 1000))
        body = problem.body(request.url.path)
        return JSONResponse(body, problem.status, extra, media_type=PROBLEM_JSON)

    @app.exception_handler(Problem)
    async def on_problem(request: Request, e: Problem) -> Response:
        return respond(request, e)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError) -> Response:
        return respond(request, Problem.invalid((err["loc"], err["msg"]) for err in e.errors()))

    @app.exception_handler(HTTPException)
    async def on_http(request: Request, e: HTTPException) -> Response:
        code = STATUS_CODES.get(e.status_code, "bad_request")
        return respond(request, Problem(code, str(e.detail)), e.headers or {})

    @app.exception_handler(ClientDisconnect)
    async def on_gone(request: Request, e: ClientDisconnect) -> Response:
        # the client went away while sending its body: nothing was sent to the hub, nobody is
        # left to answer, and the connection has logged it (services.api.protocol)
        return Response(status_code=400)

    @app.exception_handler(Exception)
    async def on_crash(request: Request, e: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return respond(request, Problem("internal", "the API failed; the error is logged"))
