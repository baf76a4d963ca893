"""HTTP served inside a running asyncio program: the REST API, and the operator's probes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the program that runs the server handles signals and stops it


@dataclass(frozen=True)
class Serving:
    url: str
    task: asyncio.Task[None]  # the server: it ends only if it fails


@contextlib.asynccontextmanager
async def serving_http(
    app: Any, host: str, port: int, what: str, **options: Any
) -> AsyncIterator[Serving]:
    """`app` (ASGI) on host:port (0: any free port) until the block ends, with uvicorn's
    `options`; `what` names it in an error (an address in use, say)."""
    listener = _listen(host, port, what)
    try:
        # log_config None: its lines go through the program's own logging (text or JSON)
        config = uvicorn.Config(
            app, lifespan="off", access_log=False, log_level="warning", log_config=None, **options
        )
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[listener]), name=what)
        try:
            while not server.started:
                if task.done():
                    await task  # raises what stopped it
                    raise RuntimeError(f"{what} stopped while starting")
                await asyncio.sleep(0.02)
            yield Serving(_url(listener), task)
        finally:
            server.should_exit = True  # the requests in hand are finished first
            await asyncio.gather(task, return_exceptions=True)
    finally:
        listener.close()


def _url(listener: socket.socket) -> str:
    """Where a client on this machine reaches the listener (a wildcard address is not one)."""
    host, port = listener.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if listener.family == socket.AF_INET else "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _listen(host: str, port: int, what: str) -> socket.socket:
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
        raise OSError(f"{what} cannot listen on {host}:{port}: {e.strerror}") from None
    return listener
