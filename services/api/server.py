"""Serve the REST API inside a running asyncio program (the hub's, or `wingsmith api`'s)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client import CollectorRegistry

from wingsmith.adapters import nats_bus
from wingsmith.services.api.app import Tokens, create_app
from wingsmith.services.api.gateway import Gateway
from wingsmith.services.api.protocol import HttpLimits, protocol_for
from wingsmith.services.config import Settings, connect
from wingsmith.services.listening import Serving, serving_http
from wingsmith.services.metrics import new_registry
from wingsmith.services.tasks import cancel_and_wait


@contextlib.asynccontextmanager
async def serving(
    nc: nats_bus.Connection,
    tokens: Tokens,
    host: str,
    port: int,
    limits: HttpLimits,
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[Serving]:
    """The API on host:port (0: any free port) until the block ends, once its views are
    loaded; slow clients and the number of connections held to `limits`; its metrics in
    `registry` (by default one of its own), served on /metrics."""
    gateway = Gateway(nc)
    mirror = asyncio.create_task(gateway.run(), name="wingsmith-api-views")
    try:
        async with asyncio.timeout(60):
            await gateway.ready.wait()
        app = create_app(gateway, tokens, registry if registry is not None else new_registry())
        # no WebSocket endpoints: no connection leaves the deadlines by upgrading
        async with serving_http(
            app, host, port, "the API", http=protocol_for(limits), ws="none"
        ) as api:
            yield api
    finally:
        await cancel_and_wait(mirror)


@contextlib.asynccontextmanager
async def running_api(
    settings: Settings,
    url: str | None = None,
    *,
    local_token: bool = False,
    registry: CollectorRegistry | None = None,
) -> AsyncIterator[Serving]:
    """The REST API on `settings.api_listen`, on its own NATS connection, until the block ends.
    With `local_token` and no tokens configured, it accepts the token kept in the data
    directory (made on first use), so the CLI on this machine can use it."""
    writers, readers = dict(settings.api_tokens), dict(settings.api_read_tokens)
    if not writers and not readers:
        if not local_token:
            raise RuntimeError("set WINGSMITH_API_TOKENS (NAME:TOKEN,...) to serve the API")
        writers[_local_token(settings.api_token_file)] = "local"
    nc = await connect(settings, "wingsmith-api", url)
    try:
        host, port = settings.api_listen
        limits = HttpLimits(
            settings.api_header_timeout, settings.api_body_timeout, settings.api_max_connections
        )
        tokens = Tokens(writers, readers)
        async with serving(nc, tokens, host, port, limits, registry) as api:
            settings.api_url_file.parent.mkdir(parents=True, exist_ok=True)
            settings.api_url_file.write_text(api.url)
            try:
                yield api
            finally:
                settings.api_url_file.unlink(missing_ok=True)
    finally:
        await nc.close()


def _local_token(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return path.read_text().strip()
