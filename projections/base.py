"""The projection base: a pure fold of events into keyed views, applying each event once.

Projections read events in the shape the public stream carries them (`position`, `aggregate`,
`aggregate_id`, `type`, `event`), so they fold the same input whether it comes from
`WINGSMITH_EVENTS` or is read back from the event store to rebuild.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

Envelope = Mapping[str, Any]
View = dict[str, Any]
Handler = Callable[[Any, str, Mapping[str, Any]], set[str]]


def handles(*event_types: str) -> Callable[[Handler], Handler]:
    """Mark a method as the fold of these event types; it returns the view keys it changed."""

    def mark(method: Handler) -> Handler:
        method.__handles__ = event_types  # type: ignore[attr-defined]
        return method

    return mark


class Projection:
    """Views by key, plus whatever private state the fold needs, and the last position seen."""

    name: ClassVar[str]
    _handlers: ClassVar[dict[str, Handler]]

    def __init_subclass__(cls) -> None:
        cls._handlers = {
            event_type: method
            for klass in reversed(cls.__mro__)
            for method in vars(klass).values()
            for event_type in getattr(method, "__handles__", ())
        }

    def __init__(self) -> None:
        self.position = 0
        self.views: dict[str, View] = {}

    def apply(self, envelope: Envelope) -> set[str]:
        """Fold one event; an event at or below the position already seen changes nothing."""
        position = envelope["position"]
        if position <= self.position:
            return set()
        self.position = position
        handler = self._handlers.get(envelope["type"])
        if handler is None:
            return set()
        return handler(self, envelope["aggregate_id"], envelope["event"])

    def view(self, key: str) -> View | None:
        return self.views.get(key)

    def state(self) -> dict[str, Any]:
        """Everything needed to resume: a deep copy, safe to serialise while folding goes on."""
        return copy.deepcopy({k: v for k, v in vars(self).items()})

    def restore(self, state: Mapping[str, Any]) -> None:
        for k, v in copy.deepcopy(dict(state)).items():
            setattr(self, k, v)
