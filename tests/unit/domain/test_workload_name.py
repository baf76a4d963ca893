"""A workload's name: each incarnation claims it in turn, only once the one before is deleted,
under an id that no other workload holds and that stays a DNS label."""

from __future__ import annotations

import pytest

from wingsmith.domain.base import AlreadyExists
from wingsmith.domain.workload_name import WorkloadName, incarnation_id

from .conftest import plane, recorded


def test_each_incarnation_claims_the_name_after_the_one_before_is_deleted() -> None:
    name = WorkloadName.claim_first(plane(), "chat", "chat")
    assert (name.current, name.incarnation) == ("chat", 1)
    with pytest.raises(AlreadyExists, match="workload 'chat' already exists"):
        name.claim(plane(), "chat--2", current_deleted=False)
    name.claim(plane(), "chat--2", current_deleted=True)
    assert recorded(name) == ["WorkloadNameClaimed", "WorkloadNameReclaimed"]
    assert (name.current, name.incarnation, name.incarnations) == (
        "chat--2",
        2,
        ("chat", "chat--2"),
    )


def test_a_name_first_recorded_when_it_is_reused_counts_the_one_before() -> None:
    name = WorkloadName.claim_first(plane(), "old", "old--2", earlier=("old",))
    assert (name.current, name.incarnation) == ("old--2", 2)


def test_an_incarnations_id_is_the_first_no_workload_holds() -> None:
    held = {"chat", "chat--2"}
    assert incarnation_id("new", 1, held.__contains__) == "new"
    assert incarnation_id("chat", 2, held.__contains__) == "chat--3"
    assert incarnation_id("chat", 4, held.__contains__) == "chat--4"
    assert incarnation_id("chat--2", 1, held.__contains__) == "chat--2--2"


def test_a_long_names_id_is_cut_to_stay_a_dns_label() -> None:
    long = "a" * 58 + "-bcde"
    assert incarnation_id(long, 2, set().__contains__) == "a" * 58 + "-b--2"
    assert incarnation_id("a" * 59 + "-bcd", 2, set().__contains__) == "a" * 59 + "--2"
    assert len(incarnation_id("z" * 63, 12, set().__contains__)) == 63
