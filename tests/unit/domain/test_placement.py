"""Placement's policy, rule by rule (given / when / then)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wingsmith.domain.placement import RoomIndex, by_room, shares


def place(
    total: int, current: dict[str, int], free: dict[str, int], per: int = 1
) -> dict[str, int]:
    index = RoomIndex()
    for cluster, devices in free.items():
        index.set(cluster, "H100", devices)
    return shares(
        total,
        per,
        current,
        lambda c: index.free(c, "H100"),
        index.most_free("H100"),
    )


def test_a_new_workload_goes_to_the_cluster_with_the_most_room_first() -> None:
    # given three clusters with 8, 4 and 2 free devices; when 6 replicas of 1 device are placed
    # then the most spacious takes all it can, and no other cluster is used
    assert place(6, {}, {"a": 4, "b": 8, "c": 2}) == {"b": 6}


def test_it_spreads_only_when_one_cluster_has_not_room_enough() -> None:
    assert place(10, {}, {"a": 4, "b": 8, "c": 2}) == {"b": 8, "a": 2}


def test_room_is_counted_in_whole_replicas() -> None:
    # 3 free devices hold one 2-device replica, not one and a half
    assert place(2, {}, {"a": 3, "b": 3}, per=2) == {"a": 1, "b": 1}


def test_ties_go_to_the_first_cluster_id() -> None:
    assert place(2, {}, {"b": 4, "a": 4}) == {"a": 2}


def test_what_fits_nowhere_waits_on_the_cluster_with_the_most_room() -> None:
    # admission keeps it pending for capacity there; it is not lost
    assert place(20, {}, {"a": 4, "b": 8}) == {"b": 16, "a": 4}


def test_growing_fills_the_clusters_the_workload_is_on_first() -> None:
    assert place(6, {"a": 2}, {"a": 3, "b": 8}) == {"a": 5, "b": 1}


def test_growing_leaves_clusters_whose_share_does_not_change_alone() -> None:
    assert place(5, {"a": 2, "b": 2}, {"a": 0, "b": 1, "c": 8}) == {"b": 3}


def test_shrinking_takes_from_the_largest_share_first() -> None:
    assert place(5, {"a": 2, "b": 5, "c": 1}, {}) == {"b": 2}
    assert place(1, {"a": 2, "b": 5, "c": 1}, {}) == {"b": 0, "a": 0}


def test_an_unchanged_total_changes_nothing() -> None:
    assert place(4, {"a": 1, "b": 3}, {"a": 0, "c": 9}) == {}


def test_no_candidate_and_no_deployment_means_not_placed() -> None:
    assert place(3, {}, {}) == {}


def test_growing_with_no_candidate_left_waits_on_the_largest_share() -> None:
    # its clusters are no longer candidates (unreachable), and there is no other
    assert shares(5, 1, {"a": 1, "b": 2}, lambda c: None, iter(())) == {"b": 4}


@given(
    total=st.integers(0, 60),
    current=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 10), max_size=4),
    free=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 16), max_size=8),
    per=st.integers(1, 4),
)
def test_shares_sum_to_the_total_and_touch_only_what_changes(
    total: int, current: dict[str, int], free: dict[str, int], per: int
) -> None:
    new = place(total, current, free, per)
    after = current | new
    if new or total == sum(current.values()):
        assert sum(after.values()) == total
    else:  # nowhere to go
        assert not current and not free
    assert all(new[c] != current.get(c) for c in new)  # every cluster named really changes
    assert all(share >= 0 for share in after.values())
    grew = {c for c in new if new[c] > current.get(c, 0)}
    if total <= sum(current.values()):
        assert not grew  # shrinking never grows a share
    else:
        assert all(new[c] >= current.get(c, 0) for c in new)  # growing never shrinks one


def test_the_index_skips_stale_entries_and_keeps_its_order() -> None:
    index = RoomIndex()
    for step in range(500):
        index.set(f"c{step % 7}", "H100", step)
    index.set("c3", "H100", None)
    order = list(index.most_free("H100"))
    assert [c for c, _ in order] == ["c2", "c1", "c0", "c6", "c5", "c4"]
    assert [f for _, f in order] == sorted((f for _, f in order), reverse=True)
    assert list(index.most_free("H100")) == order  # reading gives back what it took


def test_by_room_yields_most_room_first_reading_only_what_it_must() -> None:
    """Room is what fits the nodes (never more than free): b has the most free devices but
    room for none of the workload's pods, c fits no node at all."""
    candidates = [("b", 10), ("a", 8), ("c", 7), ("d", 6), ("e", 1), ("f", 1)]
    room = {"a": 8, "b": 0, "c": None, "d": 6, "e": 1, "f": 1}
    read: list[str] = []

    def fit(cluster: str, free: int) -> int | None:
        read.append(cluster)
        return room[cluster]

    ordered = by_room(iter(candidates), fit, per_replica=2)
    assert next(ordered) == ("a", 8)
    assert read == ["b", "a"]  # c has at most 7 free: a comes first, c not yet counted
    assert list(ordered) == [("d", 6), ("b", 0), ("e", 1), ("f", 1)]


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 20), min_size=1),
    st.integers(1, 4),
)
def test_by_room_orders_by_room_while_any_has_room(free: dict[str, int], per: int) -> None:
    index = RoomIndex()
    for cluster, devices in free.items():
        index.set(cluster, "H100", devices)
    halved = list(by_room(index.most_free("H100"), lambda c, f: f // 2, per))
    rooms = [r for _, r in halved if r >= per]
    assert rooms == sorted(rooms, reverse=True)
    assert {c for c, r in halved if r >= per} == {c for c, f in free.items() if f // 2 >= per}
