"""The hub's health as every program sees it: the report a hub answers on `HEALTH_SUBJECT`
(the monitor in `services/hub/monitor.py` writes it) and the question that asks for it, used by
`wingsmith ping` and the API's `/readyz`."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

import orjson
from pydantic import BaseModel, ConfigDict

from wingsmith.adapters import nats_bus
from wingsmith.domain.names import HEALTH_SUBJECT


class Status(StrEnum):
    OK = "ok"
    WARNING = "warning"  # worth a look; the hub still works
    FAILING = "failing"


class Stage(StrEnum):
    MONITOR = "monitor"
    STORE = "store"
    LEASE = "lease"
    RELAY = "relay"
    PROJECTOR = "projector"
    SCHEDULER = "scheduler"
    DEAD_LETTERS = "dead_letters"


class Check(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    stage: Stage
    status: Status
    detail: str
    position: int | None = None  # where the stage is (store position or stream sequence)
    lag: int | None = None  # how far behind it is


class DeadLetterCounts(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    total: int = 0
    by_component: dict[str, int] = {}
    last: dict[str, str] | None = None  # the latest one this hub set aside


class HealthReport(BaseModel):
    """What the hub says of itself; the wire shape of its answer on `HEALTH_SUBJECT`."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    healthy: bool
    checks: list[Check]
    dead_letters: DeadLetterCounts
    store_position: int
    at: datetime

    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status is not Status.OK]


class NoHealth(Exception):
    """No hub answered with its health."""


async def ask(nc: nats_bus.Connection, timeout: float) -> HealthReport:
    """The health of a hub (any one of them, when several serve), or `NoHealth` saying why not."""
    try:
        reply = await nats_bus.request(nc, HEALTH_SUBJECT, b"{}", timeout)
    except TimeoutError as e:
        raise NoHealth(str(e)) from None
    body = orjson.loads(reply)
    if isinstance(body, dict) and body.get("ok") is False:  # a hub too old to report health
        raise NoHealth(f"the hub does not report its health: {body.get('error')}")
    return HealthReport.model_validate_json(reply)
