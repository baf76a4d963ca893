"""The operator's command line as a person runs it: `wingsmith operator --kubeconfig` in its own
process against kmock and a real nats-server, `wingsmith render` and `wingsmith inspect-dgd`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Container
from pathlib import Path
from typing import Any

import httpx
import kmock
import orjson
import yaml
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.kube import Kind
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.domain.cluster import Cluster
from wingsmith.services.hub.wiring import Hub

from .conftest import wait_for
from .kube_fixtures import NAMESPACE, kube_emulator, requests, write_kubeconfig
from .test_operator import desired

WINGSMITH = [sys.executable, "-m", "wingsmith"]
FIXTURES = Path(__file__).parent.parent / "fixtures" / "dgd"


def env(nats_url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WINGSMITH_", "HANGAR_"))}
    return clean | {"WINGSMITH_NATS_URL": nats_url}


async def test_the_operator_command_reconciles_a_cluster_from_its_kubeconfig(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    await nats_bus.ensure_streams(client)
    async with kube_emulator() as (_, server, kube):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url))
        command = [*WINGSMITH, "operator", "--cluster-id", "east", "--kubeconfig", str(kubeconfig)]
        operator = subprocess.Popen(
            command, env=env(nats_server.url), stdout=subprocess.PIPE, text=True
        )
        try:
            await client.jetstream().publish(
                "wingsmith.render.east.llama--east",
                orjson.dumps(desired(replicas=1)),
                stream=names.RENDER_STREAM,
            )

            async def created() -> bool:
                return await kube.get_dgd(NAMESPACE, "llama") is not None

            await wait_for(created, 30, "the operator process to create the DGD")
            operator.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(operator.wait, 30) == 0
            assert operator.stdout is not None
            assert "wingsmith operator for east ready (read-write)" in operator.stdout.read()
        finally:
            if operator.poll() is None:
                operator.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_operator_serves_probes_that_say_what_it_waits_for(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """Live while it runs; ready only once every informer has listed its kind and NATS is
    connected. On a cluster without Dynamo's CRDs the DGD informer never lists: not ready, and
    the probe says so; once Dynamo is there it is ready."""
    await nats_bus.ensure_streams(client)
    cases: list[tuple[tuple[Kind, ...], bool]] = [
        (("pod", "node"), False),
        (("dgd/v1beta1", "pod", "node"), True),
    ]
    for kinds, ready in cases:
        async with kube_emulator(kinds) as (_, server, _):
            kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url))
            probes = f"127.0.0.1:{free_port()}"
            command = [
                *WINGSMITH, "operator", "--cluster-id", "east", "--kubeconfig", str(kubeconfig),
                "--probes", probes,
            ]  # fmt: skip
            operator = subprocess.Popen(command, env=env(nats_server.url))
            try:
                async with httpx.AsyncClient(base_url=f"http://{probes}") as http:

                    async def listed() -> bool:
                        with contextlib.suppress(httpx.TransportError):
                            checks = (await http.get("/readyz")).json()["checks"]
                            return bool(checks["listed_pods"] and checks["listed_nodes"])
                        return False

                    await wait_for(listed, 30, "the pods and nodes to be listed")
                    live = await http.get("/healthz")
                    assert (live.status_code, live.json()) == (
                        200,
                        {"ok": True, "checks": {"running": True}},
                    )
                    answer = await http.get("/readyz")
                    checks = {
                        "nats_connected": True,
                        "listed_dgds": ready,
                        "listed_pods": True,
                        "listed_nodes": True,
                    }
                    assert (answer.status_code, answer.json()) == (
                        200 if ready else 503,
                        {"ok": ready, "checks": checks},
                    )
                    assert (await http.get("/metrics")).status_code == 404
                    assert (await http.post("/readyz")).status_code == 405
            finally:
                operator.terminate()
                await asyncio.to_thread(operator.wait, 30)


LEASE = 4  # seconds: short for a test, long enough that a busy machine renews in time


async def test_of_two_operators_electing_a_leader_one_acts_and_the_other_takes_over(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """Two replicas of one cluster's operator with `--leader-elect`: only the Lease's holder
    lists the cluster and writes; killed (SIGKILL: it cannot give the Lease up), the other
    takes the Lease over once it has stood unrenewed for its duration, and acts; stopped
    cleanly, a holder gives the Lease up."""
    await nats_bus.ensure_streams(client)
    async with kube_emulator() as (emulator, server, kube):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url))
        command = [
            *WINGSMITH, "operator", "--cluster-id", "east", "--kubeconfig", str(kubeconfig),
            "--leader-elect",
        ]  # fmt: skip
        environment = env(nats_server.url) | {"WINGSMITH_OPERATOR_LEASE_SECONDS": str(LEASE)}
        operators = [subprocess.Popen(command, env=environment) for _ in range(2)]
        identities = {f"{socket.gethostname()}-{p.pid}": p for p in operators}

        async def holder() -> str | None:
            lease = await kube.get_lease(NAMESPACE, "wingsmith-operator-east")
            return None if lease is None else lease["spec"].get("holderIdentity")

        async def render(replicas: int) -> None:
            body = orjson.dumps(desired(replicas=replicas))
            subject = "wingsmith.render.east.llama--east"
            await client.jetstream().publish(subject, body, stream=names.RENDER_STREAM)

        async def has_replicas(n: int) -> bool:
            dgd = await kube.get_dgd(NAMESPACE, "llama")
            components = [] if dgd is None else dgd["spec"]["components"]
            return any(c.get("type") == "worker" and c.get("replicas") == n for c in components)

        try:
            await wait_for(lambda: _in(holder(), identities), 30, "one operator to lead")
            leader = identities[str(await holder())]
            await render(1)
            await wait_for(lambda: has_replicas(1), 30, "the leader to create the DGD")
            await asyncio.sleep(LEASE)  # the other does nothing meanwhile
            assert len(requests(emulator, kmock.action.LIST, "pod")) == 1  # only the leader's

            leader.kill()
            leader.wait(10)
            await render(2)
            await wait_for(lambda: has_replicas(2), 30, "the other to take over and act")
            standby = next(p for p in operators if p is not leader)
            lease = await kube.get_lease(NAMESPACE, "wingsmith-operator-east")
            assert lease is not None
            assert identities[lease["spec"]["holderIdentity"]] is standby
            assert lease["spec"]["leaseTransitions"] == 1
            assert len(requests(emulator, kmock.action.LIST, "pod")) == 2

            standby.terminate()
            assert await asyncio.to_thread(standby.wait, 30) == 0
            assert await holder() is None  # given up: the next need not wait it out
        finally:
            for p in operators:
                if p.poll() is None:
                    p.kill()


async def _in(found: Awaitable[str | None], among: Container[str]) -> bool:
    return await found in among


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WINGSMITH, *args], capture_output=True, text=True, timeout=60)


def test_options_it_cannot_honour_stop_the_operator_before_it_starts() -> None:
    refused = run("operator", "--cluster-id", "east", "--in-cluster", "--pod-selector", "a=b=c")
    assert refused.returncode == 2
    assert "--pod-selector: unsupported label selector: 'a=b=c'" in refused.stderr
    refused = run("operator", "--cluster-id", "east", "--in-cluster", "--probes", "8081")
    assert refused.returncode == 2
    assert "--probes must be HOST:PORT, not '8081'" in refused.stderr
    both = ["--in-cluster", "--read-only", "--leader-elect"]
    refused = run("operator", "--cluster-id", "east", *both)
    assert refused.returncode == 1
    assert "a read-only operator writes nothing, not even a Lease" in refused.stderr


def test_render_prints_the_dgd_for_a_deployment_object(tmp_path: Path) -> None:
    body: dict[str, Any] = desired(replicas=3)
    (tmp_path / "deployment.json").write_text(json.dumps(body))
    printed = run("render", str(tmp_path / "deployment.json"))
    assert printed.returncode == 0, printed.stderr
    dgd = yaml.safe_load(printed.stdout)
    assert (dgd["apiVersion"], dgd["metadata"]["name"]) == ("nvidia.com/v1beta1", "llama")
    worker = next(c for c in dgd["spec"]["components"] if c["type"] == "worker")
    assert worker["replicas"] == 3
    (tmp_path / "bad.json").write_text(json.dumps(body | {"replicas": -1}))
    refused = run("render", str(tmp_path / "bad.json"))
    assert refused.returncode == 2 and "replicas" in refused.stderr


def test_inspect_dgd_prints_what_runs_in_a_manifest() -> None:
    printed = run("inspect-dgd", str(FIXTURES / "vllm-disagg-v1alpha1.yaml"))
    assert printed.returncode == 0, printed.stderr
    summary = json.loads(printed.stdout)
    assert set(summary) == {"api_version", "backend", "components"}
    assert summary["api_version"] == "nvidia.com/v1alpha1"
    roles = {c["role"] for c in summary["components"]}
    assert {"prefill", "decode"} <= roles
    assert all(
        set(c) == {"name", "role", "replicas", "gpus_per_replica", "imported_args"}
        for c in summary["components"]
    )


def test_inspect_dgd_reads_the_graph_of_a_file_that_ships_more() -> None:
    """A recipe's ConfigMap and Secret are passed over: the output is one graph's, as for a
    file holding the graph alone."""
    printed = run("inspect-dgd", str(FIXTURES / "files" / "trtllm-agg-recipe.yaml"))
    assert printed.returncode == 0, printed.stderr
    summary = json.loads(printed.stdout)
    assert set(summary) == {"api_version", "backend", "components"}
    assert [c["name"] for c in summary["components"]] == ["Frontend", "TRTLLMWorker"]


def test_inspect_dgd_prints_each_graph_of_a_file_named() -> None:
    printed = run("inspect-dgd", str(FIXTURES / "files" / "two-graphs.yaml"))
    assert printed.returncode == 0, printed.stderr
    summaries = json.loads(printed.stdout)
    assert [(s["namespace"], s["name"], s["backend"]) for s in summaries] == [
        ("team-b", "qwen-agg", "vllm"),
        ("team-b", "qwen-sglang", "sglang"),
    ]


def test_inspect_dgd_refuses_a_file_without_a_graph_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    refused = run("inspect-dgd", str(path))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"wingsmith: {path}: no DynamoGraphDeployment in it (only ConfigMap)"
    )


async def test_a_simulated_operator_registers_its_cluster_and_takes_faults(
    hub: Hub, nats_server: EmbeddedNatsServer
) -> None:
    command = [*WINGSMITH, "operator", "--cluster-id", "west", "--simulated", "2x4:H100@zone-1"]
    operator = subprocess.Popen(command, env=env(nats_server.url), stdout=subprocess.DEVNULL)
    try:

        async def registered() -> bool:
            history = await hub.store.run(hub.store.store.history, "cluster:west")
            return {"OperatorConnected", "InventoryReported"} <= {type(e).__name__ for e in history}

        await wait_for(registered, 30, "the simulated cluster's heartbeat and inventory")
        fault = ["sim-fault", "west", "node_loss", "--node", "west-n1"]
        lost = await asyncio.to_thread(
            subprocess.run, [*WINGSMITH, *fault], env=env(nats_server.url), capture_output=True
        )
        assert lost.returncode == 0, lost.stderr
        unknown = ["sim-fault", "west", "node_loss", "--node", "nowhere"]
        refused = await asyncio.to_thread(
            subprocess.run, [*WINGSMITH, *unknown], env=env(nats_server.url), capture_output=True
        )
        assert refused.returncode == 1 and b"node" in refused.stdout
    finally:
        operator.terminate()
        await asyncio.to_thread(operator.wait, 30)


async def test_read_only_is_a_flag_or_either_variable_and_an_unclear_value_stops_the_operator(
    hub: Hub, nats_server: EmbeddedNatsServer
) -> None:
    base = [*WINGSMITH, "operator", "--simulated", "1x4:H100", "--cluster-id"]
    ways = {
        "ro-flag": (["--read-only"], {}),
        "ro-hangar": ([], {"HANGAR_OPERATOR_READ_ONLY": "true"}),
        "ro-ours": ([], {"WINGSMITH_OPERATOR_READ_ONLY": "yes"}),
    }
    running = [
        subprocess.Popen(
            [*base, cluster_id, *flags],
            env=env(nats_server.url) | variables,
            stdout=subprocess.PIPE,
        )
        for cluster_id, (flags, variables) in ways.items()
    ]
    try:
        for process in running:
            assert process.stdout is not None
            line = await asyncio.to_thread(process.stdout.readline)
            assert line.endswith(b"ready (read-only)\n"), line

        async def all_read_only() -> bool:
            for cluster_id in ways:
                cluster = await hub.store.run(hub.store.store.load, f"cluster:{cluster_id}")
                if not isinstance(cluster, Cluster) or cluster.operator is None:
                    return False
                if not cluster.operator.read_only:
                    return False
            return True

        await wait_for(all_read_only, 30, "three read-only operators to be heard")
    finally:
        for process in running:
            process.terminate()
            await asyncio.to_thread(process.wait, 30)
    unclear = await asyncio.to_thread(
        subprocess.run,
        [*base, "ro-unclear"],
        env=env(nats_server.url) | {"HANGAR_OPERATOR_READ_ONLY": "maybe"},
        capture_output=True,
        timeout=60,
    )
    assert unclear.returncode != 0 and b"ready" not in unclear.stdout
    assert b"HANGAR_OPERATOR_READ_ONLY must be true or false" in unclear.stderr, unclear.stderr
