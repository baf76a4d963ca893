"""Prometheus metrics: a registry per program, served on /metrics (docs/operations.md#metrics).

Each program (the hub, its projector, the API, an operator) keeps its families in a registry
of its own, made here with the process's own (CPU, memory, file descriptors, garbage
collection), so two programs in one process (`wingsmith up`, a test) never share or clash.
Families that count what happens are incremented where it happens; those that tell a state
(positions, views) are read from the state when scraped, by a collector, so nothing is kept
twice. The exposition runs in the program's event loop: a collector reads state that only
that loop changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any, Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_asgi_app,
)

from wingsmith.services.listening import serving_http

PATH = "/metrics"

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")


def new_registry() -> CollectorRegistry:
    """A program's registry, with the process's own families in it."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class Children(Generic[K, C]):
    """A labelled family's children by key, made once each: `family.labels(...)` checks and
    joins its label values on every call, too much for the command path."""

    def __init__(self, make: Callable[[K], C]) -> None:
        self._make = make
        self._made: dict[K, C] = {}

    def __getitem__(self, key: K) -> C:
        child = self._made.get(key)
        if child is None:
            child = self._made[key] = self._make(key)
        return child


@contextlib.asynccontextmanager
async def serving_metrics(
    registry: CollectorRegistry, listen: tuple[str, int] | None, what: str
) -> AsyncIterator[str | None]:
    """`registry` on http://host:port/metrics until the block ends (port 0: any free one);
    yields that URL, or None when `listen` is None (metrics not served)."""
    if listen is None:
        yield None
        return
    host, port = listen
    async with serving_http(
        only_metrics(registry), host, port, f"{what}'s metrics", ws="none"
    ) as served:
        yield f"{served.url}{PATH}"


def only_metrics(registry: CollectorRegistry) -> Callable[..., Any]:
    """An ASGI app that serves `registry` on /metrics and nothing else."""
    exposition = make_asgi_app(registry)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("path") == PATH:
            await exposition(scope, receive, send)
            return
        body = b"only /metrics here\n"
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
