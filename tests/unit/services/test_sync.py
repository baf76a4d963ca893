"""A sync, handled (given / when / then): the hub sets right the replicas it holds from a full
report of a deployment, records nothing when the report agrees, and a sync and the deltas
around it do not undo each other's newer news. Also what a sync report is refused for."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from wingsmith.domain import commands as c
from wingsmith.domain.replica import SYNC_MAX_REPLICAS, Replica, Roster
from wingsmith.services.hub.handlers import observe_replica, observe_sync
from wingsmith.services.hub.ingest import Refused, parse

from ..domain.conftest import cluster, plane
from .test_observe import Repo, admitted_deployment, east, replica, types


def pod(name: str, state: str = "ready", device: str = "GPU-0", **changes: Any) -> dict[str, Any]:
    return {
        "pod": name,
        "node_id": "n1",
        "device_ids": [device],
        "serving_digest": "svg_1",
        "engine_version": "0.9.2",
        "state": state,
    } | changes


def sync(*pods: dict[str, Any], version: int = 0, **changes: Any) -> c.ObserveSync:
    body = {
        "command_id": f"obs-sync-{version}",
        "cluster_id": "east",
        "deployment_id": "chat--east",
        "replicas": list(pods),
        "version": version,
    }
    return c.ObserveSync.model_validate(body | changes)


def given_replicas(*states: tuple[str, str, int]) -> tuple[Repo, Any]:
    """A running deployment whose replicas (pod, state, version) the plane learnt by deltas."""
    d = admitted_deployment()
    repo = Repo(east(), d)
    for i, (name, state, version) in enumerate(states):
        observe_replica(
            repo, replica(state, pod=name, device_ids=[f"GPU-{i}"], version=version), cluster()
        )
    for aggregate in repo.items.values():
        aggregate.collect_events()
    return repo, d


def live(repo: Repo) -> set[str]:
    roster = repo.get(Roster, "chat--east")
    return set(roster.names) if roster else set()


def test_replicas_the_cluster_never_kept_are_terminated_and_missed_ones_recorded() -> None:
    repo, _ = given_replicas(("chat-0", "ready", 3), ("chat-1", "started", 4))
    observe_sync(
        repo, sync(pod("chat-0", device="GPU-0"), pod("chat-2", device="GPU-2")), cluster()
    )
    assert live(repo) == {"chat-0", "chat-2"}
    assert types(repo.get(Replica, "chat--east--chat-1")) == ["ReplicaTerminated"]
    assert types(repo.get(Replica, "chat--east--chat-2")) == ["ReplicaStarted", "ReplicaReady"]
    assert repo.get(Replica, "chat--east--chat-2").device_ids == ("GPU-2",)
    assert types(repo.get(Roster, "chat--east")) == ["RosterLeft", "RosterJoined"]


def test_a_missed_pod_on_a_node_the_cluster_never_reported_is_left_out_and_the_rest_holds() -> None:
    """As a replica report for it would be refused; one such pod (a node not reported yet, or
    not labelled with its GPUs) must not keep the deployment's other replicas from healing."""
    repo, _ = given_replicas(("chat-0", "ready", 3), ("chat-1", "ready", 4))
    result = observe_sync(
        repo, sync(pod("chat-0"), pod("chat-9", node_id="n9", device="X")), cluster()
    )
    assert live(repo) == {"chat-0"}  # chat-1 is gone from the cluster: terminated all the same
    assert repo.get(Replica, "chat--east--chat-9") is None
    assert result["recorded"] == [] and "node 'n9'" in result["skipped"]["chat-9"]


def test_a_sync_that_agrees_records_nothing() -> None:
    repo, _ = given_replicas(("chat-0", "ready", 3), ("chat-1", "started", 4))
    first = sync(
        pod("chat-0", device="GPU-0"),
        pod("chat-1", "not_ready", device="GPU-1"),
        version=9,
        status={"phase": "progressing", "ready_replicas": 1, "desired_replicas": 2},
    )
    observe_sync(repo, first, cluster())
    for aggregate in repo.items.values():
        aggregate.collect_events()
    again = first.model_copy(update={"version": 15})
    observe_sync(repo, again, cluster())
    assert [types(a) for a in repo.items.values()] == [[] for _ in repo.items]


