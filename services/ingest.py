"""Observations in: what operators publish on `wingsmith.obs.<cluster>.<kind>` becomes commands
on the cluster's aggregates, run by the hub like any other, in the order they were published.

Each observation is handled at most once in effect: its command id comes from the operator's
`Nats-Msg-Id`, so a redelivery or a resend is a duplicate, and the handlers themselves ignore
what they already know.

A report is trusted no more than a client's command: it is parsed as strict JSON (no repeated
key, no type coercion), within a size limit, against the kind's model with its ranges and
bounded lists, and its names are checked before they can become subject tokens or keys. One
that fails — or that the hub's handlers refuse, e.g. devices on a node the cluster never
reported — is logged, counted and set aside on `wingsmith.dead.ingest` with the reason (the
field and the problem), and nothing is stored; the reports behind it flow on.

Each cluster's reports pass a token bucket: a runaway operator is slowed (its excess is
redelivered later, not dropped) while every other cluster's reports go through as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from adapters.nats_bus import MAX_REPORT, OBS_PREFIX, Delivery
from services import commands as c
from services.wire import DuplicateKey, loads

log = logging.getLogger(__name__)

KINDS: dict[str, type[c.Command]] = {
    "replica": c.ObserveReplica,
    "deployment": c.ObserveDeployment,
    "inventory": c.ReportInventory,
    "discovery": c.ObserveDiscovery,
    "heartbeat": c.ObserveHeartbeat,
    "action": c.ObserveAction,
}
RETRY = {"unavailable", "conflict", "internal"}  # the hub could not handle it now
_ID_UNSAFE = re.compile(r"[^-_.:A-Za-z0-9]")
# The stream refuses a larger report at publish; checked again here, as every limit is.
MAX_REPORT_BYTES = MAX_REPORT
COMPONENT = "ingest"  # what the dead letters are filed under


class Refused(ValueError):
    """An observation that can never be handled; the message names the field and the problem."""


def parse(subject: str, data: bytes, msg_id: str) -> c.Command:
    """The command an observation asks for; `Refused` names what is wrong with it."""
    parts = subject.split(".")
    if len(parts) != 4 or ".".join(parts[:2]) != OBS_PREFIX or parts[3] not in KINDS:
        raise Refused(f"{subject}: not an observation subject (kinds: {', '.join(KINDS)})")
    cluster_id, kind = parts[2], parts[3]
    body = _object(subject, data)
    if body.get("cluster_id") != cluster_id:
        raise Refused(
            f"{subject}: cluster_id: {body.get('cluster_id')!r} is not the subject's cluster "
            f"{cluster_id!r}"
        )
    if "command_id" in body or "correlation_id" in body:
        raise Refused(f"{subject}: command_id: the hub sets it from the message id")
    try:
        strict = orjson.dumps(body | {"command_id": command_id_of(msg_id)})
        return KINDS[kind].model_validate_json(strict, strict=True)
    except orjson.JSONEncodeError as e:  # an integer beyond 64 bits
        raise Refused(f"{subject}: (body): {e}") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        problem = first["msg"].removeprefix("Value error, ")
        raise Refused(f"{subject}: {where}: {problem}") from None


def _object(subject: str, data: bytes) -> dict[str, Any]:
    """The report's JSON object: within the size limit, with no key given twice."""
    if len(data) > MAX_REPORT_BYTES:
        raise Refused(
            f"{subject}: (body): {len(data)} bytes; reports are limited to {MAX_REPORT_BYTES}"
        )
    try:
        body = loads(data)
    except DuplicateKey as e:
        raise Refused(f"{subject}: {e.key}: {e}") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise Refused(f"{subject}: (body): not JSON: {e}") from None
    if not isinstance(body, dict):
        raise Refused(f"{subject}: (body): the payload must be a JSON object")
    return body


def command_id_of(msg_id: str) -> str:
    """`obs:` and the operator's message id, made safe; long ids keep their start and a hash
    of the whole, so no two collide."""
    command_id = c.OBSERVATION_PREFIX + _ID_UNSAFE.sub("-", msg_id)
    if len(command_id) > 120:
        digest = hashlib.sha256(msg_id.encode()).hexdigest()[:24]
        command_id = f"{command_id[:95]}-{digest}"
    return command_id


@dataclass(frozen=True)
class RateLimit:
    """How many reports a cluster may have handled: `rate` a second sustained, `burst` at once
    (an operator starting up reports every pod it finds)."""

    rate: float = 200.0
    burst: float = 5000.0
    max_delay: float = 60.0  # the longest a report waits before it is offered again


