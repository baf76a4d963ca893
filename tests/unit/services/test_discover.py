"""Discovery, adoption, heartbeats and late reports, rule by rule (given / when / then)."""

from __future__ import annotations

from typing import Any

import pytest

from wingsmith.domain import commands as c
from wingsmith.domain.base import DomainError
from wingsmith.domain.cluster import Cluster, Node
from wingsmith.domain.deployment import AdmissionPhase, Authority, AuthorityDrift, Deployment
from wingsmith.domain.discovery import Discovery, DiscoveryState
from wingsmith.domain.project import Project
from wingsmith.domain.replica import Replica
from wingsmith.domain.workload import Workload
from wingsmith.services.hub.handlers import (
    observe_deployment,
    observe_discovery,
    observe_heartbeat,
    observe_replica,
    promote_authority,
    promote_discovery,
    track_discovery,
)
from wingsmith.services.hub.liveness import Liveness

from ..domain.conftest import cluster, plane
from .test_observe import Repo, admitted_deployment, east, replica, status, types

ARGS = ["--model", "Qwen/Qwen3-8B", "--tensor-parallel-size", "2"]


def sighting(**changes: Any) -> dict[str, Any]:
    return {
        "namespace": "serving",
        "name": "qwen",
        "api_version": "nvidia.com/v1beta1",
        "backend": "vllm",
        "components": [
            {"name": "Frontend", "role": "frontend", "replicas": 1, "gpus_per_replica": 0},
            {
                "name": "VllmWorker",
                "role": "worker",
                "replicas": 2,
                "gpus_per_replica": 2,
                "imported_args": ARGS,
            },
        ],
        "model": "Qwen/Qwen3-8B",
        "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.1",
        "engine_version": "0.4.1",
        "tensor_parallel": 2,
    } | changes


def observe(body: dict[str, Any] | None, n: int = 0) -> c.ObserveDiscovery:
    return c.ObserveDiscovery.model_validate(
        {
            "command_id": f"obs-{n}",
            "cluster_id": "east",
            "namespace": "serving",
            "name": "qwen",
            "sighting": body,
        }
    )


def fleet() -> Repo:
    east = Cluster.register(plane(), "east", None, {})
    east.report_inventory(plane(), (Node(node_id="n1", device_class="H100", devices=8),))
    project = Project.register(plane(), "research")
    repo = Repo(east, project)
    observe_discovery(repo, observe(sighting()), cluster())
    return repo


def promote(repo: Repo, **changes: Any) -> dict[str, Any]:
    body = {"command_id": "adopt", "discovery_id": "east--serving--qwen", "project": "research"}
    return promote_discovery(repo, c.PromoteDiscovery.model_validate(body | changes), plane())


def test_a_dgd_seen_again_unchanged_records_nothing() -> None:
    repo = fleet()
    discovery = repo.get(Discovery, "east--serving--qwen")
    assert types(discovery) == ["DiscoverySighted"]
    observe_discovery(repo, observe(sighting(), 1), cluster())
    assert types(discovery) == []
    observe_discovery(repo, observe(None, 2), cluster())
    observe_discovery(repo, observe(None, 3), cluster())
    assert types(discovery) == ["DiscoveryVanished"] and not discovery.present


def test_tracking_records_the_decision_and_creates_no_deployment() -> None:
    repo = fleet()
    command = c.TrackDiscovery(command_id="t", discovery_id="east--serving--qwen")
    track_discovery(repo, command, plane())
    assert repo.get(Discovery, "east--serving--qwen").state is DiscoveryState.TRACKED
    assert not [k for (cls, k) in repo.items if cls is Deployment]


def test_promotion_adopts_what_runs_as_an_observed_deployment() -> None:
    repo = fleet()
    promote(repo)
    workload = repo.get(Workload, "qwen")
    deployment = repo.get(Deployment, "qwen--east")
    assert workload.cluster_pin == "east" and workload.replicas == 2
    assert deployment.authority is Authority.OBSERVED
    assert deployment.admission_phase is AdmissionPhase.ADMITTED  # runs already
    assert deployment.imported_args == tuple(ARGS) and deployment.engine_args == ()
    assert deployment.adopted is not None and deployment.adopted.name == "qwen"
    serving = deployment.serving
    assert (serving.devices_per_replica, serving.parallelism.tensor) == (2, 2)
    assert (serving.model, serving.engine_version) == ("Qwen/Qwen3-8B", "0.4.1")
    assert repo.get(Discovery, "east--serving--qwen").state is DiscoveryState.PROMOTED


def test_promotion_is_refused_naming_what_the_manifest_does_not_say() -> None:
    repo = Repo(*fleet().items.values())
    observe_discovery(repo, observe(sighting(model=None), 1), cluster())
    with pytest.raises(DomainError) as refused:
        promote(repo)
    assert refused.value.field == "model"
    assert repo.get(Workload, "qwen") is None


def test_promotion_is_refused_once_the_model_is_gone_or_promoted() -> None:
    repo = fleet()
    promote(repo)
    with pytest.raises(DomainError) as again:
        promote(repo, workload_id="qwen-2")
    assert again.value.field == "discovery_id"
    observe_discovery(repo, observe(None, 1), cluster())
    with pytest.raises(DomainError):
        promote(repo, workload_id="qwen-3")


DECODE_ARGS = ["--model", "Qwen/Qwen3-8B", "--disaggregation-mode", "decode"]


