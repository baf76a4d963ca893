"""A projection's checkpointed state says which version of it saved it, and only that version
resumes from it: a projection whose views change shape is folded again from the first event."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wingsmith.domain.project import QuotaSet
from wingsmith.projections.base import VERSION, Keys, Projection, handles


class Quotas(Projection[dict[str, int]]):
    name = "quotas"
    version = 2

    @handles(QuotaSet)
    def _set(self, project: str, e: Mapping[str, Any]) -> Keys:
        self.views[project] = {"devices": e["devices"]}
        return (project,)


class Unversioned(Projection[dict[str, int]]):
    name = "unversioned"


def test_a_state_says_which_version_saved_it() -> None:
    assert Quotas().state()[VERSION] == 2
    assert Unversioned().state()[VERSION] == 1


def test_only_the_version_that_saved_a_state_resumes_from_it() -> None:
    saved = Quotas().state()
    assert Quotas().restores(saved)
    assert not Quotas().restores(saved | {VERSION: 1})
    assert not Quotas().restores({"views": {}})  # saved before versions were: version 1
    assert Unversioned().restores({"views": {}})


def test_the_version_is_not_restored_as_part_of_the_fold() -> None:
    first = Quotas()
    first.views["p"] = {"devices": 8}
    restored = Quotas()
    restored.restore(first.state())
    assert restored.views == {"p": {"devices": 8}}
    assert VERSION not in vars(restored)
