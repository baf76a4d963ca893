"""Observations in: what operators publish on `wingsmith.obs.<cluster>.<kind>` becomes commands
on the cluster's aggregates, run by the hub like any other, in the order they were published.

Each observation is handled at most once in effect: its command id comes from the operator's
`Nats-Msg-Id`, so a redelivery or a resend is a duplicate, and the handlers themselves ignore
what they already know. One that names another cluster than its subject, or does not parse, is
refused for good, with a warning, and nothing is stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from pydantic import ValidationError

from adapters.nats_bus import OBS_PREFIX, Delivery
from services import commands as c

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


class Refused(ValueError):
    """An observation that can never be handled."""


def parse(subject: str, data: bytes, msg_id: str) -> c.Command:
    """The command an observation asks for; `Refused` names what is wrong with it."""
    parts = subject.split(".")
    if len(parts) != 4 or ".".join(parts[:2]) != OBS_PREFIX or parts[3] not in KINDS:
        raise Refused(f"{subject}: not an observation subject (kinds: {', '.join(KINDS)})")
    cluster_id, kind = parts[2], parts[3]
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise Refused(f"{subject}: not JSON: {e}") from None
    if not isinstance(body, dict):
        raise Refused(f"{subject}: the payload must be a JSON object")
    if body.get("cluster_id") != cluster_id:
        raise Refused(
            f"{subject}: cluster_id {body.get('cluster_id')!r} is not the subject's cluster "
            f"{cluster_id!r}"
        )
    command_id = "obs:" + _ID_UNSAFE.sub("-", msg_id)
    if len(command_id) > 120:  # long ids keep their start and a hash of the whole: no collision
        digest = hashlib.sha256(msg_id.encode()).hexdigest()[:24]
        command_id = f"{command_id[:95]}-{digest}"
    try:
        return KINDS[kind].model_validate(body | {"command_id": command_id})
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise Refused(f"{subject}: {field}: {first['msg']}") from None


Execute = Callable[[c.Command], Awaitable[dict[str, Any]]]
Heard = Callable[[str], None]  # called with the cluster id of each heartbeat handled


async def ingest(
    batches: Callable[[], AsyncIterator[list[Delivery]]],
    execute: Execute,
    heard: Heard = lambda cluster_id: None,
) -> None:
    """Follow the observations for as long as the hub runs; after a failure, start again from
    the first one not acknowledged."""
    while True:
        try:
            await _ingest(batches(), execute, heard)
        except Exception as e:
            log.warning("observations: %s: %s; resuming", type(e).__name__, e)
            await asyncio.sleep(0.5)


async def _ingest(batches: AsyncIterator[list[Delivery]], execute: Execute, heard: Heard) -> None:
    """Run every batch's observations in one go, then settle each: done or refused for good,
    or to be redelivered when the hub could not handle it now."""
    async for batch in batches:
        runnable: list[tuple[Delivery, c.Command]] = []
        for delivery in batch:
            try:
                runnable.append((delivery, parse(delivery.subject, delivery.data, delivery.msg_id)))
            except Refused as e:
                log.warning("observation refused: %s", e)
                await delivery.reject()
        replies = await asyncio.gather(*(execute(command) for _, command in runnable))
        retrying = False
        for (delivery, command), reply in zip(runnable, replies, strict=True):
            error = reply.get("error") or {}
            # once one must be retried, so must every later one: they are applied in order
            retrying = retrying or (not reply.get("ok") and error.get("code") in RETRY)
            if retrying:
                await delivery.retry()
                continue
            if not reply.get("ok"):
                log.warning("observation %s refused: %s", command.command_id, error)
            elif isinstance(command, c.ObserveHeartbeat):
                heard(command.cluster_id)
            await delivery.ack()
