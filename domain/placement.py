"""Placement: which clusters a workload's replicas go to, and how many on each (pure).

Policy (docs/scheduling.md, "Placement"):
- A pinned workload has one deployment, on its pin, with all its replicas.
- Otherwise the candidates are the reachable clusters that report the workload's device class,
  narrowed to its allow-list when it has one, and whose nodes can hold its engine workers
  (domain/nodes.py). Room on a cluster is its devices of that class minus what every
  deployment there holds or wants, in whole replicas, and no more replicas than whole pods of
  theirs fit on its nodes.
- Growing fills clusters the workload is on first, then new ones, each time the cluster with the
  most room first (ties: cluster id). Replicas no cluster has room for go to the candidate with
  the most room, where admission keeps them pending for capacity rather than losing them.
- Shrinking takes from the largest shares first, so as few clusters as possible change.
- Only clusters whose share changes are touched; a share may fall to zero (the deployment stays,
  scaled to zero).

A workload with preferences (`Preferences`) is placed by them instead (`preferred_shares`):
the candidates are narrowed to the clusters whose labels match its selector and ordered by its
list of preferred clusters (the others after, most room first); `pack` fills the first with
room, then the next; `spread` gives each replica to the candidate with room holding the fewest.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from wingsmith.domain.values import LabelKey, LabelValue, Name


@dataclass(frozen=True, slots=True)
class Move:
    """Replicas of a workload's share on one cluster given to another, and why."""

    from_cluster: str
    to_cluster: str
    replicas: int
    reason: str  # a MoveReason (domain/workload.py)


class Strategy(StrEnum):
    PACK = "pack"  # fill the most preferred cluster with room first, then the next
    SPREAD = "spread"  # as even as room allows over every matching cluster


class Preferences(BaseModel):
    """Where a workload's replicas should rather go. Empty: placement's default (most room)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preferred_clusters: tuple[Name, ...] = Field(default=(), max_length=64)
    cluster_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    strategy: Strategy = Strategy.PACK

    @property
    def given(self) -> bool:
        return bool(self.preferred_clusters or self.cluster_selector) or (
            self.strategy is Strategy.SPREAD
        )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a cluster with these labels may take the workload's replicas."""
        return all(labels.get(k) == v for k, v in self.cluster_selector.items())

    def order(self, candidates: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """(cluster, room) most preferred first: the listed ones in their order, then the
        others as they come (most room first)."""
        rank = {c: i for i, c in enumerate(self.preferred_clusters)}
        listed = sorted((t for t in candidates if t[0] in rank), key=lambda t: rank[t[0]])
        return listed + [t for t in candidates if t[0] not in rank]


def preferred_shares(
    total: int,
    per_replica: int,
    current: dict[str, int],
    candidates: list[tuple[str, int]],
    strategy: Strategy,
) -> dict[str, int]:
    """The workload's new shares by its preferences: `candidates` are (cluster, free devices
    beyond what is claimed there, this workload included) most preferred first. Returns only
    the clusters whose share changes; {} also when there is nowhere to go."""
    change = total - sum(current.values())
    if change < 0:
        return _shrink_by(current, -change, [c for c, _ in candidates], strategy)
    if change == 0:
        return {}
    grown = dict(current)
    rooms = {c: room // per_replica if per_replica else 0 for c, room in candidates}
    order = [c for c, _ in candidates]
    left = (_pack if strategy is Strategy.PACK else _spread)(grown, rooms, order, change)
    if left:  # no room anywhere: the rest waits for capacity on the first choice
        target = _waiting_place(grown, order, strategy)
        if target is None:
            return {}
        grown[target] = grown.get(target, 0) + left
    return {c: n for c, n in grown.items() if n != current.get(c, 0)}


def _pack(grown: dict[str, int], rooms: dict[str, int], order: list[str], change: int) -> int:
    for cluster in order:
        take = min(change, rooms[cluster])
        if take:
            grown[cluster] = grown.get(cluster, 0) + take
            change -= take
    return change


def _spread(grown: dict[str, int], rooms: dict[str, int], order: list[str], change: int) -> int:
    heap = [(grown.get(c, 0), i, c) for i, c in enumerate(order) if rooms[c] > 0]
    heapq.heapify(heap)
    while change and heap:
        share, i, cluster = heapq.heappop(heap)
        grown[cluster] = share + 1
        rooms[cluster] -= 1
        change -= 1
        if rooms[cluster] > 0:
            heapq.heappush(heap, (share + 1, i, cluster))
    return change


def _waiting_place(grown: dict[str, int], order: list[str], strategy: Strategy) -> str | None:
    if not order:
        return max(grown, key=lambda c: (grown[c], c), default=None)
    if strategy is Strategy.PACK:
        return order[0]
    return min(order, key=lambda c: (grown.get(c, 0), order.index(c)))


def _shrink_by(
    current: dict[str, int], cut: int, order: list[str], strategy: Strategy
) -> dict[str, int]:
    """Take from clusters no longer candidates first, then the least preferred (pack) or the
    largest shares (spread)."""
    rank = {c: i for i, c in enumerate(order)}
    if strategy is Strategy.SPREAD:  # one at a time from the largest: as even as it was
        left = dict(current)
        for _ in range(cut):
            cluster = max(
                (c for c in left if left[c]), key=lambda c: (c not in rank, left[c], rank.get(c, 0))
            )
            left[cluster] -= 1
        return {c: n for c, n in left.items() if n != current[c]}
    new: dict[str, int] = {}
    for cluster in sorted(current, key=lambda c: (c in rank, -rank.get(c, 0), c)):
        take = min(cut, current[cluster])
        if take:
            new[cluster] = current[cluster] - take
            cut -= take
    return new


class RoomIndex:
    """Candidate clusters by free devices, per device class, most first. A lazy heap: an
    update pushes a new entry and leaves the old one to be skipped, so updates and reading the
    top k cost O(log n) each, however large the fleet."""

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[int, str]]] = {}
        self._free: dict[str, dict[str, int]] = {}  # device class -> cluster -> free devices

    def set(self, cluster: str, device_class: str, free: int | None) -> None:
        """The cluster's free devices of this class; None: not a candidate."""
        free_in = self._free.setdefault(device_class, {})
        if free is None:
            free_in.pop(cluster, None)
            return
        if free_in.get(cluster) == free:
            return
        free_in[cluster] = free
        heap = self._heaps.setdefault(device_class, [])
        heapq.heappush(heap, (-free, cluster))
        if len(heap) > 4 * len(free_in) + 64:  # mostly stale entries: rebuild from the live
            self._heaps[device_class] = [(-f, c) for c, f in free_in.items()]
            heapq.heapify(self._heaps[device_class])

    def free(self, cluster: str, device_class: str) -> int | None:
        return self._free.get(device_class, {}).get(cluster)

    def most_free(
        self, device_class: str, among: Iterable[str] | None = None
    ) -> Generator[tuple[str, int], None, None]:
        """(cluster, free), most free first, ties by cluster id, among all candidates or only
        those named. Stop early and only what was read is paid; what was read goes back into
        the index when the generator is closed."""
        free_in = self._free.get(device_class, {})
        if among is not None:
            named = ((c, f) for c in among if (f := free_in.get(c)) is not None)
            yield from sorted(named, key=lambda t: (-t[1], t[0]))
            return
        heap = self._heaps.get(device_class, [])
        taken: list[tuple[int, str]] = []
        try:
            while heap:
                entry = heapq.heappop(heap)
                if free_in.get(entry[1]) != -entry[0] or (taken and taken[-1] == entry):
                    continue  # stale (the cluster moved since, or left) or a duplicate
                taken.append(entry)
                yield entry[1], -entry[0]
        finally:
            for entry in taken:
                heapq.heappush(heap, entry)


