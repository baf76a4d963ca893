"""The event-sourced aggregate base shared by every aggregate.

An aggregate's command methods check guards, raising a named `DomainError`, and then record an
event; state changes only when an event is applied, so replaying stored events rebuilds the same
state. Events are frozen pydantic models, which is also how they cross every wire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict


class DomainError(Exception):
    """A refused command: `code` is stable; `field` names the offending input, if any."""

    code: ClassVar[str] = "domain_error"

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details


class NotFound(DomainError):
    code = "not_found"


class AlreadyExists(DomainError):
    code = "already_exists"


class IllegalTransition(DomainError):
    code = "illegal_transition"


class WrongWriter(DomainError):
    """Plane-declared fields are written by the plane, cluster-observed ones by the cluster."""

    code = "wrong_writer"


class InvalidValue(DomainError):
    code = "invalid_value"


class Writer(StrEnum):
    PLANE = "plane"
    CLUSTER = "cluster"


@dataclass(frozen=True, slots=True)
class Cause:
    """Why events are being recorded: the command (or observation) that led to them."""

    command_id: str
    correlation_id: str
    at: datetime
    writer: Writer = Writer.PLANE


class Event(BaseModel):
    """A past-tense fact about one aggregate, at one version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    originator_id: str
    originator_version: int
    timestamp: datetime
    command_id: str
    correlation_id: str

    def apply(self, aggregate: Any) -> None:
        """Change the aggregate's state; subclasses override (a no-op for pure markers)."""

    def mutate(self, aggregate: Aggregate | None) -> Aggregate:
        """Fold this event onto `aggregate` (or create it): the store's replay protocol."""
        if aggregate is None:
            raise InvalidValue(f"{type(self).__name__} cannot start an aggregate's history")
        self.apply(aggregate)
        aggregate.version = self.originator_version
        aggregate.modified_at = self.timestamp
        return aggregate


class Created(Event):
    """The first event of an aggregate; it names the aggregate class it starts."""

    aggregate_class: ClassVar[type[Aggregate]]

    def mutate(self, aggregate: Aggregate | None) -> Aggregate:
        if aggregate is not None:
            raise InvalidValue(f"{type(self).__name__} can only start a history")
        created = self.aggregate_class.__new__(self.aggregate_class)
        created.id = self.originator_id
        created.pending = []
        created.created_at = self.timestamp
        return super().mutate(created)


class Aggregate:
    """State folded from events. `kind` is the aggregate's name on the wire (`deployment`, …)."""

    kind: ClassVar[str]
    id: str
    version: int = 0
    created_at: datetime
    modified_at: datetime
    pending: list[Event]
    # Told of every event as it is recorded, so a unit of work sees them in the order they
    # happened across aggregates.
    on_record: Callable[[Event], None] | None = None

    @classmethod
    def store_id(cls, key: str) -> str:
        """Ids share one store namespace, so each carries its kind: `deployment:llama--east`."""
        return f"{cls.kind}:{key}"

    @property
    def key(self) -> str:
        return split_id(self.id)[1]

    @classmethod
    def _start(cls, event_class: type[Created], key: str, cause: Cause, **fields: Any) -> Self:
        event = event_class(
            originator_id=cls.store_id(key),
            originator_version=1,
            timestamp=cause.at,
            command_id=cause.command_id,
            correlation_id=cause.correlation_id,
            **fields,
        )
        aggregate = event.mutate(None)
        aggregate.pending.append(event)
        assert isinstance(aggregate, cls)
        return aggregate

    def _record(self, event_class: type[Event], cause: Cause, **fields: Any) -> None:
        event = event_class(
            originator_id=self.id,
            originator_version=self.version + 1,
            timestamp=cause.at,
            command_id=cause.command_id,
            correlation_id=cause.correlation_id,
            **fields,
        )
        event.mutate(self)
        self.pending.append(event)
        if self.on_record is not None:
            self.on_record(event)

    def collect_events(self) -> list[Event]:
        events, self.pending = self.pending, []
        return events

    def as_dict(self) -> dict[str, Any]:
        """Everything an aggregate knows, for comparing a replay with the live instance."""
        return {k: v for k, v in vars(self).items() if k not in ("pending", "on_record")}

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Aggregate)
            and type(self) is type(other)
            and self.as_dict() == other.as_dict()
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} v{self.version}>"


def split_id(aggregate_id: str) -> tuple[str, str]:
    """`deployment:llama--east` -> (`deployment`, `llama--east`)."""
    kind, _, key = aggregate_id.partition(":")
    return kind, key


def replay(events: Iterable[Event], aggregate: Aggregate | None = None) -> Aggregate | None:
    """Rebuild an aggregate from its stored history (None when there is none), or bring one
    rebuilt up to some version forward by the events after it."""
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate


def require_writer(cause: Cause, writer: Writer, what: str) -> None:
    if cause.writer is not writer:
        raise WrongWriter(f"{what} is written by the {writer.value}, not the {cause.writer.value}")
