"""Admission cost per event as the fleet grows: the decision must not scan the fleet.

**Method.** The admission ledger (`domain/admission.py`) is built for a small fleet (100
clusters, 1,000 deployments, 10 projects) and for a large one (10,000 clusters, 100,000
deployments, 1,000 projects). Clusters report 16 H100s on 2 nodes, and each project's quota
covers about nine tenths of what its deployments want, so some deployments always wait. Then
the same mix of churn events is applied to each ledger, exactly as the admission process
applies them: fold the event, then decide for whoever it concerns, recording each decision.
The mix is scaling (up and down), replicas started and terminated, inventory re-reports and
quota changes. Each fleet first takes three churn events per deployment, so both are measured
in their steady state (deployments scaled, replicas running, some waiting) rather than fresh.
The baseline is the smallest fleet, so the ratio says how much more an event costs when the
fleet is a hundred times larger. Placement is not part of this yet.

    python bench/admission.py [--events 100000]

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

from domain.admission import Decision, Ledger

DEVICES_PER_CLUSTER = 16
FLEETS = ((100, 1_000, 10), (10_000, 100_000, 1_000))  # clusters, deployments, projects


class Fleet:
    """A ledger fed the way the admission process feeds it."""

    def __init__(self, clusters: int, deployments: int, projects: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.position = 0
        self.clusters, self.projects = clusters, projects
        self.replicas: list[tuple[str, str]] = []  # (replica id, deployment id)
        self.decisions = 0
        for c in range(clusters):
            self.inventory(c)
        per_project = deployments // projects
        for p in range(projects):
            self.event("QuotaSet", f"p{p}", device_class="H100", devices=per_project * 9 // 10)
        self.deployments = [f"d{i}" for i in range(deployments)]
        for i, deployment in enumerate(self.deployments):
            self.event(
                "DeploymentCreated",
                deployment,
                cluster_id=f"c{i % clusters}",
                project=f"p{i % projects}",
                device_class="H100",
                serving={"devices_per_replica": 1},
                desired_replicas=1,
                authority="managed",
            )

    def event(self, event_type: str, aggregate_id: str, **e: Any) -> None:
        self.position += 1
        candidates = self.ledger.apply(self.position, event_type, aggregate_id, e)
        for decision in self.ledger.decide_all(candidates):
            self.decided(decision)

    def decided(self, decision: Decision) -> None:
        """The decision's own event comes back later and is skipped: only the position moves."""
        self.decisions += 1
        self.position += 1
        self.ledger.position = self.position

    def inventory(self, c: int) -> None:
        nodes = [
            {"node_id": f"c{c}-n{n}", "device_class": "H100", "devices": DEVICES_PER_CLUSTER // 2}
            for n in range(2)
        ]
        self.event("InventoryReported", f"c{c}", nodes=nodes)

    def churn(self) -> None:
        """One event of the mix."""
        roll = self.rng.random()
        deployment = self.rng.choice(self.deployments)
        if roll < 0.35:
            self.event("DeploymentScaled", deployment, desired_replicas=self.rng.randint(0, 3))
        elif roll < 0.65:  # a cluster starts replicas only within what was granted
            slot = self.ledger.deployments[deployment]
            if slot.allocated < slot.granted:
                replica = f"r{self.position}"
                self.replicas.append((replica, deployment))
                self.event(
                    "ReplicaStarted", replica, deployment_id=deployment, device_ids=["GPU-0"]
                )
        elif roll < 0.9 and self.replicas:
            i = self.rng.randrange(len(self.replicas))
            self.replicas[i], self.replicas[-1] = self.replicas[-1], self.replicas[i]
            replica, _ = self.replicas.pop()
            self.event("ReplicaTerminated", replica)
        elif roll < 0.95:
            self.inventory(self.rng.randrange(self.clusters))
        else:
            p = self.rng.randrange(self.projects)
            self.event("QuotaSet", f"p{p}", device_class="H100", devices=self.rng.randint(50, 120))


def per_event(fleet: Fleet, events: int) -> float:
    gc.collect()
    started = time.perf_counter()
    for _ in range(events):
        fleet.churn()
    return (time.perf_counter() - started) / events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    costs = []
    for clusters, deployments, projects in FLEETS:
        started = time.perf_counter()
        fleet = Fleet(clusters, deployments, projects)
        for _ in range(3 * deployments):  # to a steady state: every deployment churned
            fleet.churn()
        built = time.perf_counter() - started
        waiting = sum(len(q) for q in fleet.ledger.waiting_in.values())
        best = min(per_event(fleet, args.events) for _ in range(args.rounds))
        costs.append(best)
        print(
            f"{clusters:>6,} clusters {deployments:>7,} deployments {projects:>5,} projects: "
            f"built and warmed in {built:.1f} s, {waiting:,} waiting; "
            f"{best * 1e6:6.2f} µs per event (best of {args.rounds} x {args.events:,}), "
            f"{fleet.decisions:,} decisions in all"
        )
    print(f"admission_cost_ratio={costs[-1] / costs[0]:.3f}")


if __name__ == "__main__":
    main()
