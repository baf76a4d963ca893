"""A workload's name, and which incarnation of it is current.

People name workloads and address them by name; the plane stores each workload under an id.
Deleting a workload keeps its history under its id, so a name declared again after a delete is a
new incarnation with a new id and a history of its own. This aggregate, keyed by the name,
records each incarnation as it claims the name: commands sent by name go to the current one,
and the audit trail finds every one of them.

A name is free once its current incarnation is deleted: the delete is one command that deletes
the workload and its deployments at once, and nothing of a new incarnation can meet what the old
one left on its clusters (its ids differ, so do its DynamoGraphDeployments' names; the devices
the old pods hold until they are seen terminated stay counted by admission). Two creates racing
for a free name both change this aggregate at the same version: the store keeps one of them.

The first incarnation's id is the name itself, and a name is recorded here only once one of its
workloads has another id: a name never reused has no record, as none had before names were
reused. A later incarnation's id is `<name>--<n>`, `n` its incarnation number, or the next free
number when a workload literally named so holds that id already; a long name is shortened to
keep the id a DNS label.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wingsmith.domain.base import Aggregate, AlreadyExists, Cause, Created, Event
from wingsmith.domain.values import is_name

MAX_ID = 63  # an id is a DNS label: it names the workload's DynamoGraphDeployments


class WorkloadName(Aggregate):
    kind = "workload_name"
    incarnations: tuple[str, ...]  # the workload id of each incarnation, the first first

    @property
    def current(self) -> str:
        return self.incarnations[-1]

    @property
    def incarnation(self) -> int:
        return len(self.incarnations)

    @classmethod
    def claim_first(
        cls, cause: Cause, name: str, workload_id: str, *, earlier: tuple[str, ...] = ()
    ) -> WorkloadName:
        """The first record of a name: the incarnation that first has an id other than the
        name, after the `earlier` ones (the one whose id was the name)."""
        return cls._start(
            WorkloadNameClaimed,
            name,
            cause,
            workload_id=workload_id,
            incarnation=len(earlier) + 1,
            earlier=earlier,
        )

    def claim(self, cause: Cause, workload_id: str, *, current_deleted: bool) -> None:
        """A new incarnation takes the name, once the current one is deleted."""
        check_free(self.key, self.current, deleted=current_deleted)
        self._record(
            WorkloadNameReclaimed,
            cause,
            workload_id=workload_id,
            incarnation=self.incarnation + 1,
        )


def check_free(name: str, workload_id: str, *, deleted: bool) -> None:
    """A name is taken while its current incarnation (`workload_id`) is not deleted."""
    if not deleted:
        raise AlreadyExists(f"workload {name!r} already exists", field="workload_id")


def incarnation_id(name: str, incarnation: int, taken: Callable[[str], bool]) -> str:
    """The id of the `incarnation`th workload named `name`: the name for the first (when no
    other workload holds it as its id), `<name>--<n>` for later ones, `n` the first number from
    the incarnation's on that no workload holds."""
    if incarnation == 1 and not taken(name):
        return name
    n = max(incarnation, 2)
    while taken(candidate := _suffixed(name, n)):
        n += 1
    return candidate


def _suffixed(name: str, n: int) -> str:
    suffix = f"--{n}"
    candidate = name[: MAX_ID - len(suffix)].rstrip("-") + suffix
    assert is_name(candidate)
    return candidate


class WorkloadNameClaimed(Created):
    aggregate_class = WorkloadName
    workload_id: str
    incarnation: int
    earlier: tuple[str, ...] = ()  # the incarnations before, which had no record

    def apply(self, name: Any) -> None:
        name.incarnations = (*self.earlier, self.workload_id)


class WorkloadNameReclaimed(Event):
    """The name's current incarnation was deleted; a new one has it now."""

    workload_id: str
    incarnation: int

    def apply(self, name: Any) -> None:
        name.incarnations = (*name.incarnations, self.workload_id)
