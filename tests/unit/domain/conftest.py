"""Given/when/then helpers: causes, a standard serving config, and event type lists."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from itertools import count

from wingsmith.domain.base import Aggregate, Cause, Writer
from wingsmith.domain.values import ServingConfig

_ids = count(1)


def plane(at: datetime | None = None) -> Cause:
    n = next(_ids)
    return Cause(command_id=f"cmd-{n}", correlation_id="corr-1", at=at or datetime.now(UTC))


def cluster() -> Cause:
    return replace(plane(), writer=Writer.CLUSTER)


def serving(**changes: object) -> ServingConfig:
    base: dict[str, object] = {
        "model": "meta-llama/Llama-3.1-70B-Instruct",
        "backend": "vllm",
        "engine_version": "0.9.2",
        "devices_per_replica": 4,
        "parallelism": {"tensor": 4},
        "context_length": 32768,
    }
    return ServingConfig.model_validate(base | changes)


def recorded(aggregate: Aggregate) -> list[str]:
    """The types of the events recorded since the last call (then forgets them)."""
    return [type(e).__name__ for e in aggregate.collect_events()]
