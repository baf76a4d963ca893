"""The simulated cluster runs pods the way Dynamo makes them (a pod per worker, a prefill and a
decode worker per disaggregated replica, a worker spread over its nodes), counts whole replicas,
starts what waited for devices as soon as they free up, and records every write it made or held
back. Driven through its backend methods and its fault requests, reports collected as sent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson

from wingsmith.domain.contracts.reports import (
    ActionReport,
    DeploymentReport,
    InventoryReport,
    ReplicaReport,
    ReplicaState,
)
from wingsmith.domain.contracts.reports import Report as AnyReport
from wingsmith.domain.deployment import DeploymentStatus
from wingsmith.services.operator.backends.simulated import SimNode, SimulatedCluster
from wingsmith.services.tasks import cancel_and_wait

READY_AFTER = 0.02


def render(
    workload_id: str = "chat",
    *,
    replicas: int = 1,
    devices: int = 1,
    mode: str = "aggregated",
    nodes_per_worker: int = 1,
    digest: str = "svg_0000000000000001",
    enabled: bool = True,
    authority: str = "managed",
) -> dict[str, Any]:
    """A render object for `<workload>--east`, as the hub publishes one."""
    serving = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "backend": "vllm",
        "engine_version": "0.9.2",
        "mode": mode,
        "devices_per_replica": devices,
    }
    return {
        "deployment_id": f"{workload_id}--east",
        "workload_id": workload_id,
        "cluster_id": "east",
        "project": "p",
        "device_class": "H100",
        "generation": 1,
        "serving": serving,
        "serving_digest": digest,
        "engine_args": [],
        "replicas": replicas,
        "enabled": enabled,
        "authority": authority,
        "adopted": None,
        "nodes_per_worker": nodes_per_worker,
    }


class Running:
    """A simulated cluster observed, with every report it sent."""

    def __init__(self, cluster: SimulatedCluster) -> None:
        self.cluster, self.reports = cluster, list[AnyReport]()

    async def collect(self, report: AnyReport) -> None:
        self.reports.append(report)

    def statuses(self, deployment_id: str) -> list[DeploymentStatus]:
        return [
            r.status
            for r in self.reports
            if isinstance(r, DeploymentReport)
            and r.deployment_id == deployment_id
            and r.status is not None
        ]

    def actions(self) -> list[tuple[str, str, bool, str]]:
        return [
            (r.verb, r.deployment_id, r.performed, r.reason)
            for r in self.reports
            if isinstance(r, ActionReport)
        ]

    async def until(self, what: str, check: Callable[[], bool]) -> None:
        for _ in range(500):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    async def until_ready(self, deployment_id: str, replicas: int) -> None:
        def ready() -> bool:
            statuses = self.statuses(deployment_id)
            return bool(statuses) and statuses[-1].ready_replicas == replicas

        await self.until(f"{deployment_id}: {replicas} ready", ready)

    async def fault(self, **request: Any) -> dict[str, Any]:
        return await self.cluster._fault(orjson.dumps(request))


@contextlib.asynccontextmanager
async def running(nodes: list[SimNode], **options: Any) -> AsyncIterator[Running]:
    cluster = SimulatedCluster("east", nodes, ready_after=READY_AFTER, **options)
    run = Running(cluster)
    observing = asyncio.create_task(cluster.observe(run.collect))
    await asyncio.sleep(0)  # reports start with `observe`
    try:
        yield run
    finally:
        await cancel_and_wait(observing)
        await asyncio.gather(*cluster._later, return_exceptions=True)


def nodes(count: int, devices: int) -> list[SimNode]:
    return [SimNode(f"east-n{i + 1}", "H100", devices) for i in range(count)]


async def test_a_multinode_worker_is_one_pod_per_node_and_one_replica() -> None:
    async with running(nodes(3, 4)) as run:
        await run.cluster.apply("chat--east", render(devices=8, nodes_per_worker=2))
        await run.until_ready("chat--east", 1)
        pods = list(run.cluster.pods["chat--east"].values())
        assert len(pods) == 2 and all(len(p.device_ids) == 4 for p in pods)
        assert len({p.node.node_id for p in pods}) == 2  # distinct nodes
        assert run.statuses("chat--east")[-1].desired_replicas == 1

        # a lost node takes the whole worker with it; it starts again on the nodes left
        lost = pods[0].node.node_id
        assert (await run.fault(fault="node_loss", node=lost))["ok"]
        terminated = [
            r.pod
            for r in run.reports
            if isinstance(r, ReplicaReport) and r.state is ReplicaState.TERMINATED
        ]
        assert sorted(terminated) == sorted(p.name for p in pods)
        await run.until_ready("chat--east", 1)
        again = run.cluster.pods["chat--east"].values()
        assert lost not in {p.node.node_id for p in again} and len(again) == 2


async def test_a_disaggregated_multinode_replica_is_four_pods() -> None:
    async with running(nodes(2, 4)) as run:
        await run.cluster.apply(
            "chat--east", render(devices=8, mode="disaggregated", nodes_per_worker=2)
        )
        await run.until_ready("chat--east", 1)
        pods = run.cluster.pods["chat--east"].values()
        names = sorted(p.name.split("-", 3)[-1] for p in pods)
        assert names == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
        assert all(len(p.device_ids) == 2 for p in pods)
        assert len({p.replica for p in pods}) == 1
        # a replica that does not fit whole does not start at all
        await run.cluster.apply(
            "chat--east", render(replicas=2, devices=8, mode="disaggregated", nodes_per_worker=2)
        )
        assert len(run.cluster.pods["chat--east"]) == 4
        assert run.statuses("chat--east")[-1].reason == "InsufficientDevices"


async def test_replicas_short_of_devices_start_when_another_deployment_frees_them() -> None:
    async with running(nodes(1, 2)) as run:
        await run.cluster.apply("a--east", render("a", replicas=2))
        await run.until_ready("a--east", 2)
        await run.cluster.apply("b--east", render("b"))
        assert run.statuses("b--east")[-1].phase == "pending"  # no devices for it
        await run.cluster.apply("a--east", render("a", replicas=1))  # no node event: a scale
        await run.until_ready("b--east", 1)


async def test_an_oom_killed_pod_is_a_condition_and_clears_by_itself() -> None:
    async with running(nodes(1, 4)) as run:
        await run.cluster.apply("chat--east", render(replicas=2))
        await run.until_ready("chat--east", 2)
        assert (await run.fault(fault="oom_kill", deployment_id="chat--east", replicas=1))["ok"]
        status = run.statuses("chat--east")[-1]
        assert (status.phase, status.ready_replicas, status.reason) == (
            "progressing",
            1,
            "OOMKilled",
        )
        assert [(c.reason, c.pods, c.permanent) for c in status.conditions] == [
            ("OOMKilled", 1, False)
        ]
        # a scale-up does not move the fault onto a replica that serves
        await run.cluster.apply("chat--east", render(replicas=3))
        await run.until_ready("chat--east", 2)
        assert [c.pods for c in run.statuses("chat--east")[-1].conditions] == [1]
        assert (await run.fault(fault="clear", deployment_id="chat--east"))["ok"]
        await run.until_ready("chat--east", 3)
        assert run.statuses("chat--east")[-1].conditions == ()


async def test_a_fault_request_names_what_it_is_for() -> None:
    async with running(nodes(1, 4)) as run:
        unknown = await run.fault(fault="crash_loop", deployment_id="nowhere--east")
        assert not unknown["ok"] and "unknown" in unknown["error"]
        await run.cluster.apply("chat--east", render())
        bad = await run.fault(fault="crash_loop", deployment_id="chat--east", replicas=0)
        assert not bad["ok"] and "replicas" in bad["error"]
        bad = await run.fault(fault="refuse", deployment_id="chat--east", reason="no spaces!")
        assert not bad["ok"] and "reason" in bad["error"]
        kinds = await run.fault(fault="meteor")
        assert not kinds["ok"] and "image_pull" in kinds["error"] and "refuse" in kinds["error"]


async def test_a_loading_model_is_ready_only_once_it_has_loaded() -> None:
    model = {"fault": "run_model", "name": "qwen", "engine_version": "1", "gpus": 1}
    async with running(nodes(1, 4)) as run:
        bad = await run.fault(**model, loading="yes")
        assert not bad["ok"] and "loading" in bad["error"]
        unknown = await run.fault(fault="model_loaded", name="qwen")
        assert not unknown["ok"] and "no model 'default/qwen'" in unknown["error"]
        assert (await run.fault(**model, loading=True))["ok"]
        await asyncio.sleep(READY_AFTER * 3)
        [pod] = run.cluster.pods["dgd:default/qwen"].values()
        assert not pod.ready
        assert (await run.fault(fault="model_loaded", name="qwen"))["ok"]
        assert pod.ready


async def test_every_write_is_recorded_and_one_held_back_once() -> None:
    async with running(nodes(1, 4)) as run:
        await run.cluster.apply("chat--east", render())
        await run.cluster.apply("chat--east", render())  # the same again: nothing to write
        await run.cluster.apply("chat--east", render(authority="managed", replicas=2))
        await run.cluster.apply("chat--east", None)
        assert run.actions() == [
            ("create", "chat--east", True, "no DynamoGraphDeployment yet"),
            ("apply", "chat--east", True, "it differs from the desired state"),
            ("delete", "chat--east", True, "the deployment was removed"),
        ]
    async with running(nodes(1, 4), read_only=True) as run:
        await run.cluster.apply("chat--east", render())
        await run.cluster.apply("chat--east", render(replicas=2))  # held back the same way
        await run.cluster.apply("chat--east", None)  # nothing was created: nothing to delete
        assert run.actions() == [("create", "chat--east", False, "read-only mode")]
        assert run.cluster.pods.get("chat--east", {}) == {}


async def test_a_refusal_keeps_what_runs_and_lifted_the_held_write_goes_through() -> None:
    async with running(nodes(1, 4)) as run:
        await run.cluster.apply("chat--east", render(replicas=2))
        await run.until_ready("chat--east", 2)
        assert (await run.fault(fault="refuse", deployment_id="chat--east", reason="Forbidden"))[
            "ok"
        ]
        status = run.statuses("chat--east")[-1]
        assert (status.phase, status.reason) == ("failed", "Forbidden")
        assert [(c.reason, c.permanent) for c in status.conditions] == [("Forbidden", True)]
        await run.cluster.apply("chat--east", render(replicas=0))  # the grant released
        assert len(run.cluster.pods["chat--east"]) == 2  # refused: what runs stays
        assert run.actions()[-1][:3] == ("apply", "chat--east", False)
        assert (await run.fault(fault="clear", deployment_id="chat--east"))["ok"]
        assert run.actions()[-1][:3] == ("apply", "chat--east", True)
        status = run.statuses("chat--east")[-1]
        assert (status.phase, status.desired_replicas, status.conditions) == ("ready", 0, ())


async def test_replicas_and_faults_outlive_the_operator(tmp_path: Path) -> None:
    state = tmp_path / "east.json"
    async with running(nodes(2, 4), state_file=state) as run:
        await run.cluster.apply("chat--east", render(replicas=2, devices=2, mode="disaggregated"))
        await run.until_ready("chat--east", 2)
        assert (await run.fault(fault="image_pull", deployment_id="chat--east", replicas=1))["ok"]
    async with running(nodes(2, 4), state_file=state) as run:
        assert len(run.cluster.pods["chat--east"]) == 4
        await run.cluster.apply("chat--east", render(replicas=2, devices=2, mode="disaggregated"))
        assert run.actions() == []  # written before: up to date
        status = run.statuses("chat--east")[-1]
        assert status.ready_replicas == 1
        assert [(c.reason, c.pods) for c in status.conditions] == [("ImagePullBackOff", 2)]
    # a node the spec no longer has takes its pods' replicas with it
    async with running(nodes(1, 4), state_file=state) as run:
        pods = run.cluster.pods["chat--east"].values()
        assert {p.node.node_id for p in pods} <= {"east-n1"}
        assert all(sum(q.replica == p.replica for q in pods) == 2 for p in pods)


async def test_a_model_run_by_hand_holds_its_devices_outside_wingsmith_until_adopted() -> None:
    def held_outside(run: Running) -> list[int]:
        [inventory] = [r for r in run.reports if isinstance(r, InventoryReport)][-1:]
        return [n.held_outside for n in inventory.nodes]

    model = {"fault": "run_model", "name": "qwen", "engine_version": "1", "gpus": 2}
    async with running(nodes(2, 4)) as run:
        assert (await run.fault(**model, replicas=2))["ok"]
        assert held_outside(run) == [4, 0]  # both replicas fit the first node
        adopting = render("qwen", devices=2, replicas=2, authority="observed")
        adopting["adopted"] = {"namespace": "default", "name": "qwen"}
        await run.cluster.apply("qwen--east", adopting)
        assert held_outside(run) == [0, 0]
        await run.cluster.apply("qwen--east", None)  # given up: someone else's again
        assert held_outside(run) == [4, 0]
        assert (await run.fault(fault="stop_model", name="qwen"))["ok"]
        assert held_outside(run) == [0, 0]
