"""Every fold handles real events and reads only fields they have: renaming an event or a field
in the domain fails here, not silently in a view or in admission."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import wingsmith.projections
from wingsmith.domain.admission import FOLDS, Ledger
from wingsmith.domain.base import Event
from wingsmith.domain.deployment import AdmissionDecided, DeploymentCreated, DeploymentScaled
from wingsmith.projections.audit import METADATA
from wingsmith.projections.base import Keys, Projection, handles

from .reads import Path, body_fields, domain_events, problems, uses

Fold = tuple[type, Callable[..., Any], tuple[type[Event], ...]]  # owner, handler, its events


def projections() -> list[type[Projection]]:
    """Every projection the package defines (its modules all imported first)."""
    for module in pkgutil.iter_modules(wingsmith.projections.__path__):
        importlib.import_module(f"wingsmith.projections.{module.name}")
    found: list[type[Projection]] = []
    pending: list[type[Projection]] = [Projection]
    while pending:
        for sub in pending.pop().__subclasses__():
            pending.append(sub)
            found.append(sub)
    return [p for p in found if p.__module__.startswith("wingsmith.")]


def folds_of(owner: type, handlers: dict[str, Callable[..., Any]]) -> Iterator[Fold]:
    for handler in dict.fromkeys(handlers.values()):
        yield owner, handler, handler.__handles__  # type: ignore[attr-defined]


def every_fold() -> list[Fold]:
    found = [f for p in projections() for f in folds_of(p, p._handlers)]
    return [*found, *folds_of(Ledger, FOLDS)]


def misreads(
    owner: type, handler: Callable[..., Any], events: tuple[type[Event], ...]
) -> list[str]:
    """What the handler reads (or uses) of its body that not every event it folds has."""
    body = list(inspect.signature(handler).parameters)[2]  # (self, aggregate id, body)
    found: list[str] = []
    for use in uses(handler, body, owner):
        if use.path is None:
            found.append(f"{owner.__name__}: {use.where} {use.why}")
            continue
        found += [
            f"{owner.__name__}: {use.where} reads {_shown(use.path)}: {problem}"
            for event in events
            if (problem := problems(event, use.path)) is not None
        ]
    return sorted(found)


def _shown(path: Path) -> str:
    return "e" + "".join(f"[{name!r}]" for name in path)


def test_event_names_are_unique_on_the_wire() -> None:
    """The stream's `type` is the class name alone: two events may not share one."""
    names = Counter(event.__name__ for event in domain_events())
    assert [name for name, n in names.items() if n > 1] == []


def strangers(folds: list[Fold]) -> list[str]:
    """The events folds handle that are not the domain's."""
    events = {event.__name__: event for event in domain_events()}
    return [
        f"{owner.__name__}.{handler.__name__}: {event.__name__}"
        for owner, handler, handled in folds
        for event in handled
        if events.get(event.__name__) is not event
    ]


def test_every_handled_event_is_a_domain_event() -> None:
    folds = every_fold()
    assert len(folds) > 60  # the projections' and the ledger's handlers were all found
    assert strangers(folds) == []


def test_routes_are_keyed_by_the_type_on_the_wire() -> None:
    for projection in projections():
        for name, handler in projection._handlers.items():
            assert name in {e.__name__ for e in handler.__handles__}  # type: ignore[attr-defined]
    assert set(FOLDS) <= {event.__name__ for event in domain_events()}


def test_every_field_a_fold_reads_is_a_field_of_its_events() -> None:
    found = [problem for fold in every_fold() for problem in misreads(*fold)]
    assert found == []


def test_audit_metadata_is_on_every_event() -> None:
    assert all(set(METADATA) <= body_fields(event).keys() for event in domain_events())


# -- the check itself finds what it should ---------------------------------------------------


E = Mapping[str, Any]


def _read(e: E) -> Any:
    return e["desired_replicaz"]


class Careless(Projection):
    """Reads wrongly on purpose: this module is not `wingsmith.`, so the tests above skip it."""

    name = "careless"

    @handles(DeploymentCreated)
    def _created(self, deployment_id: str, e: E) -> Keys:
        self.views[deployment_id] = {"nested": e["serving"]["devices_per_replicas"]}
        self._helper(deployment_id, e)
        return (str(e.get("clusterid")), str(_read(e)))

    @handles(DeploymentScaled, AdmissionDecided)
    def _scaled(self, deployment_id: str, e: E) -> Keys:
        return (e["desired_replicas"], *e.keys(), repr(e))

    def _helper(self, deployment_id: str, body: E) -> None:
        self.views[deployment_id]["when"] = body["timestamp"], body["originator_id"]


def test_the_check_finds_misread_fields() -> None:
    created = misreads(Careless, Careless._created, (DeploymentCreated,))
    assert created == [
        "Careless: Careless._created reads e['clusterid']: "
        "DeploymentCreated has no field 'clusterid'",
        "Careless: Careless._created reads e['serving']['devices_per_replicas']: "
        "DeploymentCreated['serving'] has no field 'devices_per_replicas'",
        "Careless: Careless._helper reads e['originator_id']: "
        "DeploymentCreated has no field 'originator_id'",
        "Careless: _read reads e['desired_replicaz']: "
        "DeploymentCreated has no field 'desired_replicaz'",
    ]


def test_the_check_wants_each_event_to_have_the_field_and_no_other_uses() -> None:
    scaled = misreads(Careless, Careless._scaled, (DeploymentScaled, AdmissionDecided))
    assert scaled == [
        "Careless: Careless._scaled passes the body to repr, not a helper",
        "Careless: Careless._scaled reads e['desired_replicas']: "
        "AdmissionDecided has no field 'desired_replicas'",
        "Careless: Careless._scaled uses the body whole in `e.keys`",
    ]


def test_the_check_finds_events_the_domain_does_not_define() -> None:
    class DeploymentCreatd(Event):  # a class of the same shape, but not a domain event
        pass

    assert strangers([(Careless, Careless._created, (DeploymentCreatd, DeploymentCreated))]) == [
        "Careless._created: DeploymentCreatd"
    ]
