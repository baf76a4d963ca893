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
from typing import Any

import orjson
from pydantic import ValidationError

from wingsmith.adapters import tracing
from wingsmith.adapters.dead_letters import Component, DeadLetters, SetAside
from wingsmith.adapters.nats_bus import MAX_REPORT, Delivery
from wingsmith.domain import commands as c
from wingsmith.domain import names
from wingsmith.services import logs
from wingsmith.services.tasks import supervise
from wingsmith.services.wire import DuplicateKey, loads

log = logging.getLogger(__name__)

# Each report kind (domain/contracts/reports.py) and the command that runs it: the report's
# own model with a command id.
KINDS: dict[str, type[c.Command]] = {
    cls.kind: cls
    for cls in (
        c.ObserveReplica,
        c.ObserveDeployment,
        c.ReportInventory,
        c.ObserveDiscovery,
        c.ObserveHeartbeat,
        c.ObserveAction,
        c.ObserveSync,
    )
}
RETRY = {"unavailable", "conflict", "internal"}  # the hub could not handle it now
MAX_ATTEMPTS = 5  # times one observation's handling may fail before it is set aside
MAX_FAILING = 10_000  # observations whose failures are counted at once; beyond, counts restart
_ID_UNSAFE = re.compile(r"[^-_.:A-Za-z0-9]")
WARN_EVERY = 10.0  # seconds between two warnings that one cluster is over its rate


class Refused(ValueError):
    """An observation that can never be handled; the message names the field and the problem."""


def parse(subject: str, data: bytes, msg_id: str) -> c.Command:
    """The command an observation asks for; `Refused` names what is wrong with it."""
    parts = subject.split(".")
    if len(parts) != 4 or ".".join(parts[:2]) != names.OBSERVATIONS or parts[3] not in KINDS:
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


def _for_the_operator(subject: str) -> bool:
    """A node agent's report (`wingsmith.obs.<cluster>.devices.<node>`): its cluster's
    operator reads it; it reaches the hub only because the observation stream keeps it."""
    parts = subject.split(".", 4)
    return len(parts) == 5 and parts[3] == names.NODE_DEVICES


def _object(subject: str, data: bytes) -> dict[str, Any]:
    """The report's JSON object: within the size limit, with no key given twice."""
    if len(data) > MAX_REPORT:
        raise Refused(f"{subject}: (body): {len(data)} bytes; reports are limited to {MAX_REPORT}")
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


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # when `tokens` was counted; in the future while reports wait their turn
    last_due: float = 0.0  # when the cluster's last report told to wait has its turn


@dataclass
class Buckets:
    """A token bucket per cluster that keeps each cluster's reports in their order (not every
    report carries the cluster's `version`: a late inventory would undo a newer one). A report
    that finds its cluster's bucket empty, or earlier reports of its cluster still waiting, is
    given a turn `1/rate` after the last one waiting, and its token is kept for that turn. It is
    offered again then (no later than `max_delay` from now, and told to wait again if that is
    before its turn), so a backlog comes back in order, at the rate, not all at once."""

    limit: RateLimit = field(default_factory=RateLimit)
    clock: Callable[[], float] = time.monotonic
    max_clusters: int = 100_000
    max_waiting: int = 1_000_000  # reports whose turn is remembered; the consumer's window
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _turns: dict[str, float] = field(default_factory=dict)  # msg id -> its turn

    def take(self, cluster_id: str, msg_id: str) -> float:
        """0: handle it now. Else the seconds until it is to be offered again."""
        now = self.clock()
        bucket = self._bucket(cluster_id, now)
        turn = self._turns.get(msg_id)
        if turn is not None:
            if turn > now:  # offered early (a delay was capped): not its turn yet
                return min(self.limit.max_delay, turn - now)
            del self._turns[msg_id]
            return 0.0
        bucket.tokens = min(
            self.limit.burst, bucket.tokens + max(0.0, now - bucket.at) * self.limit.rate
        )
        bucket.at = max(bucket.at, now)
        if bucket.tokens >= 1 and bucket.last_due <= now:
            bucket.tokens -= 1
            return 0.0
        return self._wait(bucket, msg_id, now)

    def _wait(self, bucket: _Bucket, msg_id: str, now: float) -> float:
        """Give the report the next turn after its cluster's last one; its token is spent then
        (the bucket counts again only from that turn on)."""
        turn = max(now, bucket.last_due, bucket.at) + (1 - min(bucket.tokens, 1)) / self.limit.rate
        bucket.last_due = bucket.at = turn
        bucket.tokens = 0.0
        if len(self._turns) >= self.max_waiting:
            self._turns.clear()  # forgotten turns are asked for again: after the last, in order
        self._turns[msg_id] = turn
        return min(self.limit.max_delay, turn - now)

    def _bucket(self, cluster_id: str, now: float) -> _Bucket:
        bucket = self._buckets.get(cluster_id)
        if bucket is None:
            if len(self._buckets) >= self.max_clusters:
                self._buckets.clear()  # subjects nobody owns: forgetting costs a refill, no more
            bucket = self._buckets[cluster_id] = _Bucket(self.limit.burst, now)
        return bucket


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
    intake = Intake(execute, heard, dead or DeadLetters(None), buckets or Buckets())

    async def follow() -> None:
        while True:  # the batches never end but by failing; should they, start again at once
            async for batch in batches():
                await intake.handle(batch)

    await supervise("observations", follow, logger=log)


