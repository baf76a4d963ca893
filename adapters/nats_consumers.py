"""What the hub's consumer sweep asks of NATS: the consumers of Wingsmith's streams, the clusters
whose operators have reported, and deleting a consumer.

Permissions see subjects, never request bodies, so a read-only user can make a consumer of its
own durable (docs/nats-security.md); the sweep (services/hub/janitor.py) finds and deletes such
consumers. This module only talks to the server; which consumers go is decided elsewhere.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime

from nats.aio.client import Client
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError

from wingsmith.domain import names
from wingsmith.domain.names import OBS_STREAM

# The contract's streams, and the KV buckets (`wingsmith_<projection>`, `wingsmith_projector`),
# whose streams are `KV_<bucket>`. Other streams on a shared server are not ours to sweep.
WINGSMITH_STREAMS = frozenset(names.STREAMS)
KV_PREFIX = names.bucket_stream(names.BUCKET_PREFIX)


def is_wingsmith_stream(name: str) -> bool:
    return name in WINGSMITH_STREAMS or name.startswith(KV_PREFIX)


@dataclass(frozen=True, slots=True)
class ConsumerSeen:
    """One consumer as the server describes it, reduced to what the sweep decides on."""

    stream: str
    name: str
    durable: bool  # created with a durable name: it stays until someone deletes it
    inactive_threshold: float | None  # seconds without interest before the server removes it
    filter: str  # its subject filter(s), for the log; "" when it has none
    created: datetime
    push: bool = False  # it delivers to a subject of its own choosing (else clients pull)


def _seen(stream: str, info: ConsumerInfo) -> ConsumerSeen:
    config = info.config
    filters = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    return ConsumerSeen(
        stream=stream,
        name=info.name,
        durable=bool(config.durable_name),
        inactive_threshold=config.inactive_threshold or None,
        filter=", ".join(filters),
        created=info.created or datetime.min,
        push=bool(config.deliver_subject),
    )


class NatsConsumerAdmin:
    """The sweep's view of a NATS server, through a connection allowed the whole JetStream API
    (the hub's)."""

    def __init__(self, nc: Client) -> None:
        self._js = nc.jetstream()

    async def consumers(self) -> list[ConsumerSeen]:
        """Every consumer of every Wingsmith stream. Listing is paged by the server; a page
        past the end is empty."""
        found: list[ConsumerSeen] = []
        for stream in await self._streams():
            infos: list[ConsumerInfo] = []
            while page := await self._consumer_page(stream, len(infos)):
                infos += page
            found += (_seen(stream, info) for info in infos)
        return found

    async def _streams(self) -> list[str]:
        streams: list[str] = []
        while page := await self._js.streams_info(offset=len(streams)):
            streams += (info.config.name or "" for info in page)
        return [name for name in streams if is_wingsmith_stream(name)]

    async def _consumer_page(self, stream: str, offset: int) -> list[ConsumerInfo]:
        try:
            return await self._js.consumers_info(stream, offset=offset)
        except NotFoundError:  # the stream went away meanwhile
            return []

    async def reporting_clusters(self) -> set[str]:
        """Clusters with a heartbeat on WINGSMITH_OBS. Only that cluster's operator user (and
        the hub) may publish there, so this is the server's own word that the operator exists:
        the same configuration that grants its permissions put the message there."""
        try:
            info = await self._js.stream_info(
                OBS_STREAM, subjects_filter=names.observation_subject("*", names.HEARTBEAT)
            )
        except NotFoundError:
            return set()
        return {subject.split(".")[2] for subject in info.state.subjects or {}}

    async def delete(self, consumer: ConsumerSeen) -> bool:
        """Whether this call deleted it (False: it was gone already)."""
        with contextlib.suppress(NotFoundError):
            return bool(await self._js.delete_consumer(consumer.stream, consumer.name))
        return False
