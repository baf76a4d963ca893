"""The operator's probes, for the kubelet and for people: `/healthz` answers 200 while the
operator runs; `/readyz` answers 200 once it can tell its cluster's truth (every informer has
listed what it watches) and NATS is connected. Each answers JSON naming every check, so a
probe that fails says which one: `{"ok": false, "checks": {"nats_connected": true, ...}}`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Checks = Callable[[], dict[str, bool]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def probes_app(alive: Checks, ready: Checks) -> Callable[..., Awaitable[None]]:
    """An ASGI app with the two probes; `alive` and `ready` give their checks."""
    paths = {"/healthz": alive, "/readyz": ready}

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Send) -> None:
        checks = paths.get(scope.get("path", ""))
        if scope.get("method") not in ("GET", "HEAD"):
            await _answer(send, 405, {"error": "only GET and HEAD"})
        elif checks is None:
            await _answer(send, 404, {"error": "the probes are /healthz and /readyz"})
        else:
            found = checks()
            ok = all(found.values())
            await _answer(send, 200 if ok else 503, {"ok": ok, "checks": found})

    return app


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})
