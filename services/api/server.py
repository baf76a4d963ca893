"""Serve the REST API inside a running asyncio program (the hub's, or `wingsmith api`'s)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn

from adapters import nats_bus
from services.api.app import Tokens, create_app
from services.api.gateway import Gateway


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the program that runs the API handles signals and stops it


@contextlib.asynccontextmanager
async def serving(
    nc: nats_bus.Connection, tokens: Tokens, host: str, port: int
) -> AsyncIterator[str]:
    """The API on host:port (0: any free port) until the block ends; yields its base URL."""
    gateway = Gateway(nc)
    mirror = asyncio.create_task(gateway.run(), name="wingsmith-api-views")
    async with asyncio.timeout(60):  # answer nothing before the views are there
        await gateway.ready.wait()
    listener = socket.create_server((host, port), reuse_port=False)
    config = uvicorn.Config(
        create_app(gateway, tokens), lifespan="off", access_log=False, log_level="warning"
    )
    server = _Server(config)
    serve = asyncio.create_task(server.serve(sockets=[listener]), name="wingsmith-api")
    try:
        while not server.started:
            if serve.done():
                await serve  # raises what stopped it
                raise RuntimeError("the API server stopped while starting")
            await asyncio.sleep(0.02)
        bound_host, bound_port = listener.getsockname()[:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        server.should_exit = True
        await asyncio.gather(serve, return_exceptions=True)
        mirror.cancel()
        await asyncio.gather(mirror, return_exceptions=True)
        listener.close()
