"""The operator against kmock (real HTTP, the real kubernetes_asyncio client) and a real
nats-server: it renders desired state into DynamoGraphDeployments, writes nothing for observed
deployments or in read-only mode (proved from the API server's request log), and reports
replicas, status, inventory and discoveries."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import orjson
import pytest
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.kube import Kind, Kube
from wingsmith.domain import names
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.dgd import (
    LABEL_DEPLOYMENT,
    LABEL_SERVING_DIGEST,
    deployment_label,
    render_dgd,
)
from wingsmith.services.operator.inspect import load_manifest

from .conftest import wait_for
from .kube_fixtures import (
    NAMESPACE,
    cluster_create,
    cluster_delete,
    cluster_patch,
    kube_emulator,
    node,
    object_writes,
    pod,
    requests,
    running_operator,
    write_requests,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "dgd"
DGD: Kind = "dgd/v1beta1"
SERVING = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "backend": "vllm",
    "engine_version": "0.4.1",
    "image": None,
    "mode": "aggregated",
    "devices_per_replica": 2,
    "parallelism": {"tensor": 2, "pipeline": 1, "expert": 1},
    "context_length": None,
    "quantization": None,
    "kv_cache": {"dtype": None, "block_size": None, "gpu_memory_utilization": None},
}


def desired(replicas: int = 2, **changes: Any) -> dict[str, Any]:
    return {
        "deployment_id": "llama--east",
        "workload_id": "llama",
        "cluster_id": "east",
        "project": "research",
        "device_class": "NVIDIA-H100-80GB-HBM3",
        "generation": 1,
        "serving": SERVING,
        "serving_digest": "svg_00000000000000a1",
        "engine_args": [],
        "replicas": replicas,
        "enabled": True,
        "authority": "managed",
        "adopted": None,
    } | changes


class Cluster:
    """The emulated cluster, an operator for it, and what the operator reported."""

    def __init__(self, emulator: kmock.KubernetesEmulator, nc: Client, backend: KubeBackend):
        self.emulator, self.nc, self.backend = emulator, nc, backend
        self.kube: Kube = backend.kube

    async def render(self, body: dict[str, Any] | None, deployment_id: str = "llama--east") -> None:
        """What the hub's projector publishes: the whole object, or a removal."""
        headers = {nats_bus.DELETED_HEADER: "true"} if body is None else None
        await self.nc.jetstream().publish(
            f"{names.RENDER}.east.{deployment_id}",
            orjson.dumps(body) if body is not None else b"",
            stream=names.RENDER_STREAM,
            headers=headers,
        )

    async def dgd(self) -> dict[str, Any] | None:
        return await self.kube.get_dgd(NAMESPACE, "llama")

    async def until_dgd(self, check: Callable[[dict[str, Any] | None], bool], what: str) -> None:
        async def holds() -> bool:
            return check(await self.dgd())

        await wait_for(holds, 15, what)

    async def reported(self, kind: str) -> list[dict[str, Any]]:
        return [
            orjson.loads(m.data)
            async for m in nats_bus.read_stream(
                self.nc, names.OBS_STREAM, f"wingsmith.obs.east.{kind}", follow=False
            )
        ]

    async def until_reported(
        self, kind: str, matches: Callable[[dict[str, Any]], bool], what: str
    ) -> dict[str, Any]:
        async def found() -> bool:
            return any(matches(r) for r in await self.reported(kind))

        await wait_for(found, 15, what)
        return next(r for r in await self.reported(kind) if matches(r))


@contextlib.asynccontextmanager
async def operator(
    client: Client,
    *,
    read_only: bool = False,
    api_version: str = "nvidia.com/v1beta1",
    pod_selector: str | None = None,
    **options: Any,
) -> AsyncIterator[Cluster]:
    """An operator for cluster east on a kmock cluster; `options`: the backend's others."""
    await nats_bus.ensure_streams(client)
    async with kube_emulator() as (emulator, _, kube):
        backend = KubeBackend(
            kube,
            "east",
            NAMESPACE,
            read_only=read_only,
            api_version=api_version,
            pod_selector=pod_selector,
            **options,
        )
        async with running_operator(client, backend, read_only=read_only):
            yield Cluster(emulator, client, backend)


def workers(dgd: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in dgd["spec"]["components"] if c["type"] == "worker")