def test_a_sync_does_not_terminate_a_replica_reported_after_it_was_taken() -> None:
    repo, _ = given_replicas(("chat-0", "ready", 3), ("chat-1", "started", 12))
    observe_sync(repo, sync(pod("chat-0", device="GPU-0"), version=9), cluster())
    assert live(repo) == {"chat-0", "chat-1"}


def test_a_delta_older_than_the_sync_does_not_undo_it() -> None:
    repo, _ = given_replicas(("chat-0", "started", 3))
    observe_sync(repo, sync(pod("chat-0", device="GPU-0"), version=9), cluster())
    observe_replica(repo, replica("not_ready", pod="chat-0", version=7), cluster())
    assert repo.get(Replica, "chat--east--chat-0").ready
    observe_sync(repo, sync(version=11), cluster())  # gone: terminated
    observe_replica(repo, replica("ready", pod="chat-0", version=8), cluster())
    assert repo.get(Replica, "chat--east--chat-0").terminated
    assert live(repo) == set()


def test_the_status_and_live_digests_follow_the_sync() -> None:
    repo, d = given_replicas(("chat-0", "ready", 3))
    status = {"phase": "failed", "reason": "Boom", "ready_replicas": 0, "desired_replicas": 2}
    observe_sync(repo, sync(pod("chat-0"), version=9, status=status), cluster())
    assert d.status is not None and d.status.reason == "Boom"
    assert d.admission_phase.value == "failed"
    assert d.live_digests == {"svg_1": 1}


def test_a_deleted_deployment_s_phantom_replicas_are_terminated() -> None:
    repo, d = given_replicas(("chat-0", "ready", 3))
    d.delete(plane())
    observe_sync(repo, sync(version=9), cluster())
    assert repo.get(Replica, "chat--east--chat-0").terminated


def body(**changes: Any) -> bytes:
    base = {
        "cluster_id": "east",
        "deployment_id": "chat--east",
        "replicas": [pod("chat-0")],
        "version": 1,
    }
    return orjson.dumps(base | changes)


def test_a_sync_report_parses() -> None:
    command = parse("wingsmith.obs.east.sync", body(), "east:sync:1")
    assert isinstance(command, c.ObserveSync) and command.replicas[0].pod == "chat-0"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"replicas": [pod("chat 0")]}, "replicas.0.pod"),
        ({"replicas": [pod("Chat-0")]}, "replicas.0.pod"),
        ({"replicas": [pod("chat-0", node_id="n\t1")]}, "replicas.0.node_id"),
        ({"replicas": [pod("chat-0", device_ids=["GPU 0"])]}, "replicas.0.device_ids.0"),
        ({"replicas": [pod("chat-0", device_ids=[f"G{i}" for i in range(257)])]}, "device_ids"),
        ({"replicas": [pod("chat-0", device_ids=["G", "G"])]}, "replicas.0.device_ids"),
        ({"replicas": [pod("chat-0", state="terminated")]}, "replicas.0.state"),
        ({"replicas": [pod("a"), pod("a", device="GPU-1")]}, "replicas"),
        ({"replicas": [pod("a"), pod("b")]}, "replicas"),  # one device in two replicas
        ({"version": "1"}, "version"),
        ({"version": -1}, "version"),
        ({"status": {"phase": "ready", "ready_replicas": "1", "desired_replicas": 1}}, "status"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_sync_report_is_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(Refused, match=field.replace(".", r"\.")):
        parse("wingsmith.obs.east.sync", body(**changes), "east:sync:1")


def test_too_many_replicas_are_refused() -> None:
    many = [pod(f"p{i}", device=f"GPU-{i}") for i in range(SYNC_MAX_REPLICAS + 1)]
    with pytest.raises(Refused, match="replicas"):
        parse("wingsmith.obs.east.sync", body(replicas=many), "east:sync:1")


def test_a_replica_recorded_before_rosters_were_kept_joins_one_when_a_sync_names_it() -> None:
    repo, _ = given_replicas(("chat-0", "ready", 3))
    del repo.items[(Roster, "chat--east")]  # as a store written before rosters
    observe_sync(repo, sync(pod("chat-0"), version=9), cluster())
    assert live(repo) == {"chat-0"}
    observe_sync(repo, sync(version=10), cluster())
    assert repo.get(Replica, "chat--east--chat-0").terminated