def test_a_decode_only_graph_is_promoted_as_aggregated() -> None:
    """A lone decode worker (no prefill beside it) serves whole requests. Read as
    disaggregated, its 1 device could not be split into prefill and decode halves and the
    promotion was refused."""
    decode_only = sighting(
        components=[
            {"name": "Frontend", "role": "frontend", "replicas": 1, "gpus_per_replica": 0},
            {
                "name": "VllmDecodeWorker",
                "role": "decode",
                "replicas": 2,
                "gpus_per_replica": 1,
                "imported_args": DECODE_ARGS,
            },
        ],
        tensor_parallel=1,
    )
    repo = Repo(*fleet().items.values())
    observe_discovery(repo, observe(decode_only, 1), cluster())
    promote(repo)
    deployment = repo.get(Deployment, "qwen--east")
    assert deployment.authority is Authority.OBSERVED
    assert (deployment.serving.mode, deployment.serving.devices_per_replica) == ("aggregated", 1)
    assert repo.get(Workload, "qwen").replicas == 2
    assert deployment.imported_args == tuple(DECODE_ARGS)


def test_a_resighting_after_promotion_updates_imported_args_and_drift_blocks_promotion() -> None:
    repo = fleet()
    promote(repo)
    changed = sighting()
    changed["components"][1]["imported_args"] = [*ARGS, "--max-num-seqs", "64"]
    observe_discovery(repo, observe(changed, 1), cluster())
    deployment = repo.get(Deployment, "qwen--east")
    assert deployment.imported_args[-2:] == ("--max-num-seqs", "64")
    command = c.PromoteAuthority(command_id="p", deployment_id="qwen--east", authority="managed")
    with pytest.raises(AuthorityDrift):
        promote_authority(repo, command, plane())


def test_a_heartbeat_registers_an_unknown_cluster_and_records_each_operator_start() -> None:
    repo = Repo()
    beat = {"instance": "a", "version": "0.1.0", "read_only": False}
    command = c.ObserveHeartbeat(command_id="h1", cluster_id="west", operator=beat)
    observe_heartbeat(repo, command, cluster())
    observe_heartbeat(repo, command.model_copy(update={"command_id": "h2"}), cluster())
    west = repo.get(Cluster, "west")
    assert types(west) == ["ClusterRegistered", "OperatorConnected"]
    west.set_reachable(plane(), False)
    west.collect_events()
    observe_heartbeat(repo, command.model_copy(update={"command_id": "h3"}), cluster())
    assert types(west) == ["ClusterReachable"]


def test_late_reports_change_nothing() -> None:
    deployment = admitted_deployment()
    repo = Repo(east(), deployment)
    observe_replica(repo, replica("ready", version=5), cluster())
    observe_replica(repo, replica("not_ready", version=7), cluster())
    observe_replica(repo, replica("ready", version=6), cluster())  # older than the last
    assert not repo.get(Replica, "chat--east--chat-0").ready
    observe_replica(repo, replica("not_ready", version=8), cluster())  # the same, newer
    observe_replica(repo, replica("ready", version=7), cluster())  # older than that
    assert not repo.get(Replica, "chat--east--chat-0").ready
    observe_deployment(repo, status("ready", 1).model_copy(update={"version": 5}), cluster())
    again = status("ready", 1).model_copy(update={"command_id": "again", "version": 9})
    observe_deployment(repo, again, cluster())  # the same, newer: recorded so nothing undoes it
    late = status("failed", 0).model_copy(update={"version": 7})
    observe_deployment(repo, late, cluster())
    assert deployment.admission_phase is AdmissionPhase.RUNNING
    assert deployment.status is not None and deployment.status.ready_replicas == 1


async def test_liveness_marks_only_silent_reachable_clusters() -> None:
    now = [0.0]
    reachable = {"east": True, "west": True, "north": False}
    sent: list[c.Command] = []

    async def execute(command: c.Command) -> dict[str, Any]:
        sent.append(command)
        return {"ok": True}

    liveness = Liveness(execute, lambda: reachable, silence=10, clock=lambda: now[0])
    assert liveness.silent() == []  # the first look: known from now on
    now[0] = 5
    liveness.heard("east")
    now[0] = 12  # west silent since the start, east heard 7 s ago, north already unreachable
    assert liveness.silent() == ["west"]
    reachable["south"] = True  # registered with an inventory; no operator has spoken for it
    now[0] = 16
    assert liveness.silent() == ["east", "west"]  # south is counted from when it was known
    now[0] = 27
    assert liveness.silent() == ["east", "west", "south"]


def test_replaying_every_observation_changes_nothing() -> None:
    deployment = admitted_deployment()
    repo = fleet()
    repo.add(deployment)
    reports = [
        (observe_replica, replica("started", version=1)),
        (observe_replica, replica("ready", version=2)),
        (observe_deployment, status("ready", 1).model_copy(update={"version": 3})),
        (observe_discovery, observe(sighting(), 9)),
        (observe_replica, replica("terminated", version=4)),
    ]
    for handler, report in reports:
        handler(repo, report, cluster())  # type: ignore[operator]
    for aggregate in list(repo.items.values()):
        aggregate.collect_events()
    for handler, report in reports:  # the same reports again, e.g. redelivered after a restart
        handler(repo, report, cluster())  # type: ignore[operator]
    assert [e for a in repo.items.values() for e in a.collect_events()] == []
