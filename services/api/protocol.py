"""HTTP/1.1 connections with deadlines and a limit: uvicorn's h11 protocol, plus what it lacks.

uvicorn closes an idle keep-alive connection, but a client that sends its request slowly holds
its connection for as long as it likes: a request head dribbled a byte at a time, or a body that
never ends ("slowloris"). Enough of them and nobody else is served. Here every connection has a
deadline for what it is waiting for:

- the request head (request line and headers) must be complete within `header_timeout` of the
  connection opening, or of the first byte of a later request on it;
- the body within `body_timeout` of its head.

A connection that misses one is answered `408` (when something of the request arrived and
nothing was answered yet) and closed. Beyond `max_connections` open at once, a connection's
requests are answered `503` and it is closed, so the ones within the limit are still served.
A client that goes away in the middle of its body is one INFO line, not an error.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import orjson
from starlette.responses import JSONResponse
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.h11_impl import H11Protocol

from wingsmith.services.api.problems import PROBLEM_JSON, Problem

log = logging.getLogger(__name__)

WARN_EVERY = 10.0  # seconds between two warnings that the connection limit is reached


@dataclass(frozen=True)
class HttpLimits:
    header_timeout: float  # seconds for a whole request head
    body_timeout: float  # seconds for a whole body, from its head
    max_connections: int  # open at once; more are answered 503


class Stage(enum.Enum):
    """What a connection waits for from its client."""

    HEAD = "request head"
    BODY = "request body"


def protocol_for(limits: HttpLimits) -> type[H11Protocol]:
    """The protocol class uvicorn makes each connection with, bound to `limits`."""

    class Bounded(BoundedH11Protocol):
        LIMITS = limits
        warned = [0.0]  # when this server last warned of its limit

    return Bounded


class BoundedH11Protocol(H11Protocol):
    """One connection: uvicorn's, with a deadline armed for the stage it waits in."""

    LIMITS: ClassVar[HttpLimits]
    warned: ClassVar[list[float]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting: Stage | None = None
        self._timed_out = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.LIMITS.max_connections:
            self.app = _too_many(self.LIMITS.max_connections)  # this connection only
            self._warn_limit()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiting is Stage.BODY and not self._timed_out:
            log.info("%s went away before sending all of %s's body", self._peer(), _request(self))
        self._cancel()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._watch()

    def _stage(self) -> Stage | None:
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            return Stage.BODY
        # a new connection, or a later request that has begun: an idle keep-alive connection is
        # uvicorn's to close (timeout_keep_alive)
        if state is h11.IDLE and (self.cycle is None or self.conn.trailing_data[0]):
            return Stage.HEAD
        return None

    def _watch(self) -> None:
        """Arm the deadline of the stage the connection is now in (none: cancel it)."""
        stage = None if self.transport.is_closing() else self._stage()
        if stage is self._waiting:
            return
        self._cancel()
        self._waiting = stage
        if stage is not None:
            self._deadline = self.loop.call_later(self._timeout(stage), self._expired, stage)

    def _timeout(self, stage: Stage) -> float:
        if stage is Stage.HEAD:
            return self.LIMITS.header_timeout
        return self.LIMITS.body_timeout

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._waiting = None, None

    def _expired(self, stage: Stage) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self._timed_out = True
        log.info(
            "%s: closing the connection: its %s did not arrive within %g s",
            self._peer(),
            stage.value,
            self._timeout(stage),
        )
        cycle = self.cycle if stage is Stage.BODY else None
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            cycle.keep_alive = False  # the answer is on its way: close once it is sent
            return
        if cycle is not None and not cycle.response_started:
            cycle.disconnected = True  # the handler reading the body sees the client gone
            cycle.message_event.set()
            self.transport.write(_timed_out(stage, self._timeout(stage), cycle.scope["path"]))
        elif stage is Stage.HEAD and self.conn.trailing_data[0]:
            self.transport.write(_timed_out(stage, self._timeout(stage), ""))
        self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"

    def _warn_limit(self) -> None:
        now = time.monotonic()
        if now - self.warned[0] >= WARN_EVERY:
            self.warned[0] = now
            log.warning(
                "%d connections open, over the limit of %d (WINGSMITH_API_MAX_CONNECTIONS): "
                "answering 503 to the newest",
                len(self.connections),
                self.LIMITS.max_connections,
            )


def _request(protocol: H11Protocol) -> str:
    scope = protocol.scope
    return f"{scope['method']} {scope['path']}" if scope else "its request"


def _timed_out(stage: Stage, seconds: float, path: str) -> bytes:
    """A whole `408` response, written outside h11: the connection closes right after it."""
    problem = Problem("request_timeout", f"the {stage.value} did not arrive within {seconds:g} s")
    body = orjson.dumps(problem.body(path))
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        f"content-type: {PROBLEM_JSON}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def _too_many(limit: int) -> Any:
    """The ASGI app of a connection over the limit: every request is answered 503."""

    async def refuse(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        problem = Problem("unavailable", f"the API serves {limit} connections at once; retry")
        headers = {"Retry-After": "1", "Connection": "close"}
        body = problem.body(scope.get("path", "")) if scope["type"] == "http" else {}
        response = JSONResponse(body, 503, headers, media_type=PROBLEM_JSON)
        await response(scope, receive, send)  # type: ignore[arg-type]

    return refuse
