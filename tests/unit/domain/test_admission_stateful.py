"""Safety of admission under random fleets: the real aggregates record every event, the ledger
folds them and decides, and each decision goes back through the Deployment aggregate. No grant
ever exceeds the cluster's devices or the project's quota left by everything else, counted
here from the aggregates themselves; the ledger's sums and phases always equal that recount."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from domain.admission import HOLDS, Decision, Ledger
from domain.base import Aggregate, DomainError, Event, split_id
from domain.cluster import Cluster, Node
from domain.deployment import AdmissionReason, Authority, Deployment
from domain.project import Project
from domain.replica import Replica

from .conftest import cluster, plane, serving

CLUSTERS = ("east", "west")
PROJECTS = ("p", "q")


def inventory(devices: int) -> tuple[Node, ...]:
    return (Node(node_id="n1", device_class="H100", devices=devices),)


class AdmissionMachine(RuleBasedStateMachine):
    @initialize(totals=st.tuples(st.integers(0, 12), st.integers(0, 12)))
    def start(self, totals: tuple[int, int]) -> None:
        self.ledger = Ledger()
        self.position = 0
        self.deployments: list[Deployment] = []
        self.replicas: list[Replica] = []
        self.clusters = {name: Cluster.register(plane(), name, None, {}) for name in CLUSTERS}
        self.projects = {name: Project.register(plane(), name) for name in PROJECTS}
        for name, total in zip(CLUSTERS, totals, strict=True):
            self.clusters[name].report_inventory(cluster(), inventory(total))
        self.feed(*self.clusters.values(), *self.projects.values())

    # -- the process manager, as it will run ------------------------------------------------

    def feed(self, *aggregates: Aggregate) -> None:
        """Fold the aggregates' new events; decide for whoever they concern."""
        for event in [e for a in aggregates for e in a.collect_events()]:
            for decision in self.fold(event):
                self.check_and_record(decision)

    def fold(self, event: Event) -> list[Decision]:
        self.position += 1
        _, key = split_id(event.originator_id)
        body = event.model_dump(mode="json")
        candidates = self.ledger.apply(self.position, type(event).__name__, key, body)
        return self.ledger.decide_all(candidates)

    def check_and_record(self, decision: Decision) -> None:
        """The ledger recorded the decision when it made it; the aggregate must accept it. Its
        event comes back on the stream and is skipped, as the admission process skips its own
        events (the ledger may have decided again about that deployment since)."""
        deployment = next(d for d in self.deployments if d.key == decision.deployment_id)
        if decision.admitted and decision.devices > deployment.granted_devices:
            self.assert_room(deployment, decision.devices)
        deployment.decide_admission(
            plane(),
            admitted=decision.admitted,
            reason=None if decision.admitted else AdmissionReason(decision.reason),
            evidence=decision.evidence,
            devices=decision.devices,
        )
        for _ in deployment.collect_events():
            self.position += 1
            self.ledger.position = self.position

    def assert_room(self, grown: Deployment, devices: int) -> None:
        """Counted from the aggregates: what every other deployment holds."""
        total = self.clusters[grown.cluster_id].devices().get("H100", 0)
        quota = self.projects[grown.project].quota.get("H100", 0)
        others = [d for d in self.deployments if d is not grown]
        in_cluster = sum(self.held(d) for d in others if d.cluster_id == grown.cluster_id)
        by_project = sum(self.held(d) for d in others if d.project == grown.project)
        assert devices + in_cluster <= total, (devices, in_cluster, total)
        assert devices + by_project <= quota, (devices, by_project, quota)

    def held(self, d: Deployment) -> int:
        allocated = sum(
            len(r.device_ids)
            for r in self.replicas
            if r.deployment_id == d.key and not r.terminated
        )
        return max(d.granted_devices, allocated) if d.admission_phase in HOLDS else allocated

    # -- what people and clusters do --------------------------------------------------------

    @rule(
        cluster_id=st.sampled_from(CLUSTERS),
        project=st.sampled_from(PROJECTS),
        replicas=st.integers(0, 4),
        per=st.integers(1, 3),
    )
    def create(self, cluster_id: str, project: str, replicas: int, per: int) -> None:
        d = Deployment.create(
            plane(),
            workload_id=f"w{len(self.deployments)}",
            cluster_id=cluster_id,
            project=project,
            device_class="H100",
            serving=serving(devices_per_replica=per, parallelism={"tensor": per}),
            desired_replicas=replicas,
            authority=Authority.MANAGED,
        )
        self.deployments.append(d)
        self.feed(d)

    @precondition(lambda self: self.deployments)
    @rule(i=st.integers(0, 50), replicas=st.integers(0, 5))
    def scale(self, i: int, replicas: int) -> None:
        d = self.deployments[i % len(self.deployments)]
        d.scale(plane(), replicas)
        self.feed(d)

    @precondition(lambda self: self.deployments)
    @rule(i=st.integers(0, 50), on=st.booleans())
    def toggle(self, i: int, on: bool) -> None:
        d = self.deployments[i % len(self.deployments)]
        d.enable(plane()) if on else d.disable(plane())
        self.feed(d)

    @rule(project=st.sampled_from(PROJECTS), devices=st.integers(0, 12))
    def set_quota(self, project: str, devices: int) -> None:
        self.projects[project].set_quota(plane(), "H100", devices)
        self.feed(self.projects[project])

    @rule(cluster_id=st.sampled_from(CLUSTERS), devices=st.integers(0, 12))
    def report_inventory(self, cluster_id: str, devices: int) -> None:
        self.clusters[cluster_id].report_inventory(cluster(), inventory(devices))
        self.feed(self.clusters[cluster_id])

    @precondition(lambda self: self.deployments)
    @rule(i=st.integers(0, 50), step=st.sampled_from(["place", "run", "fail"]))
    def observe_phase(self, i: int, step: str) -> None:
        d = self.deployments[i % len(self.deployments)]
        try:
            if step == "place":
                d.mark_placed(cluster())
            elif step == "run":
                d.mark_running(cluster())
            else:
                d.mark_failed(cluster(), "CrashLoopBackOff", "exited")
        except DomainError:
            return  # a transition the deployment refuses
        self.feed(d)

    @precondition(lambda self: self.deployments)
    @rule(i=st.integers(0, 50))
    def start_replica(self, i: int) -> None:
        """A cluster starts replicas only within what was granted."""
        d = self.deployments[i % len(self.deployments)]
        per = d.serving.devices_per_replica
        if d.admission_phase not in HOLDS or self.held(d) + per > d.granted_devices:
            return
        n = len(self.replicas)
        devices = tuple(f"GPU-{n}-{k}" for k in range(per))
        r = Replica.start(
            cluster(),
            deployment_id=d.key,
            name=f"pod-{n}",
            node_id="n1",
            device_ids=devices,
            serving_digest=d.serving_digest,
            engine_version="0.9.2",
        )
        self.replicas.append(r)
        self.feed(r)

    @precondition(lambda self: self.replicas)
    @rule(i=st.integers(0, 50))
    def terminate_replica(self, i: int) -> None:
        r = self.replicas[i % len(self.replicas)]
        r.terminate(cluster())
        self.feed(r)

    # -- what must always hold --------------------------------------------------------------

    @invariant()
    def ledger_matches_a_recount(self) -> None:
        if not hasattr(self, "ledger"):
            return
        for d in self.deployments:
            slot = self.ledger.deployments[d.key]
            assert (slot.phase, slot.granted) == (d.admission_phase.value, d.granted_devices)
            assert slot.held == self.held(d)
        for name in CLUSTERS:
            held = sum(self.held(d) for d in self.deployments if d.cluster_id == name)
            assert self.ledger.held_in_cluster.get((name, "H100"), 0) == held
        for name in PROJECTS:
            held = sum(self.held(d) for d in self.deployments if d.project == name)
            assert self.ledger.held_by_project.get((name, "H100"), 0) == held

    @invariant()
    def nobody_waits_for_room_that_is_there(self) -> None:
        """Liveness: a pending deployment that would fit waits only behind an older one that
        waits for the same cluster's capacity."""
        if not hasattr(self, "ledger"):
            return
        for d in self.deployments:
            would = self.ledger.decide(d.key)
            if d.admission_phase.value != "pending" or would is None or not would.admitted:
                continue
            queue = list(self.ledger.waiting_in[(d.cluster_id, "H100")])
            ahead = [self.ledger.deployments[k] for k in queue[: queue.index(d.key)]]
            assert any(s.reason == "insufficient_capacity" for s in ahead), d.key


AdmissionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestAdmission = AdmissionMachine.TestCase
