"""Serve the REST API inside a running asyncio program (the hub's, or `wingsmith api`'s)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from wingsmith.adapters import nats_bus
from wingsmith.services.api.app import Tokens, create_app
from wingsmith.services.api.gateway import Gateway
from wingsmith.services.api.protocol import HttpLimits, protocol_for
from wingsmith.services.config import Settings, connect
from wingsmith.services.tasks import cancel_and_wait


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the program that runs the API handles signals and stops it


@dataclass(frozen=True)
class Serving:
    url: str
    task: asyncio.Task[None]  # the server: it ends only if it fails


@contextlib.asynccontextmanager
async def serving(
    nc: nats_bus.Connection, tokens: Tokens, host: str, port: int, limits: HttpLimits
) -> AsyncIterator[Serving]:
    """The API on host:port (0: any free port) until the block ends, once its views are
    loaded; slow clients and the number of connections held to `limits`."""
    gateway = Gateway(nc)
    async with contextlib.AsyncExitStack() as stack:
        mirror = asyncio.create_task(gateway.run(), name="wingsmith-api-views")
        stack.push_async_callback(cancel_and_wait, mirror)
        async with asyncio.timeout(60):
            await gateway.ready.wait()
        listener = _listen(host, port)
        stack.callback(listener.close)
        config = uvicorn.Config(
            create_app(gateway, tokens),
            http=protocol_for(limits),
            ws="none",  # no WebSocket endpoints: no connection leaves the deadlines by upgrading
            lifespan="off",
            access_log=False,
            log_level="warning",
        )
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[listener]), name="wingsmith-api")
        stack.push_async_callback(_stopped, server, task)
        while not server.started:
            if task.done():
                await task  # raises what stopped it
                raise RuntimeError("the API server stopped while starting")
            await asyncio.sleep(0.02)
        yield Serving(_url(listener), task)


async def _stopped(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    """Finish the requests in hand, then stop."""
    server.should_exit = True
    await asyncio.gather(task, return_exceptions=True)


def _url(listener: socket.socket) -> str:
    """Where a client on this machine reaches the listener (a wildcard address is not one)."""
    host, port = listener.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if listener.family == socket.AF_INET else "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket; an address in use is an OSError here, not uvicorn's exit. Made
    with its protocol named, so asyncio turns Nagle off on every connection (else each response
    waits 40 ms for the client's delayed acknowledgement)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(1024)
    except OSError as e:
        listener.close()
        raise OSError(f"the API cannot listen on {host}:{port}: {e.strerror}") from None
    return listener


@contextlib.asynccontextmanager
async def running_api(
    settings: Settings, url: str | None = None, *, local_token: bool = False
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
        async with serving(nc, Tokens(writers, readers), host, port, limits) as api:
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
