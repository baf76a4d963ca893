"""Placement and admission cost per event as the fleet grows: neither may scan the fleet.

**Method.** The scheduler's ledger (`domain/admission.py`, with placement from
`domain/placement.py`) is built for a small fleet (100 clusters, 1,000 workloads, 10 projects)
and for a large one (10,000 clusters, 100,000 workloads, 1,000 projects). Clusters report 16
H100s on 2 nodes; workloads are unpinned, so placement chooses their clusters by room, and each
project's quota covers about nine tenths of what its workloads want, so some deployments always
wait. Then the same mix of churn events is applied to each ledger, exactly as the scheduler
applies them: fold the event, decide for whoever it concerns, then place every workload it
asks for and decide for the deployments that placement touched, recording each decision.

The mix: workloads scaled (placement re-divides them; growth past a quota, which covers only
nine tenths of what is wanted, is granted in part) and rolled out to a new serving
configuration; replicas started and terminated; inventory re-reports; quota changes; clusters
becoming unreachable and reachable again. Workloads are created in the build only: creating
more during the churn would grow the small fleet many times over, not keep it steady. One
workload in ten has placement preferences (two preferred clusters, spread).

Time passes as in a fleet where each workload sees one event every ten minutes, so a larger
fleet has more events per second; the events carry that time. Every 30 s of it (the
scheduler's longest wait between looks, `services/hub/scheduler.py`) the moves due are looked
for and made as the scheduler makes them (`domain/moves.py`, default rules): shares waiting for
capacity longer than 5 minutes, shares on clusters unreachable longer than 10 minutes, and
rebalancing toward preferences. Their cost is counted in the events' cost, as it is in the
scheduler's; the longest look is printed too.

Each fleet first takes three churn events per workload, so both are measured in their steady
state (workloads spread, replicas running, rollouts under way, some deployments waiting) rather
than fresh. A round then times one churn event per workload: both sizes are measured having
lived through the same churn per workload (a fleet churned for longer spreads its workloads over
more clusters, which changes the mix). So that the small fleet is timed over as many events as
the large one, a hundred small fleets (different seeds) are measured one after the other, each
alone in memory, and their times in each round added up: a round is then 100,000 events at
either size, and the best round counts at either. The baseline is the smallest fleet, so the
ratio says how much more an event costs when the fleet is a hundred times larger. The garbage
collector runs with the hub's thresholds (`services/cli/hub.py`), as the scheduler does.

    python bench/admission.py [--rounds 3] [--devices-per-replica 4]

With `--devices-per-replica N` every replica is one pod of N devices on one node (clusters,
quotas and starts scaled by N), so admission and placement count pods per node; at 1 they take
the sums' shortcut.

The last line is `admission_cost_ratio=<per-event cost at the largest fleet / at the smallest>`.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datetime import UTC, datetime, timedelta

from wingsmith.domain.admission import Ledger, Slot
from wingsmith.domain.moves import MoveRules, due
from wingsmith.services.cli.hub import GC_THRESHOLDS

DEVICES_PER_CLUSTER = 16  # at one device per replica; times the devices per replica
PER_REPLICA = [1]  # devices per replica (--devices-per-replica)
FLEETS = ((100, 1_000, 10), (10_000, 100_000, 1_000))  # clusters, workloads, projects
EVENT_EVERY = 600.0  # seconds between two events of one workload, on average
LOOK_EVERY = timedelta(seconds=30)  # between two looks for the moves due
RULES = MoveRules()  # the defaults: 5 min waiting for capacity, 10 min lost, 1/4 a move
START = datetime(2026, 12, 1, tzinfo=UTC)


class Fleet:
    """A ledger fed the way the scheduler feeds it."""

    def __init__(self, clusters: int, workloads: int, projects: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.position = 0
        self.clusters, self.projects = clusters, projects
        self.replicas: list[tuple[str, str]] = []  # (replica id, deployment id)
        self.decisions = self.placements = self.partial = 0  # partial: granted in part
        self.moves: dict[str, int] = {}  # moves made, by reason
        self.longest_look = 0.0  # seconds
        self.unreachable: set[int] = set()
        self.tick = timedelta(seconds=EVENT_EVERY / workloads)
        self.now, self.looked = START, START
        self.stamp = START.isoformat()
        for c in range(clusters):  # its operator speaks first: placement chooses it then
            self.event("OperatorConnected", f"c{c}", operator={})
            self.inventory(c)
        per_project = workloads * 3 // 2 // projects
        for p in range(projects):
            quota = per_project * 9 // 10 * PER_REPLICA[0]
            self.event("QuotaSet", f"p{p}", device_class="H100", devices=quota)
        self.workloads: list[str] = []
        for _ in range(workloads):
            self.create_workload()

    @property
    def deployments(self) -> dict[str, Slot]:
        return self.ledger.deployments

    def event(self, event_type: str, aggregate_id: str, **e: Any) -> None:
        self.position += 1
        e["timestamp"] = self.stamp
        candidates = self.ledger.apply(self.position, event_type, aggregate_id, e)
        self.decide(candidates)
        while (placement := self.ledger.next_placement()) is not None:
            self.placements += 1
            self.own_events(len(placement.shares))
            self.decide(self.ledger.record_placement(placement))

    def pass_time(self) -> None:
        """One event's time passes; when a look is due, the moves due are made."""
        self.now += self.tick
        self.stamp = self.now.isoformat()
        if self.now - self.looked < LOOK_EVERY:
            return
        self.looked = self.now
        started = time.perf_counter()
        for placement, deployments in due(self.ledger, self.now, RULES):
            assert placement.move is not None
            reason = placement.move.reason
            self.moves[reason] = self.moves.get(reason, 0) + 1
            self.own_events(len(placement.shares) + 1)  # the shares, and WorkloadMoved
            self.decide(deployments)
        self.longest_look = max(self.longest_look, time.perf_counter() - started)

    def decide(self, candidates: list[str]) -> None:
        for decision in self.ledger.decide_all(candidates):
            self.decisions += 1
            self.partial += decision.admitted and decision.reason is not None
            self.own_events(1)

    def own_events(self, count: int) -> None:
        """The hub's events for what the ledger recorded come back later and are skipped:
        only the position moves."""
        self.position += count
        self.ledger.position = self.position

    def inventory(self, c: int) -> None:
        nodes = [
            {
                "node_id": f"c{c}-n{n}",
                "device_class": "H100",
                "devices": DEVICES_PER_CLUSTER * PER_REPLICA[0] // 2,
            }
            for n in range(2)
        ]
        self.event("InventoryReported", f"c{c}", nodes=nodes)

    def create_workload(self) -> None:
        workload = f"w{len(self.workloads)}"
        self.workloads.append(workload)
        self.event(
            "WorkloadCreated",
            workload,
            project=f"p{len(self.workloads) % self.projects}",
            device_class="H100",
            serving={"devices_per_replica": PER_REPLICA[0]},
            serving_digest="d1",
            replicas=self.rng.randint(1, 2),
            cluster_pin=None,
            preferences=self.preferences(),
        )

    def preferences(self) -> dict[str, Any] | None:
        if self.rng.random() >= 0.1:
            return None
        preferred = [f"c{self.rng.randrange(self.clusters)}" for _ in range(2)]
        return {"preferred_clusters": list(dict.fromkeys(preferred)), "strategy": "spread"}

    def roll_out(self, workload: str) -> None:
        """A new serving configuration on the workload and each of its deployments."""
        planned = self.ledger.workloads[workload]
        digest = "d2" if planned.digest == "d1" else "d1"
        serving = {"devices_per_replica": PER_REPLICA[0]}
        self.event("WorkloadServingConfigChanged", workload, serving=serving, serving_digest=digest)
        for deployment in list(planned.deployments.values()):
            self.event("ServingConfigChanged", deployment, serving=serving, serving_digest=digest)

    def churn(self) -> None:
        """One event of the mix, after its time passed."""
        self.pass_time()
        roll = self.rng.random()
        workload = self.rng.choice(self.workloads)
        planned = self.ledger.workloads[workload]
        if roll < 0.25:
            self.event("WorkloadScaled", workload, replicas=self.rng.randint(0, 4))
        elif roll < 0.5 and planned.deployments:  # only within what was granted
            deployment = self.rng.choice(list(planned.deployments.values()))
            slot = self.deployments[deployment]
            per = PER_REPLICA[0]
            if slot.allocated + per <= slot.granted:
                replica = f"r{self.position}"
                self.replicas.append((replica, deployment))
                self.event(
                    "ReplicaStarted",
                    replica,
                    deployment_id=deployment,
                    device_ids=[f"GPU-{i}" for i in range(per)],
                    # not drawn from rng: the churn stays the same whatever the pod size
                    node_id=f"{slot.cluster}-n{len(self.replicas) % 2}",
                    serving_digest=slot.digest,
                )
                if slot.phase == "admitted" and slot.allocated >= slot.granted:
                    self.event("DeploymentRunning", deployment)  # as its operator reports
        elif roll < 0.72 and self.replicas:
            i = self.rng.randrange(len(self.replicas))
            self.replicas[i], self.replicas[-1] = self.replicas[-1], self.replicas[i]
            replica, _ = self.replicas.pop()
            self.event("ReplicaTerminated", replica)
        elif roll < 0.85:
            self.roll_out(workload)
        elif roll < 0.9:
            self.inventory(self.rng.randrange(self.clusters))
        elif roll < 0.95:
            c = self.rng.randrange(self.clusters)
            reachable = c in self.unreachable
            self.unreachable ^= {c}
            self.event("ClusterReachable" if reachable else "ClusterUnreachable", f"c{c}")
        else:
            p = self.rng.randrange(self.projects)
            devices = self.rng.randint(100, 180) * PER_REPLICA[0]
            self.event("QuotaSet", f"p{p}", device_class="H100", devices=devices)