@dataclass
class Buckets:
    """A token bucket per cluster. A report that finds its cluster's bucket empty is told how
    long to wait; reports waiting for one cluster spread out over the time its tokens take."""

    limit: RateLimit = field(default_factory=RateLimit)
    clock: Callable[[], float] = time.monotonic
    max_clusters: int = 100_000
    _tokens: dict[str, tuple[float, float]] = field(default_factory=dict)  # cluster -> (n, at)

    def take(self, cluster_id: str, waiting: int = 0) -> float:
        """0: handle it now (a token is taken). Else the seconds until it may be offered again,
        counting the `waiting` reports of this cluster already told to wait."""
        now = self.clock()
        tokens, at = self._tokens.get(cluster_id, (self.limit.burst, now))
        tokens = min(self.limit.burst, tokens + (now - at) * self.limit.rate)
        if tokens >= 1 and not waiting:
            self._tokens[cluster_id] = (tokens - 1, now)
            return 0.0
        self._remember(cluster_id, (tokens, now))
        return min(self.limit.max_delay, (1 - tokens + waiting) / self.limit.rate)

    def _remember(self, cluster_id: str, state: tuple[float, float]) -> None:
        if cluster_id not in self._tokens and len(self._tokens) >= self.max_clusters:
            self._tokens.clear()  # subjects nobody owns: forgetting costs a refill, no more
        self._tokens[cluster_id] = state


class SetAside(Protocol):
    async def set_aside(
        self,
        component: str,
        reason: str,
        subject: str,
        data: bytes,
        headers: Any = None,
        msg_id: str | None = None,
    ) -> None: ...


class LogOnly:
    """Dead letters without NATS: logged only (a hub run without a dead-letter stream)."""

    async def set_aside(
        self,
        component: str,
        reason: str,
        subject: str,
        data: bytes,
        headers: Any = None,
        msg_id: str | None = None,
    ) -> None:
        log.warning("%s: set aside %r: %s", component, subject, reason)


Execute = Callable[[c.Command], Awaitable[dict[str, Any]]]
Heard = Callable[[str], None]  # called with the cluster id of each heartbeat handled


async def ingest(
    batches: Callable[[], AsyncIterator[list[Delivery]]],
    execute: Execute,
    heard: Heard = lambda cluster_id: None,
    dead: SetAside | None = None,
    buckets: Buckets | None = None,
) -> None:
    """Follow the observations for as long as the hub runs; after a failure, start again from
    the first one not acknowledged."""
    intake = Intake(execute, heard, dead or LogOnly(), buckets or Buckets())
    while True:
        try:
            async for batch in batches():
                await intake.handle(batch)
        except Exception as e:
            log.warning("observations: %s: %s; resuming", type(e).__name__, e)
            await asyncio.sleep(0.5)


@dataclass
class Intake:
    """Settles each batch of observations: handled, set aside for good, or offered again
    later (the hub could not handle it now, or its cluster is over its rate)."""

    execute: Execute
    heard: Heard
    dead: SetAside
    buckets: Buckets
    refused: int = 0  # reports set aside since the hub started
    deferred: int = 0  # reports made to wait for their cluster's rate

    async def handle(self, batch: list[Delivery]) -> None:
        runnable = await self._admit(batch)
        replies = await asyncio.gather(*(self.execute(command) for _, command in runnable))
        retrying = False
        for (delivery, command), reply in zip(runnable, replies, strict=True):
            error = reply.get("error") or {}
            # once one must be retried, so must every later one: they are applied in order
            retrying = retrying or (not reply.get("ok") and error.get("code") in RETRY)
            if retrying:
                await delivery.retry()
                continue
            if not reply.get("ok"):
                await self._set_aside(delivery, _reason(delivery.subject, error))
            elif isinstance(command, c.ObserveHeartbeat):
                self.heard(command.cluster_id)
            await delivery.ack()

    async def _admit(self, batch: list[Delivery]) -> list[tuple[Delivery, c.Command]]:
        """The batch's observations that parse and are within their cluster's rate; the others
        are set aside, or offered again once their cluster has tokens (in their order)."""
        runnable: list[tuple[Delivery, c.Command]] = []
        waiting: dict[str, int] = {}
        for delivery in batch:
            cluster_id = _cluster_of(delivery.subject)
            delay = self.buckets.take(cluster_id, waiting.get(cluster_id, 0))
            if delay:
                waiting[cluster_id] = waiting.get(cluster_id, 0) + 1
                self.deferred += 1
                await delivery.retry(delay)
                continue
            try:
                runnable.append((delivery, parse(delivery.subject, delivery.data, delivery.msg_id)))
            except Refused as e:
                await self._set_aside(delivery, str(e))
                await delivery.reject()
        for cluster_id, n in waiting.items():
            log.warning("observations: cluster %s over its rate; %d reports wait", cluster_id, n)
        return runnable

    async def _set_aside(self, delivery: Delivery, reason: str) -> None:
        self.refused += 1
        await self.dead.set_aside(
            COMPONENT, reason, delivery.subject, delivery.data, msg_id=delivery.msg_id
        )


def _cluster_of(subject: str) -> str:
    parts = subject.split(".")
    return parts[2] if len(parts) > 2 else ""


def _reason(subject: str, error: dict[str, Any]) -> str:
    """The hub's refusal as a dead letter's reason: the field, then the problem."""
    where = (error.get("details") or {}).get("field") or "(body)"
    return f"{subject}: {where}: {error.get('message') or error.get('code')}"
