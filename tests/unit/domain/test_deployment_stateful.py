"""Random command sequences on a Deployment keep every invariant, and the events stored in a
real SQLite event store replay into an equal aggregate. Once deleted, it records only what its
cluster reports."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain.base import DomainError, Event
from wingsmith.domain.deployment import (
    AdmissionDecided,
    AdmissionReason,
    Authority,
    ClusterPhase,
    Deployment,
    DeploymentDeleted,
    DeploymentStatus,
    ImportedArgsObserved,
    LiveDigestsObserved,
    ServingConfigChanged,
    StatusObserved,
)

from .conftest import cluster, plane, serving

SERVINGS = [serving(), serving(engine_version="0.10.0"), serving(context_length=8192)]
ARGS = st.lists(st.sampled_from(["--enforce-eager", "--max-model-len", "8192"]), max_size=3)
DIGESTS = st.dictionaries(st.sampled_from([s.digest() for s in SERVINGS]), st.integers(0, 4))


class DeploymentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.store = EventStore(store_env(None, Path(self.tmp.name)))
        self.history: list[Event] = []

    def teardown(self) -> None:
        self.store.close()
        self.tmp.cleanup()

    @initialize(observed=st.booleans(), imported=ARGS)
    def create(self, observed: bool, imported: list[str]) -> None:
        self.d = Deployment.create(
            plane(),
            workload_id="w",
            cluster_id="c",
            project="p",
            device_class="H100",
            serving=SERVINGS[0],
            desired_replicas=2,
            authority=Authority.OBSERVED if observed else Authority.MANAGED,
            imported_args=tuple(imported) if observed else None,
        )
        self._save()
        self.model: dict[str, Any] = {
            "desired_replicas": 2,
            "enabled": True,
            "engine_args": (),
            "imported_args": tuple(imported) if observed else None,
            "serving_digest": SERVINGS[0].digest(),
            "authority": Authority.OBSERVED if observed else Authority.MANAGED,
            "deleted": False,
        }

    def _attempt(self, method: str, *args: Any, **kwargs: Any) -> bool:
        before = self.d.as_dict()
        try:
            getattr(self.d, method)(*args, **kwargs)
        except DomainError:
            assert self.d.pending == [], "a refused command records nothing"
            assert self.d.as_dict() == before, "a refused command changes nothing"
            return False
        finally:
            self._save()
        return True

    def _save(self) -> None:
        events = self.d.collect_events()
        self.store.save(events)
        self.history += events

    @rule(n=st.integers(-1, 6))
    def scale(self, n: int) -> None:
        if self._attempt("scale", plane(), n):
            self.model["desired_replicas"] = n

    @rule(on=st.booleans())
    def toggle(self, on: bool) -> None:
        if self._attempt("enable" if on else "disable", plane()):
            self.model["enabled"] = on

    @rule(args=ARGS)
    def set_engine_args(self, args: list[str]) -> None:
        if self._attempt("set_engine_args", plane(), tuple(args)):
            self.model["engine_args"] = tuple(args)

    @rule(i=st.integers(0, len(SERVINGS) - 1))
    def change_serving(self, i: int) -> None:
        if self._attempt("change_serving_config", plane(), SERVINGS[i]):
            self.model["serving_digest"] = SERVINGS[i].digest()

    @rule(force=st.booleans())
    def promote(self, force: bool) -> None:
        m = self.model
        drift = m["imported_args"] is not None and m["imported_args"] != m["engine_args"]
        expected = not m["deleted"] and (m["authority"] is Authority.MANAGED or force or not drift)
        assert self._attempt("promote_authority", plane(), force=force) == expected
        m["authority"] = Authority.MANAGED if expected else m["authority"]

    @rule(admitted=st.booleans(), reason=st.sampled_from([None, *AdmissionReason]))
    def decide(self, admitted: bool, reason: AdmissionReason | None) -> None:
        self._attempt("decide_admission", plane(), admitted=admitted, reason=reason, evidence={})

    @rule(mark=st.sampled_from(["mark_placed", "mark_running"]))
    def cluster_phase(self, mark: str) -> None:
        self._attempt(mark, cluster())

    @rule()
    def fail(self) -> None:
        self._attempt("mark_failed", cluster(), "CrashLoopBackOff", "engine exited")

    @rule(phase=st.sampled_from(ClusterPhase), ready=st.integers(0, 4))
    def observe_status(self, phase: ClusterPhase, ready: int) -> None:
        status = DeploymentStatus(phase=phase, ready_replicas=ready, desired_replicas=2)
        self._attempt("observe_status", cluster(), status)

    @rule(digests=DIGESTS)
    def observe_digests(self, digests: dict[str, int]) -> None:
        self._attempt("observe_live_digests", cluster(), digests)

    @rule(args=ARGS)
    def observe_imported(self, args: list[str]) -> None:
        if self._attempt("observe_imported_args", cluster(), tuple(args)):
            self.model["imported_args"] = tuple(args)

    @rule()
    def delete(self) -> None:
        assert self._attempt("delete", plane()) != self.model["deleted"]
        self.model["deleted"] = True

    @rule(wrong=st.sampled_from(["scale", "observe_status"]))
    def wrong_writer(self, wrong: str) -> None:
        if wrong == "scale":
            assert not self._attempt("scale", cluster(), 3)
        else:
            status = DeploymentStatus(
                phase=ClusterPhase.READY, ready_replicas=1, desired_replicas=1
            )
            assert not self._attempt("observe_status", plane(), status)

    def _of(self, *types: type[Event]) -> list[Event]:
        return [e for e in self.history if isinstance(e, types)]

    @invariant()
    def declared_and_observed_fields_match_the_model(self) -> None:
        assert {k: getattr(self.d, k) for k in self.model} == self.model

    @invariant()
    def generation_counts_serving_changes(self) -> None:
        changes = self._of(ServingConfigChanged)
        assert self.d.generation == 1 + len(changes)
        digests = [SERVINGS[0].digest()] + [e.serving_digest for e in changes]  # type: ignore[attr-defined]
        assert all(a != b for a, b in itertools.pairwise(digests))

    @invariant()
    def phases_follow_the_transition_table(self) -> None:
        managed = self.history[0].authority is Authority.MANAGED  # type: ignore[attr-defined]
        first = "pending" if managed else "admitted"  # observed from birth: it runs already
        phases = [first] + [
            e.phase if isinstance(e, AdmissionDecided) else _phase_of(e)
            for e in self.history
            if _phase_of(e) or isinstance(e, AdmissionDecided)
        ]
        for a, b in itertools.pairwise(phases):
            assert (a, b) in LEGAL, f"{a} -> {b}"

    @invariant()
    def authority_only_moves_to_managed(self) -> None:
        if self.d.authority is Authority.OBSERVED:
            assert not any(type(e).__name__ == "AuthorityPromoted" for e in self.history)

    @invariant()
    def observed_fields_have_their_own_writers(self) -> None:
        assert (self.d.status is None) == (not self._of(StatusObserved))
        managed_from_birth = self.history[0].authority is Authority.MANAGED  # type: ignore[attr-defined]
        if managed_from_birth and not self._of(ImportedArgsObserved):
            assert self.d.imported_args is None

    @invariant()
    def once_deleted_only_the_cluster_writes_and_nothing_is_granted(self) -> None:
        deleted = self._of(DeploymentDeleted)
        if deleted:
            since = self.history[self.history.index(deleted[0]) + 1 :]
            reports = (StatusObserved, LiveDigestsObserved, ImportedArgsObserved)
            assert all(isinstance(e, reports) for e in since), since
            assert self.d.granted_devices == 0

    @invariant()
    def replaying_the_store_rebuilds_the_aggregate(self) -> None:
        assert self.store.load(self.d.id) == self.d


# The concept document's admission flow, written out independently of the domain's table.
LEGAL = {
    ("pending", "admitted"),
    ("admitted", "placed"),
    ("placed", "running"),
    ("running", "placed"),
    ("pending", "pending"),
}
LEGAL |= {(a, "pending") for a in ("admitted", "placed", "running", "failed")}
LEGAL |= {(a, "failed") for a in ("pending", "admitted", "placed", "running")}


def _phase_of(event: Event) -> str | None:
    return {
        "DeploymentPlaced": "placed",
        "DeploymentRunning": "running",
        "DeploymentFailed": "failed",
    }.get(type(event).__name__)


TestDeploymentMachine = DeploymentMachine.TestCase
TestDeploymentMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
