"""The one place that wires the hub together: nats-server, store, command service, relay."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from adapters import nats_bus
from adapters.nats_server import EmbeddedNatsServer
from adapters.store import Notification, StoreThread, store_env
from services.config import Settings
from services.hub import CommandService
from services.relay import Relay

log = logging.getLogger(__name__)


@dataclass
class Hub:
    nats_url: str
    nc: nats_bus.Connection
    store: StoreThread
    commands: CommandService
    relay: Relay | None
    tasks: list[asyncio.Task[None]]  # run until shutdown; one ending early is a failure


@contextlib.asynccontextmanager
async def embedded_or_given_nats(settings: Settings) -> AsyncIterator[str]:
    """The configured NATS URL, or an embedded nats-server for as long as the block runs."""
    if settings.nats_url:
        yield settings.nats_url
        return
    async with EmbeddedNatsServer(settings.data_dir / "nats") as server:
        settings.url_file.write_text(server.url)
        try:
            yield server.url
        finally:
            settings.url_file.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def running_hub(settings: Settings) -> AsyncIterator[Hub]:
    """Serve commands until the block ends; then stop intake, answer what was queued, let the
    relay publish what was committed, and close."""
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(embedded_or_given_nats(settings))
        nc = await nats_bus.connect(url, "wingsmith-hub")
        stack.push_async_callback(nc.close)
        await nats_bus.ensure_streams(nc, settings.stream_replicas)
        store = await StoreThread.open(store_env(settings.store_url, settings.data_dir))
        stack.push_async_callback(store.close)

        relay: Relay | None = None
        on_committed: Callable[[list[Notification]], None] = _ignore
        if settings.relay:
            publisher = nats_bus.EventPublisher(nc)
            await publisher.start()
            stack.push_async_callback(publisher.close)
            relay = Relay(store, publisher)
            on_committed = relay.feed
        commands = CommandService(
            store, nats_bus.NatsPublisher(nc), on_committed, settings.max_command_bytes
        )
        tasks = [asyncio.create_task(commands.run(), name="wingsmith-commands")]
        if relay is not None:
            tasks.append(asyncio.create_task(relay.run(), name="wingsmith-relay"))
        subscription = await nats_bus.subscribe_commands(nc, commands.submit)
        try:
            yield Hub(url, nc, store, commands, relay, tasks)
        finally:
            await _shut_down(subscription, commands, relay, tasks)


async def _shut_down(
    subscription: nats_bus.Subscription,
    commands: CommandService,
    relay: Relay | None,
    tasks: list[asyncio.Task[None]],
) -> None:
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()
    commands.close()
    async with asyncio.timeout(30):
        await asyncio.gather(tasks[0], return_exceptions=True)  # a failure was reported already
    if relay is not None and not tasks[-1].done():
        with contextlib.suppress(TimeoutError):  # an unreachable server: a restart catches up
            async with asyncio.timeout(10):
                await relay.idle()
    for task in tasks[1:]:
        task.cancel()
    await asyncio.gather(*tasks[1:], return_exceptions=True)


def _ignore(_: object) -> None:
    return None
