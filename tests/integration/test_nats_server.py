"""The embedded nats-server keeps its address across restarts, so clients given it once (an
operator, the CLI) reconnect by themselves; it moves only when another program holds the port,
and says so."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_server import PORT_FILE, EmbeddedNatsServer

from .conftest import wait_for


@contextlib.contextmanager
def held(port: int) -> Iterator[None]:
    """Another program listening on 127.0.0.1:port."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        yield


async def ran_once(directory: Path) -> int:
    async with EmbeddedNatsServer(directory) as server:
        return server.port


async def test_a_close_waiter_the_client_cancelled_itself_does_not_cancel_the_closer(
    nats_server: EmbeddedNatsServer,
) -> None:
    """nats-py can cancel its own socket's close waiter (its reading task cancelled while it
    waits for the socket to close, during a reconnect), and the next `close()` then raised
    CancelledError at a caller nobody cancelled: a hub on its way out stopped there. The
    client's race is rare; here the waiter is cancelled directly, as the race leaves it."""
    nc = await nats_bus.connect(nats_server.url, "closing")
    nc._transport._io_writer._protocol._closed.cancel()  # type: ignore[union-attr]
    await nc.close()
    assert nc.is_closed


async def test_a_restarted_server_is_back_on_its_port_and_a_client_reconnects(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "nats"
    first = EmbeddedNatsServer(directory)
    await first.start()
    nc = await nats_bus.connect(first.url, "reconnecting")
    try:
        await first.stop()
        second = EmbeddedNatsServer(directory)
        assert second.port == first.port
        async with second:

            async def reconnected() -> bool:
                return bool(nc.is_connected)

            await wait_for(reconnected, 30, "the client to reconnect")

            async def echo(msg: Msg) -> None:
                await msg.respond(msg.data)

            await nc.subscribe("echo", cb=echo)
            assert (await nc.request("echo", b"still here", timeout=5)).data == b"still here"
    finally:
        await nc.close()
        await first.stop()


async def test_a_port_taken_meanwhile_is_replaced_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "nats"
    previous = await ran_once(directory)
    with held(previous):
        async with EmbeddedNatsServer(directory) as server:
            assert server.port != previous
            nc = await nats.connect(server.url)  # it serves on the new port
            await nc.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(previous) in w and str(server.port) in w for w in warnings), warnings
    assert (directory / PORT_FILE).read_text().strip() == str(server.port)
    assert await ran_once(directory) == server.port  # the new port is kept from then on


async def test_a_port_taken_between_choosing_and_listening_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "nats"
    previous = await ran_once(directory)
    server = EmbeddedNatsServer(directory)
    assert server.port == previous  # free when chosen
    with held(previous):
        async with server:  # nats-server cannot listen there: it moves
            assert server.port != previous
            nc = await nats.connect(server.url)
            await nc.close()
    assert any(str(previous) in r.getMessage() for r in caplog.records if r.levelno >= 30)
