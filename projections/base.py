"""The projection base: pure folds of events into keyed views, applying each event once.

A handler takes an event's aggregate id and body (the fields the stream carries under `event`),
so projections fold the same input whether it comes from `WINGSMITH_EVENTS` or is read back
from the event store to rebuild. Handlers name the domain's event classes they fold: renaming
an event breaks the import, not silently the fold. Routes are keyed by the class name, which
is the event's `type` on the wire.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, cast

from typing_extensions import TypeVar

from wingsmith.domain.base import Event

Envelope = Mapping[str, Any]
View = dict[str, Any]
# the document each of a projection's views is (domain/contracts/views.py)
V = TypeVar("V", default=Any)  # Any: a bare `Projection` is any projection
Keys = Iterable[str]  # the keys of the views an event changed
VERSION = "__version__"  # a checkpointed state's key for the version of the projection saved
Handler = Callable[[Any, str, Mapping[str, Any]], Keys]


def handles(*events: type[Event]) -> Callable[[Handler], Handler]:
    """Mark a method as the fold of these events; it returns the view keys it changed."""

    def mark(method: Handler) -> Handler:
        method.__handles__ = events  # type: ignore[attr-defined]
        return method

    return mark


class Projection(Generic[V]):
    """Views by key, plus whatever private state the fold needs. The position reached belongs
    to the `Fold` that feeds it."""

    name: ClassVar[str]
    # Raised whenever its views' shape or what its fold keeps changes: a checkpoint of another
    # version is not restored, and the views are folded again from the first event.
    version: ClassVar[int] = 1
    _handlers: ClassVar[dict[str, Handler]]  # by event type: the event class's name

    def __init_subclass__(cls) -> None:
        cls._handlers = {
            event.__name__: method
            for klass in reversed(cls.__mro__)
            for method in vars(klass).values()
            for event in getattr(method, "__handles__", ())
        }

    def __init__(self) -> None:
        self.views: dict[str, V] = {}

    def view(self, key: str) -> V | None:
        return self.views.get(key)

    def update(self, key: str, **fields: Any) -> Keys:
        """Set fields of a view that exists (one that does not stays absent)."""
        view = self.views.get(key)
        if view is None:
            return ()
        cast(View, view).update(fields)  # a view document is a dict
        return (key,)

    def state(self) -> dict[str, Any]:
        """Everything needed to resume, with the version that made it: a deep copy, safe to
        serialise while folding goes on."""
        return copy.deepcopy(vars(self)) | {VERSION: self.version}

    def restores(self, state: Mapping[str, Any]) -> bool:
        """Whether this projection can resume from `state` (one saved before versions were
        recorded is of version 1)."""
        return bool(state.get(VERSION, 1) == self.version)

    def restore(self, state: Mapping[str, Any]) -> None:
        for k, v in copy.deepcopy(dict(state)).items():
            if k != VERSION:
                setattr(self, k, v)


Route = tuple[tuple[Projection, Handler], ...]


def failure(e: Exception) -> str:
    """Why a handler could not fold an event, for a person to read."""
    return f"{type(e).__name__}: {e}"[:500]


class Fold:
    """Projections that move through the history together: each event type goes straight to
    the handlers that fold it, and the store position they have reached is one number."""

    def __init__(self, projections: Iterable[Projection], position: int = 0) -> None:
        self.projections = list(projections)
        self.position = position
        self.last_applied = 0  # the position of the last event some projection folded
        # (projection, reason) for each handler that could not fold an event since last taken
        self.failures: list[tuple[str, str]] = []
        routes: dict[str, list[tuple[Projection, Handler]]] = {}
        for projection in self.projections:
            for event_type, handler in type(projection)._handlers.items():
                routes.setdefault(event_type, []).append((projection, handler))
        self.routes: dict[str, Route] = {t: tuple(r) for t, r in routes.items()}

    def apply(
        self, position: int, event_type: str, aggregate_id: str, event: Mapping[str, Any]
    ) -> list[tuple[Projection, str]]:
        """Fold one event and say which views it changed; an event at or below the position
        already reached changes nothing (a redelivery). A handler that raises (an event of a
        shape it does not expect: old history, a bug) is noted in `failures` and the event goes
        on to the other handlers; what that handler changed before raising stays, as it does
        in a rebuild, which follows the same rule."""
        if position <= self.position:
            return []
        self.position = position
        if event_type in self.routes:
            self.last_applied = position
        changed: list[tuple[Projection, str]] = []
        for projection, handler in self.routes.get(event_type, ()):
            try:
                changed += [(projection, key) for key in handler(projection, aggregate_id, event)]
            except Exception as e:  # one bad event must not stop every view
                self.failures.append((projection.name, failure(e)))
        return changed

    def take_failures(self) -> list[tuple[str, str]]:
        """The handlers that failed since the last call, and why."""
        taken, self.failures = self.failures, []
        return taken

    def apply_envelope(self, envelope: Envelope) -> list[tuple[Projection, str]]:
        """Fold an event in the stream's shape."""
        return self.apply(
            envelope["position"], envelope["type"], envelope["aggregate_id"], envelope["event"]
        )