LOOK_AHEAD = 8


def by_room(
    candidates: Iterable[tuple[str, int]],
    fit: Callable[[str, int], int | None],
    per_replica: int,
) -> Generator[tuple[str, int], None, None]:
    """(cluster, room), most room first, from candidates most free first, where the room is
    what `fit(cluster, free)` counts (never more than free: its pods must also fit the nodes;
    None: not a candidate). A candidate is yielded once none after it can have more room, so
    only those read are paid for. Once the free devices fall below one replica, none left has
    room: they follow as they come. At most LOOK_AHEAD candidates are read ahead of the one
    yielded, so where rooms fall short of free devices on many clusters, the order is most room
    first among the candidates read ahead."""
    ahead: list[tuple[int, int, str]] = []  # (-room, -free, cluster): read, not yet yielded
    stream = iter(candidates)
    for cluster, free in stream:
        # nothing from here on has more room; or enough were read ahead (a fleet whose nodes
        # are fragmented throughout is not scanned for the very best)
        while ahead and (-ahead[0][0] >= free or len(ahead) >= LOOK_AHEAD):
            room, _, best = heapq.heappop(ahead)
            yield best, -room
        if free < per_replica:
            stream = itertools.chain([(cluster, free)], stream)
            break
        counted = fit(cluster, free)
        if counted is not None:
            heapq.heappush(ahead, (-counted, -free, cluster))
    while ahead:
        room, _, best = heapq.heappop(ahead)
        yield best, -room
    for cluster, free in stream:
        if (counted := fit(cluster, free)) is not None:
            yield cluster, counted


def shares(
    total: int,
    per_replica: int,
    current: dict[str, int],
    room: Callable[[str], int | None],
    most_free: Iterable[tuple[str, int]],
) -> dict[str, int]:
    """The workload's new shares: `current` (cluster -> replicas) changed as little as possible
    so the shares sum to `total`. `room(cluster)` is the free devices on a cluster it is on
    (None: no longer a candidate); `most_free` the candidates, most free devices first. Returns
    only the clusters whose share changes; {} also when there is nowhere to go."""
    change = total - sum(current.values())
    if change < 0:
        return _shrink(current, -change)
    if change == 0:
        return {}
    new: dict[str, int] = {}
    on = sorted(
        ((free, c) for c in current if (free := room(c)) is not None), key=lambda t: (-t[0], t[1])
    )
    for free, cluster in on:
        take = min(change, free // per_replica)
        if take:
            new[cluster] = current[cluster] + take
            change -= take
    spacious: str | None = None  # the candidate with the most room: where leftovers wait
    for cluster, free in most_free if change else ():
        spacious = spacious or cluster
        if not change or free < per_replica:
            break  # placed; or no candidate from here on has room for a replica
        take = 0 if cluster in current else min(change, free // per_replica)
        if take:
            new[cluster] = take
            change -= take
    if change:  # no room anywhere: the leftover waits for capacity on one cluster
        target = spacious or max(current, key=lambda c: (current[c], c), default=None)
        if target is None:
            return {}  # nowhere to go: not placed
        new[target] = new.get(target, current.get(target, 0)) + change
    return new


def _shrink(current: dict[str, int], cut: int) -> dict[str, int]:
    new: dict[str, int] = {}
    for cluster in sorted(current, key=lambda c: (-current[c], c)):
        if not cut:
            break
        take = min(cut, current[cluster])
        if take:
            new[cluster] = current[cluster] - take
            cut -= take
    return new
