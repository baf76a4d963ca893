"""Following a stream across restarts of the hub's embedded nats-server.

A reader of the embedded server (no WINGSMITH_NATS_URL) finds it through `nats.url` in the data
directory. A restarted hub brings the server back on the port it had when that port is free, and
the connection reconnects by itself; when another program took the port meanwhile the server
comes back on a new one, which the connection never tries. So while its connection is down a
follower watches `nats.url`, and once it names another server, connects there and reads on from
where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncGenerator, Callable

from wingsmith.adapters import nats_bus
from wingsmith.services.config import Settings, connect
from wingsmith.services.tasks import cancel_and_wait

log = logging.getLogger(__name__)

MOVED_POLL = 0.5  # seconds between looks at nats.url while the connection is down

Read = Callable[[nats_bus.Connection, nats_bus.Start], AsyncGenerator[nats_bus.StreamMessage, None]]
# where to read from on a new server, given the last message read
Resume = Callable[[nats_bus.StreamMessage], nats_bus.Start]


def after(message: nats_bus.StreamMessage) -> nats_bus.Start:
    """Resume with the message after `message`: nothing read twice, nothing missed."""
    return message.seq + 1


async def following(
    settings: Settings, read: Read, start: nats_bus.Start, resume: Resume = after
) -> AsyncGenerator[nats_bus.StreamMessage, None]:
    """What `read` yields from `start`, forever, on whichever server `nats.url` names; after a
    move it reads again from `resume(the last message read)` (from `start`, if none was)."""
    url = settings.resolved_nats_url()
    while True:
        nc = await connect(settings, "wingsmith-cli", url)
        moved = asyncio.create_task(_moved(settings, nc, url), name="wingsmith-cli-moved")
        try:
            async with contextlib.aclosing(_until(read(nc, start), moved)) as messages:
                async for message in messages:
                    start = resume(message)
                    yield message
            if not moved.done():
                return  # the stream ended: a reader that does not follow
            url = moved.result()
        finally:
            await cancel_and_wait(moved)
            await nc.close()
        print(f"wingsmith: the hub's NATS server moved; following it at {url}", file=sys.stderr)


async def _moved(settings: Settings, nc: nats_bus.Connection, url: str) -> str:
    """The URL of the embedded server once `nats.url` names another one while `nc` is down;
    never, with a configured WINGSMITH_NATS_URL (the client reconnects to what it names)."""
    if settings.nats_url:
        await asyncio.Event().wait()
    while True:
        await asyncio.sleep(MOVED_POLL)
        if nc.is_connected:
            continue
        with contextlib.suppress(OSError):  # absent while the hub is down
            named = settings.url_file.read_text().strip()
            if named and named != url:
                return named


async def _until(
    messages: AsyncGenerator[nats_bus.StreamMessage, None], moved: asyncio.Task[str]
) -> AsyncGenerator[nats_bus.StreamMessage, None]:
    """`messages` until they end or `moved` completes; the read waiting then is cancelled."""
    try:
        while True:
            step = asyncio.ensure_future(anext(messages))
            await asyncio.wait([step, moved], return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                await cancel_and_wait(step)  # the reader ends with it
                return
            try:
                message = step.result()
            except StopAsyncIteration:
                return
            yield message
    finally:
        with contextlib.suppress(RuntimeError):  # one ended by a cancellation is closed already
            await messages.aclose()
