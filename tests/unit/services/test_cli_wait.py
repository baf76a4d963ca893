"""`--wait`: a workload is ready when every share is ready on its current serving digest, the
reason shows while it is not, and the wait gives up at a new failure or at its timeout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from wingsmith.services.cli.waiting import (
    Readiness,
    Target,
    WaitGaveUp,
    follow,
    readiness,
)

NEW, OLD = "digest-new", "digest-old"


def pods(digest: str, ready: int, not_ready: int = 0) -> list[dict[str, Any]]:
    states = [True] * ready + [False] * not_ready
    return [{"ready": r, "serving_digest": digest} for r in states]


def deployment(cluster: str = "east", **fields: Any) -> Any:
    """A deployment with its share of 3 replicas all ready on NEW, unless `fields` say else."""
    document: dict[str, Any] = {
        "deployment_id": f"chat--{cluster}",
        "cluster_id": cluster,
        "desired_replicas": 3,
        "ready_replicas": 3,
        "live_digests": {NEW: 3},
        "replicas": pods(NEW, 3),
        "serving_digest": NEW,
        "enabled": True,
        "authority": "managed",
        "stale": False,
        "status": {"phase": "ready", "ready_replicas": 3, "desired_replicas": 3},
        "waiting_replicas": 0,
        "admission": {"phase": "running", "reason": None, "since": "t1"},
    }
    return document | fields


def workload(
    *deployments: Any, replicas: int = 3, unplaced: str | None = None, phase: str = "running"
) -> Any:
    shares = [{"deployment_id": d["deployment_id"]} for d in deployments]
    return {
        "workload_id": "chat",
        "replicas": replicas,
        "serving_digest": NEW,
        "deployments": shares,
        "unplaced": unplaced,
        "phase": phase,
    }


def judged(*deployments: Any, replicas: int = 3, **given: Any) -> Readiness:
    return readiness(workload(*deployments, replicas=replicas, **given), deployments)


def test_every_share_ready_on_the_current_digest_is_done() -> None:
    state = judged(deployment())
    assert (state.ready, state.wanted, state.done, state.reasons) == (3, 3, True, ())


def test_ready_replicas_wait_for_the_workload_phase_to_say_so() -> None:
    state = judged(deployment(), phase="placed")
    assert (state.ready, state.done, state.reasons) == (
        3,
        False,
        ("phase placed, not running yet",),
    )


def test_pods_that_exist_are_not_ready_replicas() -> None:
    # given a scale to 10: ten replicas exist, one of them ready
    scaled = deployment(
        desired_replicas=10, ready_replicas=1, live_digests={NEW: 10}, replicas=pods(NEW, 1, 9)
    )
    state = judged(scaled, replicas=10)
    assert (state.ready, state.done) == (1, False)
    assert state.reasons == ("east: 1/10 ready",)


def test_replicas_ready_on_an_older_digest_do_not_count() -> None:
    # given a rollout: the old replicas serve, the new ones are not ready yet
    rolling = deployment(
        ready_replicas=3,
        live_digests={OLD: 3, NEW: 3},
        replicas=pods(OLD, 3) + pods(NEW, 0, 3),
    )
    state = judged(rolling)
    assert (state.ready, state.done) == (0, False)
    assert state.reasons == ("east: 0/3 ready, 3 replicas on an older serving config",)


def test_a_status_behind_the_pods_counts_no_replica_high() -> None:
    # given old replicas gone and new ones started while the status still says 3 ready
    behind = deployment(live_digests={NEW: 3}, replicas=pods(NEW, 0, 3))
    assert judged(behind).ready == 0


def test_the_rest_of_a_partial_grant_shows_its_reason_and_numbers() -> None:
    evidence = {"wanted": 6, "quota": 4, "held_by_project": 0, "granted": 4, "waiting": 2}
    admission = {"phase": "running", "reason": "insufficient_quota", "since": "t2"}
    partial = deployment(
        desired_replicas=6,
        ready_replicas=4,
        live_digests={NEW: 4},
        replicas=pods(NEW, 4),
        waiting_replicas=2,
        admission=admission | {"evidence": evidence},
    )
    state = judged(partial, replicas=6)
    assert (state.ready, state.wanted, state.done, state.failure) == (4, 6, False, None)
    assert state.reasons == (
        "east: 4/6 ready, 2 replicas wait: insufficient_quota "
        "(quota 4, others hold 0, wanted 6, granted 4 devices)",
    )


def test_capacity_short_says_what_the_cluster_and_its_nodes_have() -> None:
    evidence = {"wanted": 8, "capacity": 8, "held_in_cluster": 6, "largest_node_free": 2}
    evidence |= {"granted": 2, "waiting": 6, "queue_position": 2}
    admission = {"phase": "admitted", "reason": "insufficient_capacity", "since": "t"}
    short = deployment(
        desired_replicas=4,
        ready_replicas=0,
        live_digests={},
        replicas=[],
        waiting_replicas=3,
        admission=admission | {"evidence": evidence},
    )
    assert judged(short, replicas=4).reasons == (
        "east: 0/4 ready, 3 replicas wait: insufficient_capacity (cluster 8, others hold 6, "
        "largest node free 2, wanted 8, granted 2 devices, queue position 2)",
    )


def test_trouble_the_cluster_shows_is_the_reason() -> None:
    pulling = deployment(
        ready_replicas=1,
        replicas=pods(NEW, 1, 2),
        status={
            "phase": "progressing",
            "ready_replicas": 1,
            "desired_replicas": 3,
            "conditions": [
                {"reason": "ImagePullBackOff", "message": "x", "permanent": False, "pods": 2}
            ],
        },
    )
    assert judged(pulling).reasons == ("east: 1/3 ready, ImagePullBackOff (2 pods)",)


def test_a_failure_while_waiting_ends_the_wait() -> None:
    admission = {"phase": "failed", "reason": "Unrenderable", "since": "t3", "message": "no"}
    failed = deployment(ready_replicas=0, replicas=[], live_digests={}, admission=admission)
    state = readiness(workload(failed), [failed])
    assert state.failure == "east: failed: Unrenderable: no"
    assert not state.done


def test_a_failure_from_before_the_wait_is_a_reason_not_the_end() -> None:
    # given a deployment that had failed before the command that might clear it
    admission = {"phase": "failed", "reason": "Unrenderable", "since": "t3"}
    failed = deployment(ready_replicas=0, replicas=[], live_digests={}, admission=admission)
    state = readiness(workload(failed), [failed], {("chat--east", "t3")})
    assert (state.failure, state.done) == (None, False)
    assert state.reasons == ("east: failed: Unrenderable",)


def test_a_count_placement_has_not_divided_yet_is_not_ready() -> None:
    # given a scale of an unpinned workload from 3 to 5, before placement shares the 2 more
    state = judged(deployment(), replicas=5, unplaced="no cluster has room")
    assert (state.ready, state.wanted, state.done) == (3, 5, False)
    assert state.reasons == ("2 replicas not placed: no cluster has room",)


def test_a_share_of_zero_holds_nothing_back() -> None:
    empty = deployment("west", desired_replicas=0, ready_replicas=0, live_digests={}, replicas=[])
    state = readiness(workload(deployment(), empty), [deployment(), empty])
    assert state.done


def test_a_scale_down_is_done_once_the_replicas_beyond_it_stopped() -> None:
    shrinking = deployment(desired_replicas=1)
    state = judged(shrinking, replicas=1)
    assert (state.ready, state.done) == (1, False)
    assert state.reasons == ("east: 3/1 ready, 2 replicas beyond its share to stop",)


def test_an_unreachable_clusters_last_report_is_not_taken_as_ready() -> None:
    state = judged(deployment(stale=True))
    assert not state.done
    assert "unreachable" in state.reasons[0]


def test_a_disabled_or_observed_deployment_says_why_it_will_not_grow() -> None:
    admission = {"phase": "pending", "reason": "disabled", "since": "t"}
    disabled = deployment(enabled=False, ready_replicas=0, replicas=[], live_digests={})
    assert judged(disabled | {"admission": admission}).reasons == ("east: 0/3 ready, disabled",)
    observed = deployment(authority="observed", desired_replicas=4)
    assert judged(observed, replicas=4).reasons == (
        "east: 3/4 ready, observed: the operator changes nothing of it until it is promoted",
    )


def test_a_deployment_of_another_workload_is_not_counted() -> None:
    stranger = deployment("west") | {"deployment_id": "other--west"}
    assert readiness(workload(deployment()), [deployment(), stranger]).done


# follow: the loop over reads


TARGET = Target("chat", 3, NEW, shown=True)


def reads(*answers: tuple[Any, list[Any]]) -> Any:
    """A `look` that answers these in turn, then the last one again."""
    queue: Iterator[tuple[Any, list[Any]]] = iter(answers)
    last = answers[-1]

    async def look() -> tuple[Any, list[Any]]:
        nonlocal last
        last = next(queue, last)
        return last

    return look


async def test_follow_returns_the_workload_once_it_is_ready() -> None:
    starting = deployment(ready_replicas=0, replicas=pods(NEW, 0, 3))
    shown: list[Readiness] = []
    ready = workload(deployment())
    look = reads((workload(starting), [starting]), (ready, [deployment()]))
    assert await follow(look, TARGET, 60, shown.append, every=0) == ready
    assert [s.ready for s in shown] == [0, 3]


async def test_follow_waits_for_the_views_to_show_an_accepted_change() -> None:
    # given a 202 for a scale from 1 to 3: the views still show 1 replica, all ready
    before = deployment(desired_replicas=1, ready_replicas=1, live_digests={NEW: 1})
    before["replicas"] = pods(NEW, 1)
    look = reads((workload(before, replicas=1), [before]), (workload(deployment()), [deployment()]))
    shown: list[Readiness] = []
    await follow(look, Target("chat", 3, NEW, shown=False), 60, shown.append, every=0)
    assert [s.done for s in shown] == [False, True]
    assert shown[0].reasons == ("the views do not show the change yet",)


async def test_follow_gives_up_at_the_timeout_saying_why() -> None:
    evidence = {"wanted": 6, "quota": 4, "granted": 4, "waiting": 2}
    admission = {"phase": "running", "reason": "insufficient_quota", "since": "t"}
    partial = deployment(
        desired_replicas=6, waiting_replicas=2, admission=admission | {"evidence": evidence}
    )
    look = reads((workload(partial, replicas=6), [partial]))
    with pytest.raises(WaitGaveUp) as gave_up:
        await follow(look, Target("chat", 6, NEW, shown=True), 0, lambda _: None, every=0)
    assert str(gave_up.value) == (
        "workload chat not ready after 0s: 3/6 replicas ready on its current serving config; "
        "east: 3/6 ready, 2 replicas wait: insufficient_quota (quota 4, wanted 6, granted 4 "
        "devices)"
    )


async def test_follow_gives_up_at_a_failure_that_came_while_waiting() -> None:
    admission = {"phase": "failed", "reason": "Invalid", "since": "t9", "message": "refused"}
    failed = deployment(ready_replicas=0, replicas=[], live_digests={}, admission=admission)
    look = reads(
        (workload(deployment(ready_replicas=0)), [deployment(ready_replicas=0)]),
        (workload(failed), [failed]),
    )
    with pytest.raises(WaitGaveUp, match="workload chat failed: east: failed: Invalid: refused"):
        await follow(look, TARGET, 60, lambda _: None, every=0)


async def test_follow_gives_up_when_the_workload_is_deleted() -> None:
    waiting = deployment(ready_replicas=0)
    look = reads((workload(waiting), [waiting]), (None, []))
    with pytest.raises(WaitGaveUp, match="deleted while waiting"):
        await follow(look, TARGET, 60, lambda _: None, every=0)
