"""A workload's pod needs, end to end: a hub, a real nats-server and an operator on kmock with
the cluster's pod defaults. A Hugging Face token from a Secret and a model cache reach the
render object and the DynamoGraphDeployment; a later change to where the pods may run reaches
the cluster too, in the same generation and serving digest (no rollout)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import kmock
from nats.aio.client import Client

from wingsmith.adapters.kube import Kube
from wingsmith.domain.pods import PodNeeds
from wingsmith.services.hub.wiring import Hub
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.dgd import LABEL_GENERATION, LABEL_SERVING_DIGEST

from .conftest import wait_for
from .kube_fixtures import NAMESPACE, cluster_create, kube_emulator, node, running_operator
from .test_adoption import command, events

DEFAULTS = PodNeeds.model_validate(
    {
        "image_pull_secrets": ["cluster-ngc"],
        "env": [{"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "1"}],
    }
)
POD: dict[str, Any] = {
    "secret_env": [{"name": "HF_TOKEN", "secret": "hf-token", "key": "token"}],
    "model_cache": {"claim": "models"},
}
SERVING: dict[str, Any] = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "backend": "vllm",
    "engine_version": "1.3.0",
    "devices_per_replica": 2,
    "parallelism": {"tensor": 2},
    "pod": POD,
}


@contextlib.asynccontextmanager
async def operator_with_defaults(
    client: Client,
) -> AsyncIterator[tuple[kmock.KubernetesEmulator, Kube, KubeBackend]]:
    async with kube_emulator() as (emulator, _, kube):
        backend = KubeBackend(kube, "east", NAMESPACE, read_only=False, pod_defaults=DEFAULTS)
        async with running_operator(client, backend):
            yield emulator, kube, backend


def worker(dgd: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in dgd["spec"]["components"] if c["type"] == "worker")


async def test_a_token_and_a_model_cache_reach_the_dgd_and_a_move_needs_no_rollout(
    hub: Hub, client: Client
) -> None:
    async with operator_with_defaults(client) as (emulator, kube, backend):
        await cluster_create(emulator, "node", node("gpu-1", product="H100", gpus=8))

        async def registered() -> bool:
            return "InventoryReported" in await events(hub, "cluster:east")

        await wait_for(registered, 20, "the cluster's inventory at the hub")
        await command(
            client, "project.set_quota", project="research", device_class="H100", devices=8
        )
        await command(
            client,
            "workload.create",
            workload_id="llama",
            project="research",
            device_class="H100",
            replicas=1,
            cluster="east",
            serving=SERVING,
        )

        async def rendered() -> dict[str, Any] | None:
            return await kube.get_dgd(NAMESPACE, "llama")

        async def created() -> bool:
            return await rendered() is not None

        async def applied_here() -> bool:  # recorded once the write (and its Event) is done
            return "llama--east" in backend.applied

        await wait_for(applied_here, 20, "the render object applied")
        applied = backend.applied["llama--east"] or {}
        assert applied["serving"]["pod"]["secret_env"] == POD["secret_env"]  # the render object
        dgd = await rendered()
        assert dgd is not None
        spec = worker(dgd)["podTemplate"]["spec"]
        main = spec["containers"][0]
        assert {"name": "HF_HOME", "value": "/model-cache"} in main["env"]
        assert {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
        } in main["env"]
        assert {"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "1"} in main["env"]  # a default
        assert main["volumeMounts"] == [{"name": "model-cache", "mountPath": "/model-cache"}]
        assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "models"}
        assert spec["imagePullSecrets"] == [{"name": "cluster-ngc"}]
        labels = dict(dgd["metadata"]["labels"])

        moved = SERVING | {
            "pod": POD | {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
        }
        await command(client, "workload.change_serving_config", workload_id="llama", serving=moved)

        async def tolerated() -> bool:
            dgd = await rendered()
            return dgd is not None and "tolerations" in worker(dgd)["podTemplate"]["spec"]

        await wait_for(tolerated, 20, "the toleration on the cluster")
        dgd = await rendered()
        assert dgd is not None
        assert {
            k: dgd["metadata"]["labels"][k] for k in (LABEL_GENERATION, LABEL_SERVING_DIGEST)
        } == {k: labels[k] for k in (LABEL_GENERATION, LABEL_SERVING_DIGEST)}
        history = await events(hub, "deployment:llama--east")
        assert "ServingConfigAmended" in history and "ServingConfigChanged" not in history
