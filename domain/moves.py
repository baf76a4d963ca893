"""Placement that moves (pure): which replicas go from one cluster to another now, and why.

Three reasons (docs/scheduling.md, "Placement that moves"): a share that has waited for
capacity longer than a delay; the shares on a cluster unreachable longer than its grace period
(a deployment whose whole share left is disabled, not deleted: its replicas may still run, and
its operator takes them down when the cluster returns); and a workload with preferences whose
settled shares are not where its preferences would place it now (rebalancing, a fraction of it
at a time). A move goes only where the target has room now and is recorded in the ledger as a
placement before the next is looked for, so admission still decides for everything that moved
and no two moves count on the same room. Pinned workloads never move; a deployment a person
disabled takes no moved replicas, and its workload is not rebalanced.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from wingsmith.domain.admission import CAPACITY, QUOTA, Ledger, Placement, Planned, Slot
from wingsmith.domain.deployment import AdmissionPhase
from wingsmith.domain.placement import Move, preferred_shares
from wingsmith.domain.workload import MoveReason


@dataclass(frozen=True, slots=True)
class MoveRules:
    move_after: timedelta = timedelta(seconds=300)  # a share waiting for capacity that long
    lost_after: timedelta = timedelta(seconds=600)  # a cluster unreachable that long is lost
    max_fraction: float = 0.25  # of a workload's replicas one rebalancing move may take


def due(ledger: Ledger, now: datetime, rules: MoveRules) -> Iterator[tuple[Placement, list[str]]]:
    """The moves due at `now`, each recorded in the ledger (`record_placement`) before the next
    is looked for; with the deployments to decide for once the hub has made it. Shares waiting
    too long first, then those on lost clusters, then rebalancing. Lazily: a move yielded is
    recorded, so one that raises while the next is looked for leaves those before it to make."""
    moves = Moves(ledger)
    found = itertools.chain(
        moves.waiting_too_long(now - rules.move_after),
        moves.on_lost_clusters(now - rules.lost_after),
        moves.rebalancing(rules.max_fraction),
    )
    for placement in found:
        yield placement, ledger.record_placement(placement)


def before(at: str | None, moment: datetime) -> bool:
    """Whether an event time (ISO; None: unknown, taken as long ago) is before `moment`."""
    return at is None or datetime.fromisoformat(at) <= moment


class Moves:
    """The ledger as moves read it."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        # per device class, the most free devices any candidate had when this look began: a
        # replica larger than that has nowhere to go in it (room a move leaves behind is seen
        # by the next look), and is passed over before its workload is read
        self.most_free: dict[str, int] = {}

    def could_go_anywhere(self, slot: Slot) -> bool:
        most = self.most_free.get(slot.device_class)
        if most is None:
            with contextlib.closing(self.ledger.room.most_free(slot.device_class)) as found:
                top = next(found, None)
            most = self.most_free[slot.device_class] = 0 if top is None else top[1]
        return slot.per_replica <= most

    def waiting_too_long(self, since: datetime) -> Iterable[Placement]:
        """Replicas waiting for capacity (or on an unreachable cluster) since before `since`:
        as many as fit elsewhere go there. A queue is in the order its deployments began to
        wait, so each is read only as far as those waiting long enough."""
        ledger = self.ledger
        for (cluster, _), queue in list(ledger.waiting_in.items()):
            for deployment_id in list(queue):
                slot = ledger.deployments[deployment_id]
                if not before(slot.waiting_at, since):
                    break
                unreachable = not ledger.reachable.get(cluster, True)
                stuck = slot.reason == CAPACITY or (unreachable and slot.reason != QUOTA)
                waiting = waiting_replicas(slot)
                if stuck and waiting:
                    yield from self.move_away(slot, waiting, MoveReason.PENDING_TOO_LONG)

    def on_lost_clusters(self, since: datetime) -> Iterable[Placement]:
        """Every share on a cluster unreachable since before `since` goes where room is."""
        ledger = self.ledger
        lost = {c for c, at in ledger.unreachable_at.items() if before(at, since)}
        for (cluster, _), members in list(ledger.members.items()):
            if cluster in lost:
                for deployment_id in list(members):
                    slot = ledger.deployments[deployment_id]
                    if slot.enabled and not slot.deleted and slot.managed and slot.desired:
                        yield from self.move_away(slot, slot.desired, MoveReason.CLUSTER_LOST)

    def move_away(self, slot: Slot, replicas: int, reason: MoveReason) -> Iterable[Placement]:
        """Moves of up to `replicas` of a share to the workload's other candidates with room,
        most preferred (or most room) first."""
        if not self.could_go_anywhere(slot):
            return
        ledger = self.ledger
        workload_id = slot.workload or ""
        w = ledger.workloads.get(workload_id)
        if w is None or w.pinned or w.deployments.get(slot.cluster) is None:
            return
        if not ledger.room_anywhere(w):
            return  # no candidate has room for one replica: none is looked at
        exclude = {slot.cluster, *ledger.held_off(w)}
        for target, free in ledger.candidates(w, exclude, enough=replicas):
            take = min(replicas, free // w.per_replica)
            if take > 0:
                yield self.move(workload_id, w, slot.cluster, target, take, reason)
                replicas -= take
                if not replicas:
                    return

    def rebalancing(self, max_fraction: float) -> Iterable[Placement]:
        for workload_id in list(self.ledger.preferring):
            placement = self.rebalance(workload_id, max_fraction)
            if placement is not None:
                yield placement

    def rebalance(self, workload_id: str, max_fraction: float) -> Placement | None:
        """One move toward where the workload's preferences would place it from scratch, once
        what it has is settled, of no more than `max_fraction` of its replicas, from the share
        furthest from there to the most preferred short one with room."""
        ledger = self.ledger
        w = ledger.workloads[workload_id]
        if w.pinned or ledger.held_off(w) or not self.settled(w):
            return None
        current = self.shares(w)
        cap = int(max_fraction * sum(current.values()))
        if cap <= 0:
            return None
        rooms = dict(ledger.candidates(w, exclude=set(), enough=w.replicas))
        ideal = self.ideal(w, rooms)
        order = list(rooms)
        surplus = [c for c in current if c not in rooms and current[c]] + [
            c for c in reversed(order) if current.get(c, 0) > ideal.get(c, 0)
        ]
        deficit = [
            c for c in order if ideal.get(c, 0) > current.get(c, 0) and rooms[c] >= w.per_replica
        ]
        if not surplus or not deficit:
            return None
        source, target = surplus[0], deficit[0]
        take = min(
            current[source] - ideal.get(source, 0),
            ideal[target] - current.get(target, 0),
            rooms[target] // w.per_replica,
            cap,
        )
        return self.move(workload_id, w, source, target, take, MoveReason.REBALANCE)

    def ideal(self, w: Planned, rooms: dict[str, int]) -> dict[str, int]:
        """Where its preferences would place the workload now, what it holds counted as room."""
        own = {
            c: room + self.ledger.deployments[w.deployments[c]].claim
            for c, room in rooms.items()
            if c in w.deployments
        }
        candidates = [(c, own.get(c, room)) for c, room in rooms.items()]
        return preferred_shares(w.replicas, w.per_replica, {}, candidates, w.preferences.strategy)

    def settled(self, w: Planned) -> bool:
        """Every share it has serves, with all it wants granted: nothing of it is on the way."""
        for cluster, deployment_id in w.deployments.items():
            slot = self.ledger.deployments[deployment_id]
            if not slot.enabled or not slot.desired:
                continue
            if not self.ledger.reachable.get(cluster, True):
                return False
            if slot.phase != AdmissionPhase.RUNNING or slot.reason is not None:
                return False
            if slot.granted < slot.wanted:
                return False
        return True

    def shares(self, w: Planned) -> dict[str, int]:
        return {c: self.ledger.deployments[d].desired for c, d in w.deployments.items()}

    def move(
        self, workload_id: str, w: Planned, source: str, target: str, take: int, reason: str
    ) -> Placement:
        """The placement that moves `take` replicas: both shares, the lost source disabled
        when it empties, a target disabled by an earlier move enabled."""
        current = self.shares(w)
        left = current[source] - take
        new = {source: left, target: current.get(target, 0) + take}
        target_slot = self.ledger.deployments.get(w.deployments.get(target, ""))
        return Placement(
            workload_id,
            w.replicas,
            w.digest,
            new,
            {c: current[c] for c in new if c in current},
            move=Move(source, target, take, str(reason)),
            disable=source if reason == MoveReason.CLUSTER_LOST and not left else None,
            enable=target if target_slot is not None and not target_slot.enabled else None,
        )


def waiting_replicas(slot: Slot) -> int:
    """Its replicas admission has not granted (none while a new generation rolls out)."""
    if slot.rolling or not slot.enabled or slot.deleted or not slot.per_replica:
        return 0
    granted = max(min(slot.granted, slot.wanted) - slot.previous, 0) // slot.per_replica
    return max(slot.desired - granted, 0)