@dataclass
class Intake:
    """Settles each batch of observations: handled, set aside for good, or offered again
    later (the hub could not handle it now, or its cluster is over its rate)."""

    execute: Execute
    heard: Heard
    dead: SetAside
    buckets: Buckets
    deferred: int = 0  # reports made to wait for their cluster's rate
    _warned: dict[str, float] = field(default_factory=dict)  # cluster -> when last said
    # failed handlings per observation (its msg id): redeliveries for a cluster's rate or an
    # outage are not failures, so JetStream's delivery count cannot tell
    _failures: dict[str, int] = field(default_factory=dict)

    async def handle(self, batch: list[Delivery]) -> None:
        runnable = await self._admit(batch)
        replies = await asyncio.gather(
            *(self._run(delivery, command) for delivery, command in runnable),
            return_exceptions=True,
        )
        retrying = False
        for (delivery, command), answer in zip(runnable, replies, strict=True):
            reply = _reply(answer)
            error = reply.get("error") or {}
            if self._poisoned(delivery, reply):  # it keeps failing: set aside, let the rest on
                reason = f"handling failed {MAX_ATTEMPTS} times: {error.get('message', '')}"
                await self._set_aside(delivery, reason)
                await delivery.ack()
                continue
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

    async def _run(self, delivery: Delivery, command: c.Command) -> dict[str, Any]:
        """Run an observation's command, continuing the trace of the operator's action that
        reported it, if it has one."""
        cluster_id = _cluster_of(delivery.subject)
        with tracing.continued(delivery.headers), logs.context(cluster_id=cluster_id):
            return await self.execute(command)

    def _poisoned(self, delivery: Delivery, reply: dict[str, Any]) -> bool:
        """Whether this observation's handling has now failed `MAX_ATTEMPTS` times: the hub's
        own failure (`internal`), not a passing outage (`unavailable`), so trying again would
        hold up everything after it for ever."""
        if (reply.get("error") or {}).get("code") != "internal":
            self._failures.pop(delivery.msg_id, None)
            return False
        if len(self._failures) >= MAX_FAILING and delivery.msg_id not in self._failures:
            self._failures.clear()
        failed = self._failures[delivery.msg_id] = self._failures.get(delivery.msg_id, 0) + 1
        if failed < MAX_ATTEMPTS:
            return False
        del self._failures[delivery.msg_id]
        return True

    async def _admit(self, batch: list[Delivery]) -> list[tuple[Delivery, c.Command]]:
        """The batch's observations that parse and are within their cluster's rate; the others
        are set aside, or offered again once their cluster has tokens (in their order)."""
        runnable: list[tuple[Delivery, c.Command]] = []
        waiting: dict[str, int] = {}
        for delivery in batch:
            if _for_the_operator(delivery.subject):  # a node agent's report: not the hub's
                await delivery.ack()
                continue
            cluster_id = _cluster_of(delivery.subject)
            delay = self.buckets.take(cluster_id, delivery.msg_id)
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
            self._warn(cluster_id, n)
        return runnable

    def _warn(self, cluster_id: str, n: int) -> None:
        """Say that a cluster is over its rate, at most every `WARN_EVERY` seconds each."""
        now = self.buckets.clock()
        if now - self._warned.get(cluster_id, -WARN_EVERY) >= WARN_EVERY:
            self._warned[cluster_id] = now
            log.warning(
                "observations: cluster %s is over its rate (%g a second); %d reports made to "
                "wait in this batch, %d since the hub started",
                cluster_id,
                self.buckets.limit.rate,
                n,
                self.deferred,
            )

    async def _set_aside(self, delivery: Delivery, reason: str) -> None:
        await self.dead.set_aside(
            Component.INGEST, reason, delivery.subject, delivery.data, msg_id=delivery.msg_id
        )


def _cluster_of(subject: str) -> str:
    parts = subject.split(".")
    return parts[2] if len(parts) > 2 else ""


def _reason(subject: str, error: dict[str, Any]) -> str:
    """The hub's refusal as a dead letter's reason: the field, then the problem."""
    where = (error.get("details") or {}).get("field") or "(body)"
    return f"{subject}: {where}: {error.get('message') or error.get('code')}"


def _reply(answer: dict[str, Any] | BaseException) -> dict[str, Any]:
    """The hub's reply; a handler that raised instead answers `internal`."""
    if isinstance(answer, BaseException):
        if not isinstance(answer, Exception):  # a cancellation: let it through
            raise answer
        log.error("observation handling raised %s: %s", type(answer).__name__, answer)
        return {"ok": False, "error": {"code": "internal", "message": f"{answer}"[:500]}}
    return answer