async def test_create_scale_rollout_and_removal(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired(replicas=2))
        await cluster.until_dgd(lambda d: d is not None, "the DGD to be created")
        created = await cluster.dgd()
        assert created is not None and workers(created)["replicas"] == 2
        labels = created["metadata"]["labels"]
        assert labels[LABEL_SERVING_DIGEST] == "svg_00000000000000a1"
        # created by server-side apply, as every later write is
        assert len(requests(cluster.emulator, kmock.action.UPDATE, DGD)) == 1

        await cluster.render(desired(replicas=3))
        await cluster.until_dgd(lambda d: d is not None and workers(d)["replicas"] == 3, "scale")
        applies = requests(cluster.emulator, kmock.action.UPDATE, DGD)
        assert len(applies) == 2 and all(
            (r.headers["Content-Type"], r.params["fieldManager"], r.params["force"])
            == ("application/apply-patch+yaml", "wingsmith", "true")
            for r in applies
        )

        rollout = desired(replicas=3, generation=2, serving_digest="svg_00000000000000b2")
        await cluster.render(rollout)
        await cluster.until_dgd(
            lambda d: (
                d is not None
                and d["metadata"]["labels"][LABEL_SERVING_DIGEST] == "svg_00000000000000b2"
            ),
            "the rollout",
        )
        assert len(requests(cluster.emulator, kmock.action.UPDATE, DGD)) == 3  # applied again

        await cluster.render(None)
        await cluster.until_dgd(lambda d: d is None, "the DGD to be deleted")
        performed = await cluster.reported("action")
        assert [(a["verb"], a["performed"]) for a in performed] == [
            ("create", True),
            ("apply", True),
            ("apply", True),
            ("delete", True),
        ]