def timed(fleet: Fleet, events: int) -> float:
    gc.collect()
    started = time.perf_counter()
    for _ in range(events):
        fleet.churn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices-per-replica", type=int, default=1)
    args = parser.parse_args()
    PER_REPLICA[0] = args.devices_per_replica
    gc.set_threshold(*GC_THRESHOLDS)
    costs = []
    for clusters, workloads, projects in FLEETS:
        copies = FLEETS[-1][1] // workloads  # as many small fleets as make one large one
        built = 0.0
        rounds = [0.0] * args.rounds  # each round's time, over every copy
        for seed in range(copies):  # one at a time: each small fleet alone in memory
            started = time.perf_counter()
            fleet = Fleet(clusters, workloads, projects, seed=seed)
            for _ in range(3 * workloads):  # to a steady state: every workload churned
                fleet.churn()
            built += time.perf_counter() - started
            # a round: one churn event per workload, so both sizes are measured having lived
            # through the same churn per workload
            for r in range(args.rounds):
                rounds[r] += timed(fleet, workloads)
        best = min(rounds) / (workloads * copies)
        costs.append(best)
        waiting = sum(len(q) for q in fleet.ledger.waiting_in.values())
        moved = ", ".join(f"{n:,} {reason}" for reason, n in sorted(fleet.moves.items()))
        print(
            f"{clusters:>6,} clusters {workloads:>7,} workloads x {copies:>3}: built and warmed "
            f"in {built:.1f} s; in the last fleet {len(fleet.deployments):,} deployments, "
            f"{waiting:,} waiting, {fleet.placements:,} placements, {fleet.decisions:,} "
            f"decisions ({fleet.partial:,} granting in part), moves {moved}, longest look for "
            f"moves {fleet.longest_look * 1e3:.1f} ms; {best * 1e6:6.2f} µs per event "
            f"(best of {args.rounds} rounds, {workloads * copies:,} events)"
        )
    print(f"admission_cost_ratio={costs[-1] / costs[0]:.3f}")


if __name__ == "__main__":
    main()
