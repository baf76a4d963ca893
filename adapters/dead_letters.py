"""Dead letters: what a pipeline stage cannot handle is set aside, and the rest flows on.

One event the relay cannot publish, one the projector or the scheduler cannot fold, one report
the hub cannot parse: each would stop everything behind it if the stage retried it for ever. It
is set aside instead — logged, counted, and kept on `wingsmith.dead.<component>` (stream
`WINGSMITH_DEAD`) with the reason, its original subject and its bytes, for a person to look at.

The record is a JSON body, not headers, because what is set aside is often exactly a subject or
a header value NATS would refuse. Setting the same message aside twice (a redelivery) stores it
once: its `Nats-Msg-Id` derives from the original's.
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

import nats.errors
import orjson
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from wingsmith.domain import names
from wingsmith.domain.names import DEAD_STREAM

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 2.0  # a stage never waits longer than this on NATS to set something aside


class Component(StrEnum):
    """The stages that set messages aside: the last token of `wingsmith.dead.<component>`."""

    INGEST = "ingest"  # the hub's observation intake
    PROJECTOR = "projector"
    SCHEDULER = "scheduler"


@dataclass(frozen=True, slots=True)
class Last:
    component: str
    reason: str
    subject: str
    at: datetime


def record(
    component: str, reason: str, subject: str, data: bytes, headers: Mapping[str, str] | None
) -> bytes:
    """The JSON kept for one message: UTF-8 data as text, anything else as base64."""
    body: dict[str, Any] = {
        "component": component,
        "reason": reason,
        "subject": subject,
        "headers": dict(headers or {}),
        "at": datetime.now(UTC).isoformat(),
    }
    try:
        body["data"] = data.decode()
    except UnicodeDecodeError:
        body["data_base64"] = base64.b64encode(data).decode()
    return orjson.dumps(body)


class SetAside(Protocol):
    """What a stage needs of dead letters; `DeadLetters` is one, a test's recorder another."""

    async def set_aside(
        self,
        component: str,
        reason: str,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> None: ...


class DeadLetters:
    """Sets messages aside for one process, and counts what it set aside since it started."""

    def __init__(self, nc: Client | None) -> None:
        self._nc = nc  # None: count and log only (a stage run without NATS, in tests)
        self.counts: Counter[str] = Counter()
        self.last: Last | None = None

    async def set_aside(
        self,
        component: str,
        reason: str,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> None:
        """Keep one message with why it could not be handled; never raises, never blocks for
        longer than `PUBLISH_TIMEOUT` (a NATS outage costs the record, not the pipeline)."""
        self.counts[component] += 1
        self.last = Last(component, reason, subject, datetime.now(UTC))
        log.warning("%s: set aside %r: %s", component, subject, reason)
        if self._nc is None:
            return
        dedup = {"Nats-Msg-Id": f"dead:{component}:{msg_id}"} if msg_id else None
        try:
            await self._nc.jetstream().publish(
                names.dead_subject(component),
                record(component, reason, subject, data, headers),
                stream=DEAD_STREAM,
                headers=dedup,
                timeout=PUBLISH_TIMEOUT,
            )
        except (nats.errors.Error, TimeoutError) as e:
            log.error("%s: could not keep the message set aside: %s", component, e)

    def snapshot(self) -> dict[str, Any]:
        """What this process set aside: a total, per component, and the latest one."""
        last = self.last
        return {
            "total": sum(self.counts.values()),
            "by_component": dict(self.counts),
            "last": None
            if last is None
            else {
                "component": last.component,
                "reason": last.reason,
                "subject": last.subject,
                "at": last.at.isoformat(),
            },
        }


async def stored(nc: Client) -> dict[str, int]:
    """How many dead letters the stream holds per component, whichever process set them aside."""
    try:
        info = await nc.jetstream().stream_info(
            DEAD_STREAM, subjects_filter=names.every(names.DEAD)
        )
    except NotFoundError:
        return {}
    subjects = info.state.subjects or {}
    return {subject.removeprefix(f"{names.DEAD}."): n for subject, n in subjects.items()}