async def test_an_unchanged_render_writes_nothing_again(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        await cluster.until_dgd(lambda d: d is not None, "the DGD to be created")
        await cluster.render(desired())  # the same desired state again, e.g. after a restart
        # another deployment after it: once that one exists, the repeat has been handled
        other = desired(deployment_id="qwen--east", workload_id="qwen")
        await cluster.render(other, "qwen--east")

        async def other_created() -> bool:
            return await cluster.kube.get_dgd(NAMESPACE, "qwen") is not None

        await wait_for(other_created, 15, "the second deployment's DGD")
        assert [r.method.value for r in object_writes(cluster.emulator)] == ["PATCH", "PATCH"]


async def test_an_observed_deployment_is_never_written_to(client: Client) -> None:
    adopted = load_manifest((FIXTURES / "vllm-agg-v1beta1.yaml").read_text())
    adopted["metadata"]["namespace"] = NAMESPACE
    async with operator(client) as cluster:
        await cluster_create(cluster.emulator, DGD, adopted)
        ref = {"namespace": NAMESPACE, "name": adopted["metadata"]["name"]}
        observed = desired(
            replicas=5, authority="observed", adopted=ref, deployment_id="adopted--east"
        )
        await cluster.render(observed, "adopted--east")  # 5 replicas: it runs fewer
        action = await cluster.until_reported("action", lambda r: True, "what it would do")
        assert (action["verb"], action["performed"]) == ("patch", False)
        assert write_requests(cluster.emulator) == []


async def test_read_only_writes_nothing_yet_keeps_desired_state_and_observes(
    client: Client,
) -> None:
    async with operator(client, read_only=True) as cluster:
        await cluster_create(cluster.emulator, "node", node("gpu-1", gpus=8))
        drifted = render_dgd(desired(replicas=1), namespace=NAMESPACE)  # it runs 1, not 2
        await cluster_create(cluster.emulator, DGD, drifted)
        await cluster.render(desired())
        await cluster.until_reported(
            "action", lambda r: (r["verb"], r["performed"]) == ("apply", False), "a would-apply"
        )
        assert cluster.backend.desired["llama--east"]["replicas"] == 2  # kept
        await cluster.until_reported(
            "inventory", lambda r: [n["devices"] for n in r["nodes"]] == [8], "the inventory"
        )
        await cluster.until_reported(
            "deployment", lambda r: r.get("status") is not None, "the DGD's status"
        )
        await cluster.render(None)
        await cluster.until_reported(
            "action", lambda r: (r["verb"], r["performed"]) == ("delete", False), "a would-delete"
        )
        assert write_requests(cluster.emulator) == []
        assert await cluster.dgd() is not None


async def test_pods_are_reported_as_replicas_with_devices_and_readiness(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        labels = {
            LABEL_DEPLOYMENT: deployment_label("llama--east"),
            LABEL_SERVING_DIGEST: "svg_00000000000000a1",
            "nvidia.com/dynamo-component-type": "worker",
        }
        worker = pod(
            "llama-worker-0",
            labels=labels,
            node="gpu-1",
            ready=False,
            annotations={"wingsmith.dev/device-ids": "GPU-a,GPU-b"},
        )
        await cluster_create(cluster.emulator, "pod", worker)
        started = await cluster.until_reported("replica", lambda r: True, "the replica")
        assert (started["pod"], started["node_id"], started["device_ids"], started["state"]) == (
            "llama-worker-0",
            "gpu-1",
            ["GPU-a", "GPU-b"],
            "not_ready",
        )
        await cluster_patch(
            cluster.emulator,
            "pod",
            worker,
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        )
        await cluster.until_reported("replica", lambda r: r["state"] == "ready", "readiness")
        await cluster.until_reported(
            "deployment",
            lambda r: r.get("live_digests") == {"svg_00000000000000a1": 1},
            "the live digests",
        )


async def test_with_a_pod_selector_only_the_pods_it_matches_are_watched(client: Client) -> None:
    """On a large cluster the pod informer asks the API server for the pods that matter only
    (and filters again, whatever the server does with the selector)."""
    async with operator(client, pod_selector="serving in (llm)") as cluster:
        await cluster.render(desired())
        labels = {
            LABEL_DEPLOYMENT: deployment_label("llama--east"),
            "nvidia.com/dynamo-component-type": "worker",
        }
        for name, serving in (("llama-worker-0", "batch"), ("llama-worker-1", "llm")):
            body = pod(name, labels=labels | {"serving": serving}, node="gpu-1")
            await cluster_create(cluster.emulator, "pod", body)
        # the informer sees changes in order: once the second pod is reported, the first
        # would have been
        await cluster.until_reported("replica", lambda r: True, "a replica")
        assert [r["pod"] for r in await cluster.reported("replica")] == ["llama-worker-1"]
        listed = requests(cluster.emulator, kmock.action.LIST, "pod")
        assert listed[0].params["labelSelector"] == "serving in (llm)"


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.yaml")))
async def test_dgds_it_did_not_render_are_reported_as_discovered(
    client: Client, fixture: str
) -> None:
    manifest = load_manifest((FIXTURES / fixture).read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    version = manifest["apiVersion"].split("/")[1]
    # kmock does not convert between versions as an API server does: watch the fixture's own
    async with operator(client, api_version=manifest["apiVersion"]) as cluster:
        await cluster_create(cluster.emulator, f"dgd/{version}", manifest)  # type: ignore[arg-type]
        found = await cluster.until_reported("discovery", lambda r: True, "the discovery")
        sighting = found["sighting"]
        assert (found["name"], sighting["api_version"]) == (
            manifest["metadata"]["name"],
            manifest["apiVersion"],
        )
        assert sighting["components"], "every fixture has components"
        assert write_requests(cluster.emulator) == []


async def test_a_rendered_dgd_changed_or_deleted_by_someone_is_put_back(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired(replicas=2))
        await cluster.until_dgd(lambda d: d is not None, "the DGD to be created")
        rendered = await cluster.dgd()
        assert rendered is not None
        edited = {
            "spec": {"components": [{**c, "replicas": 7} for c in rendered["spec"]["components"]]}
        }
        await cluster_patch(cluster.emulator, DGD, rendered, edited)
        await cluster.until_dgd(lambda d: d is not None and workers(d)["replicas"] == 2, "undo")
        await cluster_delete(cluster.emulator, DGD, rendered)
        await cluster.until_dgd(lambda d: d is not None, "the DGD to be recreated")
        created = [a for a in await cluster.reported("action") if a["verb"] == "create"]
        assert len(created) == 2


async def test_v1alpha1_clusters_get_a_v1alpha1_dgd(client: Client) -> None:
    async with operator(client, api_version="nvidia.com/v1alpha1") as cluster:
        await cluster.render(desired(replicas=1))

        async def created() -> bool:
            return await cluster.kube.get_dgd(NAMESPACE, "llama", "v1alpha1") is not None

        await wait_for(created, 15, "the v1alpha1 DGD")
        dgd = await cluster.kube.get_dgd(NAMESPACE, "llama", "v1alpha1")
        assert dgd is not None and dgd["spec"]["services"]["worker"]["replicas"] == 1


async def test_observations_survive_a_dropped_watch(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        await cluster.until_reported("inventory", lambda r: True, "the first inventory")
        # the API server ends every open watch: the operator watches again and sees later nodes
        watches = len(requests(cluster.emulator, kmock.action.WATCH, "node"))
        for request in list(cluster.emulator[kmock.action.WATCH]):
            # kmock cannot end a stream itself; this does
            request._raw_request.transport.abort()  # type: ignore[union-attr]

        async def watching_again() -> bool:
            return len(requests(cluster.emulator, kmock.action.WATCH, "node")) > watches

        await wait_for(watching_again, 15, "a new watch")
        await cluster_create(cluster.emulator, "node", node("gpu-late", gpus=4))
        await cluster.until_reported(
            "inventory", lambda r: [n["node_id"] for n in r["nodes"]] == ["gpu-late"], "the node"
        )
