"""The REST API's metrics: requests by method, route and status, and how long they took.

The route is the path's template (`/v1/workloads/{workload_id}`), never the path itself, so
the labels stay few whatever ids are asked for; a path no route matches counts as
`unmatched`. Server errors (5xx) and refusals (4xx) are queries over the status label.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from wingsmith.services.metrics import Children

Scope = MutableMapping[str, Any]
App = Callable[[Scope, Any, Any], Awaitable[None]]
UNMATCHED = "unmatched"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RequestMetrics:
    """ASGI middleware that counts and times each HTTP request to the app it wraps."""

    def __init__(self, app: App, registry: CollectorRegistry) -> None:
        self.app = app
        requests = Counter(
            "wingsmith_api_requests",
            "HTTP requests answered by the REST API, by method, route and status code.",
            ["method", "route", "status"],
            registry=registry,
        )
        duration = Histogram(
            "wingsmith_api_request_duration_seconds",
            "From a request's arrival to its response's start, by method and route.",
            ["method", "route"],
            buckets=BUCKETS,
            registry=registry,
        )
        self._requests: Children[tuple[str, str, str], Counter] = Children(
            lambda key: requests.labels(*key)
        )
        self._duration: Children[tuple[str, str], Histogram] = Children(
            lambda key: duration.labels(*key)
        )

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app fails before answering

        async def sending(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", UNMATCHED)
            method = scope.get("method", "")
            self._requests[(method, route, str(status))].inc()
            self._duration[(method, route)].observe(time.perf_counter() - started)
