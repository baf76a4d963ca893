"""Snapshots of aggregates with long histories, so that loading one does not replay all of it.

A snapshot is an aggregate's state at one version, kept in eventsourcing's snapshot store (the
table `stored_snapshots` on SQLite, `wingsmith_snapshots` on PostgreSQL, beside the events) as
an event of its own type, through the store's mapper and transcoder. Its state is the
aggregate's attributes as their annotations type them, dumped and validated by pydantic, so
enums, tuples, sets, datetimes and nested models come back as they were.

Each snapshot is stored under its format (`SNAPSHOT_FORMAT`: a digest of the domain's sources
and of this module), so code that could read it differently never looks it up, and one that
cannot be read is passed over with a warning: the full history serves instead. A snapshot is
written only if it reads back equal to the aggregate it was taken from.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import typing
from pathlib import Path
from typing import Any, ClassVar

import pydantic
from eventsourcing.persistence import EventStore as SnapshotStore
from eventsourcing.persistence import IntegrityError
from eventsourcing.utils import get_topic, resolve_topic
from pydantic import BaseModel, ConfigDict, create_model

from wingsmith import domain
from wingsmith.domain.base import Aggregate

__all__ = ["SNAPSHOT_EVERY", "SNAPSHOT_FORMAT", "AggregateSnapshot", "Snapshots"]

log = logging.getLogger(__name__)

# Events of one aggregate between two of its snapshots; an aggregate with fewer has none. A load
# replays fewer than this many after its snapshot (a few ms), and the hub writes a snapshot
# (about half a millisecond) once per this many events of an aggregate (docs/performance.md).
SNAPSHOT_EVERY = 500

# Where an aggregate keeps what is not its state.
_NOT_STATE = frozenset({"pending", "on_record"})
_PACKAGE = "wingsmith."  # stored topics name a class by its module inside the package


def _snapshot_format() -> str:
    """What a snapshot can be read back by: the same domain code, this module and pydantic."""
    digest = hashlib.sha256(pydantic.VERSION.encode())
    for source in [*sorted(Path(domain.__file__).parent.rglob("*.py")), Path(__file__)]:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


SNAPSHOT_FORMAT = _snapshot_format()


class AggregateSnapshot(BaseModel):
    """An aggregate's state at `originator_version`; `aggregate` is its class's topic."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    originator_id: str
    originator_version: int
    aggregate: str
    state: dict[str, Any]


@functools.cache
def _state_model(topic: str) -> type[BaseModel]:
    """A pydantic model of the aggregate's annotated attributes. Every field may be missing:
    an attribute an aggregate never set (one with a class default) stays unset."""
    cls = _aggregate_class(topic)
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {
        name: (hint, None)
        for name, hint in hints.items()
        if name not in _NOT_STATE and typing.get_origin(hint) is not ClassVar
    }
    config = ConfigDict(extra="forbid")
    model: type[BaseModel] = create_model(f"{cls.__name__}State", __config__=config, **fields)
    return model


@functools.cache
def _aggregate_class(topic: str) -> type[Aggregate]:
    cls = resolve_topic(_PACKAGE + topic)
    if not (isinstance(cls, type) and issubclass(cls, Aggregate)):
        raise TypeError(f"{topic} is not an aggregate")
    return cls


def take(aggregate: Aggregate, key: str) -> AggregateSnapshot:
    """The aggregate's state now, stored under `key`; `ValidationError` if one of its
    attributes is not annotated."""
    topic = get_topic(type(aggregate)).removeprefix(_PACKAGE)
    attributes = {k: v for k, v in vars(aggregate).items() if k not in _NOT_STATE}
    state = _state_model(topic).model_validate(attributes)
    return AggregateSnapshot(
        originator_id=key,
        originator_version=aggregate.version,
        aggregate=topic,
        state=state.model_dump(mode="json", exclude_unset=True),
    )


def restore(snapshot: AggregateSnapshot) -> Aggregate:
    """The aggregate a snapshot holds, with nothing pending."""
    cls = _aggregate_class(snapshot.aggregate)
    state = _state_model(snapshot.aggregate).model_validate(snapshot.state)
    aggregate = cls.__new__(cls)
    vars(aggregate).update({name: getattr(state, name) for name in state.model_fields_set})
    aggregate.pending = []
    if aggregate.version != snapshot.originator_version:
        raise ValueError(f"holds version {aggregate.version}, not {snapshot.originator_version}")
    return aggregate


class Snapshots:
    """The latest snapshot of an aggregate in this format, and new ones as its history grows.
    Synchronous, like the event store it belongs to."""

    def __init__(
        self, store: SnapshotStore[str], every: int = SNAPSHOT_EVERY, format: str = SNAPSHOT_FORMAT
    ) -> None:
        self._store, self.every, self.format = store, every, format
        # The version of the latest snapshot known here of each aggregate that has one: bounded
        # by the number of aggregates with `every` events or more.
        self._versions: dict[str, int] = {}

    def _key(self, aggregate_id: str) -> str:
        return f"{self.format}:{aggregate_id}"

    def latest(self, aggregate_id: str) -> Aggregate | None:
        """The aggregate as its latest snapshot in this format holds it; None when it has
        none or it cannot be read."""
        try:
            found = list(self._store.get(self._key(aggregate_id), desc=True, limit=1))
            if not found:
                return None
            aggregate = restore(found[0])  # type: ignore[arg-type]
            if aggregate.id != aggregate_id:
                raise ValueError(f"holds {aggregate.id}")
        except Exception as e:
            log.warning("passing over the snapshot of %s: %s", aggregate_id, e)
            return None
        self._versions[aggregate_id] = aggregate.version
        return aggregate

    def forget(self, aggregate_id: str) -> None:
        """Its latest snapshot did not serve: the next commit may take one."""
        self._versions.pop(aggregate_id, None)

    def due(self, aggregate: Aggregate) -> bool:
        return aggregate.version - self._versions.get(aggregate.id, 0) >= self.every

    def save(self, aggregate: Aggregate) -> bool:
        """Store a snapshot of the aggregate as it is now, if it reads back equal. Never
        raises: the aggregate's events are saved already, and a snapshot only saves time."""
        self._versions[aggregate.id] = aggregate.version  # tried once per `every` events
        try:
            snapshot = take(aggregate, self._key(aggregate.id))
            if restore(snapshot) != aggregate:
                log.warning("%s does not read back equal from a snapshot", aggregate.id)
                return False
            self._store.put([snapshot])
        except IntegrityError:  # another hub stored this version's snapshot first
            return False
        except Exception as e:
            log.warning("could not snapshot %s: %s", aggregate.id, e)
            return False
        return True
