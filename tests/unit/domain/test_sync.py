"""The reconcile decision of a sync (pure): a full report of a deployment's pods against the
replicas the plane holds, with the cluster's ordering deciding who is newer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wingsmith.domain.replica import Known, SyncPlan, reconcile


def known(ready: bool = False, version: int = 5, terminated: bool = False) -> Known:
    return Known(ready=ready, terminated=terminated, version=version)


def test_a_sync_that_agrees_changes_nothing() -> None:
    plan = reconcile({"a": known(True), "b": known(False)}, {"a": True, "b": False}, 9)
    assert plan == SyncPlan()
    assert not plan


def test_replicas_the_cluster_no_longer_has_are_terminated_and_missed_ones_recorded() -> None:
    plan = reconcile({"gone": known(), "kept": known()}, {"kept": False, "new": True}, 9)
    assert (plan.terminate, plan.record) == (("gone",), ("new",))


def test_readiness_follows_the_sync() -> None:
    plan = reconcile({"a": known(True), "b": known(False)}, {"a": False, "b": True}, 9)
    assert (plan.ready, plan.not_ready) == (("b",), ("a",))


def test_a_sync_never_undoes_newer_news() -> None:
    """A replica reported after the sync was taken: not terminated for being absent, not
    changed for being different."""
    plan = reconcile({"late": known(True, 12), "other": known(True, 12)}, {"other": False}, 9)
    assert plan == SyncPlan()


def test_a_replica_reported_at_the_sync_s_own_version_is_in_it() -> None:
    assert reconcile({"a": known(version=9)}, {}, 9).terminate == ("a",)


def test_a_terminated_replica_stays_terminated() -> None:
    plan = reconcile({"a": known(terminated=True, version=1)}, {"a": True}, 9)
    assert plan == SyncPlan()


def test_an_unordered_sync_is_taken_as_it_is() -> None:
    """A cluster without an ordering (version 0 everywhere) is believed."""
    plan = reconcile({"a": known(True, 0), "b": known(True, 7)}, {"b": False}, 0)
    assert (plan.terminate, plan.not_ready) == (("a",), ("b",))


names = st.sampled_from([f"p{i}" for i in range(6)])


@given(
    st.dictionaries(names, st.builds(Known, st.booleans(), st.booleans(), st.integers(0, 20))),
    st.dictionaries(names, st.booleans()),
    st.integers(0, 20),
)
def test_after_a_sync_the_plane_holds_what_the_cluster_has(
    plane: dict[str, Known], cluster: dict[str, bool], version: int
) -> None:
    """Applying the plan leaves every replica that is not newer than the sync as the cluster
    says (terminated ones aside), and touches no newer one."""
    plan = reconcile(plane, cluster, version)
    after = dict(plane)
    for name in plan.terminate:
        after[name] = Known(False, True, after[name].version)
    for name in plan.record:
        after[name] = Known(cluster[name], False, version)
    for name in plan.ready + plan.not_ready:
        after[name] = Known(name in plan.ready, False, version)
    for name, k in after.items():
        newer = 0 < version < k.version
        if name in plane and (newer or plane[name].terminated):
            assert k == plane[name]
        elif name in cluster:
            assert (k.ready, k.terminated) == (cluster[name], False)
        else:
            assert k.terminated
    assert reconcile(after, cluster, version).record == ()
