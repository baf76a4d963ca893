"""The operator against kmock behaving like a real API server with Dynamo's operator and webhooks
(kmock over real HTTP, the real kubernetes_asyncio client, a real nats-server): refusals are
permanent and told, transient trouble is a condition that clears by itself, replicas are counted
whole, writes are server-side applies to the version the cluster serves, and a DGD Wingsmith did
not render is never touched.

The tests play the Dynamo operator and the kubelet by hand: they set a DGD's status and create
its pods as those would."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import kmock
import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.kube import RESOURCES, Kind
from wingsmith.domain import names
from wingsmith.services.hub.wiring import Hub
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.dgd import LABEL_DEPLOYMENT, deployment_label
from wingsmith.services.operator.inspect import load_manifest

from .conftest import LLAMA, send_until_answered, wait_for
from .kube_fixtures import (
    APPLY_PATCH,
    NAMESPACE,
    DynamoEmulator,
    cluster_create,
    cluster_patch,
    dgd,
    kube_emulator,
    node,
    object_writes,
    pod,
    recorded_events,
    requests,
    resource,
    running_operator,
    status_body,
    write_requests,
)
from .test_operator import SERVING, Cluster, desired

DGD: Kind = "dgd/v1beta1"
UPDATE = kmock.action.UPDATE


@contextlib.asynccontextmanager
async def operator(
    client: Client,
    *,
    kinds: Iterable[Kind] = tuple(RESOURCES),
    max_name: int = 253,
    refused_again: tuple[float, float] = (60.0, 3600.0),
) -> AsyncIterator[Cluster]:
    await nats_bus.ensure_streams(client)
    async with kube_emulator(kinds) as (emulator, _, kube):
        emulator.max_name = max_name
        backend = KubeBackend(kube, "east", NAMESPACE, read_only=False, refused_again=refused_again)
        async with running_operator(client, backend):
            yield Cluster(emulator, client, backend)


async def events_recorded(cluster: Cluster, count: int) -> list[dict[str, Any]]:
    """The Events the operator recorded, once there are `count` (they are sent beside the
    writes, not before the writes are reported)."""

    async def arrived() -> bool:
        return len(recorded_events(cluster.emulator)) >= count

    await wait_for(arrived, 15, f"{count} Events")
    return recorded_events(cluster.emulator)


def status_of(report: dict[str, Any]) -> dict[str, Any]:
    return report.get("status") or {}


def reasons(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["reason"]: c for c in status.get("conditions") or ()}


def worker_pod(
    name: str,
    component: str = "worker",
    *,
    ready: bool = True,
    waiting: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A worker pod as Dynamo's operator labels it; `waiting`: its container's waiting reason."""
    body = pod(
        name,
        labels={
            LABEL_DEPLOYMENT: deployment_label("llama--east"),
            "nvidia.com/dynamo-component-type": component,
            "nvidia.com/dynamo-component": component,
        }
        | (labels or {}),
        node="gpu-1",
        ready=ready,
    )
    if waiting is not None:
        body["status"]["containerStatuses"] = [
            {
                "name": "main",
                "ready": False,
                "state": {"waiting": {"reason": waiting, "message": f"{waiting}: image not found"}},
            }
        ]
    return body


async def set_status(cluster: Cluster, status: dict[str, Any]) -> None:
    """What Dynamo's operator writes to the DGD's status subresource."""
    current = await cluster.dgd()
    assert current is not None
    await cluster_patch(cluster.emulator, DGD, current, {"status": status})


# --- refusals: permanent, told, not retried ------------------------------------------------


async def test_a_refused_write_fails_the_deployment_with_the_servers_message_once(
    client: Client,
) -> None:
    # A real API server refuses names over 253 characters, which the plane's edge already
    # refuses; the emulator's limit is lowered to make the server refuse this render.
    async with operator(client, max_name=4) as cluster:
        await cluster.render(desired())
        refused = await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") == "failed", "the refusal"
        )
        status = status_of(refused)
        condition = reasons(status)["Rejected"]
        assert condition["permanent"] is True
        assert "must be no more than 4 characters" in condition["message"]
        assert status["reason"] == "Rejected"
        action = await cluster.until_reported("action", lambda r: True, "the action")
        assert (action["verb"], action["performed"]) == ("create", False)
        assert "must be no more than 4 characters" in action["reason"]
        [event] = await events_recorded(cluster, 1)
        assert (event["type"], event["reason"]) == ("Warning", "Rejected")
        assert "must be no more than 4 characters" in event["message"]

        # not retried: once a later deployment is handled, the refused one was sent only once
        other = desired(deployment_id="qwen--east", workload_id="qwen")
        await cluster.render(other, "qwen--east")

        async def other_created() -> bool:
            return await cluster.kube.get_dgd(NAMESPACE, "qwen") is not None

        await wait_for(other_created, 15, "the second deployment's DGD")
        await cluster.render(desired())  # the same render again: still not sent
        await cluster.render(other | {"replicas": 3}, "qwen--east")
        await cluster.until_dgd(lambda d: d is None, "nothing named llama")

        async def qwen_scaled() -> bool:
            qwen = await cluster.kube.get_dgd(NAMESPACE, "qwen")
            return qwen is not None and qwen["spec"]["components"][1]["replicas"] == 3

        await wait_for(qwen_scaled, 15, "the second deployment scaled")
        tries = [r for r in requests(cluster.emulator, UPDATE, DGD) if r.name == "llama"]
        assert len(tries) == 1
        # a changed render is tried again
        await cluster.render(desired(replicas=3))
        await wait_for(
            lambda: _true(
                len([r for r in requests(cluster.emulator, UPDATE, DGD) if r.name == "llama"]) == 2
            ),
            15,
            "the changed render to be tried",
        )


async def _true(value: bool) -> bool:
    return value


async def test_a_refused_render_is_tried_again_after_a_backoff_and_the_failure_clears(
    client: Client,
) -> None:
    async with operator(client, max_name=4, refused_again=(0.2, 0.4)) as cluster:
        await cluster.render(desired())
        await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") == "failed", "the refusal"
        )
        assert isinstance(cluster.emulator, DynamoEmulator)
        cluster.emulator.max_name = 253  # what refused it changed (a webhook fixed, say)
        await cluster.until_dgd(lambda d: d is not None, "the DGD, tried again by itself")
        await cluster.until_reported(
            "deployment",
            lambda r: status_of(r).get("phase") not in (None, "failed"),
            "a status that is not failed",
        )


async def test_what_the_webhook_forbids_in_place_is_replaced_not_refused(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        disaggregated = SERVING | {"mode": "disaggregated", "devices_per_replica": 4}
        await cluster.render(desired(serving=disaggregated, generation=2))
        await cluster.until_dgd(
            lambda d: d is not None and len(d["spec"]["components"]) == 3, "the replacement"
        )
        verbs = [(a["verb"], a["performed"]) for a in await cluster.reported("action")]
        assert verbs == [("create", True), ("replace", True)]
        methods = [r.method.value for r in object_writes(cluster.emulator)]
        assert methods == ["PATCH", "DELETE", "PATCH"]
        recorded = [(e["involvedObject"]["name"], e["type"], e["reason"]) for e in
                    await events_recorded(cluster, 2)]  # fmt: skip
        assert recorded == [("llama", "Normal", "Created"), ("llama", "Normal", "Replaced")]


async def test_a_foreign_dgd_of_the_same_name_is_never_touched(client: Client) -> None:
    async with operator(client) as cluster:
        theirs = dgd("llama", labels={"team": "search"})
        await cluster_create(cluster.emulator, DGD, theirs)
        before = await cluster.dgd()
        await cluster.render(desired())
        refused = await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") == "failed", "the refusal"
        )
        condition = reasons(status_of(refused))["Foreign"]
        assert condition["permanent"] and "did not render or adopt" in condition["message"]
        action = await cluster.until_reported("action", lambda r: True, "the action")
        assert action["performed"] is False
        assert object_writes(cluster.emulator) == []
        assert await cluster.dgd() == before
        # `kubectl describe` on their DGD says why it was left alone
        [event] = await events_recorded(cluster, 1)
        assert (event["involvedObject"]["name"], event["type"], event["reason"]) == (
            "llama",
            "Warning",
            "Foreign",
        )
        assert "did not render or adopt" in event["message"]


async def test_a_render_the_operator_cannot_express_fails_the_deployment(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired(serving=SERVING | {"devices_per_replica": 3}))
        refused = await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") == "failed", "the refusal"
        )
        condition = reasons(status_of(refused))["Unrenderable"]
        assert condition["permanent"] and "devices_per_replica" in condition["message"]
        assert write_requests(cluster.emulator) == []


# --- transient trouble: a condition, never `failed`, and it clears ----------------------


async def test_a_kind_the_api_server_refuses_is_a_condition_on_every_deployment_until_let_in(
    client: Client,
) -> None:
    """A namespace-scoped install whose RBAC does not cover the cluster-wide pod list: the
    operator says so on each deployment's status (and in its log, and /readyz) instead of
    retrying in silence; once let in, the condition clears by itself."""
    await nats_bus.ensure_streams(client)
    async with kube_emulator() as (emulator, _, kube):
        forbidden = status_body(
            403,
            "Forbidden",
            'pods is forbidden: User "system:serviceaccount:wingsmith:operator" cannot list '
            'resource "pods" in API group "" at the cluster scope',
        )
        denying = [True]  # until the test lets the operator in
        emulator[kmock.action.LIST, resource("pod"), lambda _: denying[0]] << 403 << forbidden
        backend = KubeBackend(kube, "east", NAMESPACE, read_only=False)
        async with running_operator(client, backend):
            cluster = Cluster(emulator, client, backend)
            await cluster.render(desired())
            denied = await cluster.until_reported(
                "deployment", lambda r: "Forbidden" in reasons(status_of(r)), "the refusal shown"
            )
            condition = reasons(status_of(denied))["Forbidden"]
            assert condition["permanent"] is False
            assert "may not list and watch pods" in condition["message"]
            assert "cannot list resource" in condition["message"]
            assert await cluster.dgd() is not None  # what it may do, it does
            denying[0] = False

            async def let_in() -> bool:
                statuses = [status_of(r) for r in await cluster.reported("deployment")]
                last = [s for s in statuses if s][-1]
                return "Forbidden" not in reasons(last) and backend.readiness()["listed_pods"]

            await wait_for(let_in, 30, "the condition to clear once the pods are listed")


async def test_a_server_error_is_a_transient_condition_and_the_write_is_retried(
    client: Client,
) -> None:
    async with operator(client) as cluster:
        unavailable = status_body(503, "ServiceUnavailable", "etcd is sad")
        cluster.emulator[UPDATE, resource(DGD)][:1] << 503 << unavailable
        await cluster.render(desired())
        troubled = await cluster.until_reported(
            "deployment", lambda r: "ServiceUnavailable" in reasons(status_of(r)), "the condition"
        )
        status = status_of(troubled)
        assert status["phase"] != "failed"
        assert reasons(status)["ServiceUnavailable"]["permanent"] is False
        await cluster.until_dgd(lambda d: d is not None, "the DGD, on a later try")
        await cluster.until_reported(
            "deployment",
            lambda r: status_of(r).get("phase") is not None and not reasons(status_of(r)),
            "the condition to clear",
        )


async def test_a_failed_dgd_is_a_condition_and_recovers_by_itself(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        ready = {"type": "Ready", "status": "False"}
        failed = ready | {"reason": "pods_not_ready", "message": "worker: 0/2 ready"}
        await set_status(cluster, {"state": "failed", "conditions": [failed]})
        seen = await cluster.until_reported(
            "deployment", lambda r: "pods_not_ready" in reasons(status_of(r)), "the condition"
        )
        status = status_of(seen)
        assert status["phase"] == "progressing"  # never failed: Dynamo retries it
        assert reasons(status)["pods_not_ready"]["permanent"] is False
        components = {"worker": {"replicas": 2, "readyReplicas": 2}}
        fine = ready | {"status": "True", "reason": "all_resources_are_ready"}
        await set_status(
            cluster, {"state": "successful", "conditions": [fine], "components": components}
        )
        recovered = await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") == "ready", "the recovery"
        )
        assert status_of(recovered)["conditions"] == []
        assert status_of(recovered)["ready_replicas"] == 2


async def test_an_image_pull_failure_on_one_replica_is_shown_and_clears(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        await set_status(cluster, {"state": "pending"})
        await cluster_create(cluster.emulator, "pod", worker_pod("llama-worker-0"))
        stuck = worker_pod("llama-worker-1", ready=False, waiting="ImagePullBackOff")
        await cluster_create(cluster.emulator, "pod", stuck)
        seen = await cluster.until_reported(
            "deployment", lambda r: "ImagePullBackOff" in reasons(status_of(r)), "the condition"
        )
        condition = reasons(status_of(seen))["ImagePullBackOff"]
        assert (condition["pods"], condition["permanent"]) == (1, False)
        assert condition["message"].startswith("llama-worker-1: ")
        assert status_of(seen)["ready_replicas"] == 1  # the other one serves
        await cluster_patch(
            cluster.emulator,
            "pod",
            stuck,
            {"status": worker_pod("llama-worker-1")["status"] | {"containerStatuses": []}},
        )
        cleared = await cluster.until_reported(
            "deployment",
            lambda r: status_of(r).get("ready_replicas") == 2 and not reasons(status_of(r)),
            "the condition to clear",
        )
        assert status_of(cleared)["phase"] != "failed"


# --- replicas counted whole -----------------------------------------------------------------

DISAGGREGATED = SERVING | {"mode": "disaggregated", "devices_per_replica": 4}


async def test_a_disaggregated_replica_is_a_prefill_and_decode_pair(client: Client) -> None:
    """Per-component status (Dynamo 0.8 on): every decode worker down means no replica ready,
    and not `ready`, whatever the DGD's state still says."""
    async with operator(client) as cluster:
        await cluster.render(desired(serving=DISAGGREGATED))
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        components = {
            "prefill": {"replicas": 2, "readyReplicas": 2},
            "decode": {"replicas": 2, "readyReplicas": 0},
        }
        await set_status(cluster, {"state": "successful", "components": components})
        seen = await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") not in (None, "unknown"), "a status"
        )
        assert (status_of(seen)["ready_replicas"], status_of(seen)["phase"]) == (0, "progressing")


async def test_without_per_component_status_the_pods_are_counted(client: Client) -> None:
    """Operators before 0.8: no per-component status; whole replicas from the pods."""
    async with operator(client) as cluster:
        await cluster.render(desired(serving=DISAGGREGATED))
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        await set_status(cluster, {"state": "successful"})
        for i in range(2):
            for role in ("prefill", "decode"):
                ready = not (role == "decode" and i == 1)
                await cluster_create(
                    cluster.emulator, "pod", worker_pod(f"llama-{role}-{i}", role, ready=ready)
                )
        seen = await cluster.until_reported(
            "deployment",
            lambda r: status_of(r).get("ready_replicas") == 1,
            "one whole replica (not three pods)",
        )
        assert status_of(seen)["phase"] == "progressing"


async def test_a_status_older_than_the_spec_is_not_ready(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        current = await cluster.dgd()
        assert current is not None
        await cluster_patch(cluster.emulator, DGD, current, {"metadata": {"generation": 2}})
        components = {"worker": {"replicas": 2, "readyReplicas": 2}}
        stale = {"state": "successful", "observedGeneration": 1, "components": components}
        await set_status(cluster, stale)
        seen = await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") not in (None, "unknown"), "a status"
        )
        assert (status_of(seen)["phase"], status_of(seen)["reason"]) == (
            "progressing",
            "StatusNotYetObserved",
        )
        await set_status(cluster, stale | {"observedGeneration": 2})
        await cluster.until_reported(
            "deployment", lambda r: status_of(r).get("phase") == "ready", "ready once observed"
        )


# --- server-side apply, versions and scaling adapters -----------------------------------


async def test_writes_are_server_side_applies_that_keep_others_fields(client: Client) -> None:
    async with operator(client) as cluster:
        await cluster.render(desired())
        await cluster.until_dgd(lambda d: d is not None, "the DGD")
        # someone else's apply: a label of their own, under their own field manager
        theirs = {
            "apiVersion": "nvidia.com/v1beta1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "llama", "namespace": NAMESPACE, "labels": {"team": "x"}},
        }
        path = f"/apis/nvidia.com/v1beta1/namespaces/{NAMESPACE}/dynamographdeployments/llama"
        headers = {"Content-Type": APPLY_PATCH}
        params = {"fieldManager": "kubectl"}
        async with cluster.emulator.patch(
            path, data=orjson.dumps(theirs), headers=headers, params=params
        ) as resp:
            assert resp.status < 300, await resp.text()
        await cluster.render(desired(replicas=3))
        await cluster.until_dgd(
            lambda d: d is not None and d["spec"]["components"][1]["replicas"] == 3, "the apply"
        )
        after = await cluster.dgd()
        assert after is not None and after["metadata"]["labels"]["team"] == "x"
        for sent in requests(cluster.emulator, UPDATE, DGD):
            assert sent.headers["Content-Type"] == APPLY_PATCH
            assert (sent.params["fieldManager"], sent.params["force"]) == ("wingsmith", "true")


async def test_a_cluster_serving_only_v1alpha1_gets_v1alpha1(client: Client) -> None:
    async with operator(client, kinds=["dgd/v1alpha1", "pod", "node"]) as cluster:
        await cluster.render(desired())

        async def created() -> bool:
            return await cluster.kube.get_dgd(NAMESPACE, "llama", "v1alpha1") is not None

        await wait_for(created, 15, "the v1alpha1 DGD")
        [sent] = requests(cluster.emulator, UPDATE, "dgd/v1alpha1")
        assert sent.data["apiVersion"] == "nvidia.com/v1alpha1"
        assert "services" in sent.data["spec"]


async def test_an_adopted_worker_with_a_scaling_adapter_is_scaled_through_it(
    client: Client,
) -> None:
    fixture = Path(__file__).parent.parent / "fixtures" / "dgd" / "vllm-agg-v1beta1.yaml"
    manifest = load_manifest(fixture.read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    adapter = {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeploymentScalingAdapter",
        "metadata": {"name": "qwen3-chat-vllmworker", "namespace": NAMESPACE},
        "spec": {"replicas": 2, "dgdRef": {"name": "qwen3-chat", "componentName": "VllmWorker"}},
    }
    async with operator(client) as cluster:
        await cluster_create(cluster.emulator, DGD, manifest)
        adapters = f"/apis/nvidia.com/v1beta1/namespaces/{NAMESPACE}/"
        adapters += "dynamographdeploymentscalingadapters"
        async with cluster.emulator.post(adapters, json=adapter) as resp:
            assert resp.status < 300, await resp.text()
        ref = {"namespace": NAMESPACE, "name": "qwen3-chat"}
        managed = desired(
            replicas=3, adopted=ref, deployment_id="qwen3-chat--east", workload_id="qwen3-chat"
        )
        await cluster.render(managed, "qwen3-chat--east")

        def scales() -> list[kmock.Request]:
            return [r for r in write_requests(cluster.emulator) if r.subresource == "scale"]

        await wait_for(lambda: _true(bool(scales())), 15, "the scale")
        [scale] = scales()
        assert scale.name == "qwen3-chat-vllmworker" and scale.data == {"spec": {"replicas": 3}}
        # the DGD itself is not written: the webhook lets only the adapter change its replicas
        assert not requests(cluster.emulator, UPDATE, DGD)


# --- the whole way to the hub ---------------------------------------------------------------


async def test_a_failed_image_pull_keeps_the_others_serving_shows_why_and_recovers(
    hub: Hub, client: Client
) -> None:
    """MUST SHOW: one replica's image cannot be pulled; the other keeps serving and the grant
    stays; the deployment shows the reason; the fault clears and so does the condition."""

    async def command(verb: str, **body: Any) -> None:
        reply = await send_until_answered(client, verb, {"command_id": f"t-{verb}"} | body)
        assert reply["ok"], reply

    async def health() -> dict[str, Any]:
        _, latest = (await nats_bus.latest_views(client, "deployment_health")).get(
            "chat--east", (0, None)
        )
        return {} if latest is None else dict(orjson.loads(latest))

    async def events() -> list[str]:
        subject = "wingsmith.evt.deployment.chat--east.>"
        stream = nats_bus.read_stream(client, names.EVENTS_STREAM, subject, follow=False)
        return [orjson.loads(m.data)["type"] async for m in stream]

    async with operator(client) as cluster:
        await cluster_create(cluster.emulator, "node", node("gpu-1", product="H100", gpus=8))
        await command("project.set_quota", project="p", device_class="H100", devices=8)
        workload = {"workload_id": "chat", "project": "p", "device_class": "H100"}
        await command("workload.create", **workload, serving=LLAMA, replicas=2, cluster="east")

        async def rendered() -> bool:
            return await cluster.kube.get_dgd(NAMESPACE, "chat") is not None

        await wait_for(rendered, 30, "the DGD")
        chat = await cluster.kube.get_dgd(NAMESPACE, "chat")
        assert chat is not None
        digest = chat["metadata"]["labels"]["wingsmith.dev/serving-digest"]
        await cluster_patch(cluster.emulator, DGD, chat, {"status": {"state": "pending"}})
        own = {
            LABEL_DEPLOYMENT: deployment_label("chat--east"),
            "wingsmith.dev/serving-digest": digest,
        }

        def chat_pod(name: str, **kw: Any) -> dict[str, Any]:
            body = worker_pod(name, labels=own, **kw)
            body["metadata"]["annotations"] = {"wingsmith.dev/device-ids": f"GPU-{name[-1]}"}
            return body

        await cluster_create(cluster.emulator, "pod", chat_pod("chat-worker-0"))
        stuck = chat_pod("chat-worker-1", ready=False, waiting="ImagePullBackOff")
        await cluster_create(cluster.emulator, "pod", stuck)

        async def shown() -> bool:
            status = (await health()).get("status") or {}
            return "ImagePullBackOff" in reasons(status)

        await wait_for(shown, 30, "the reason on the deployment")
        status = (await health())["status"]
        condition = reasons(status)["ImagePullBackOff"]
        assert (condition["pods"], condition["permanent"]) == (1, False)
        assert status["phase"] != "failed" and status["ready_replicas"] == 1
        history = await events()
        assert "DeploymentFailed" not in history and "DeploymentRunning" in history

        await cluster_patch(
            cluster.emulator,
            "pod",
            stuck,
            {"status": chat_pod("chat-worker-1")["status"] | {"containerStatuses": []}},
        )

        async def recovered() -> bool:
            status = (await health()).get("status") or {}
            return status.get("ready_replicas") == 2 and not status.get("conditions")

        await wait_for(recovered, 30, "the condition to clear by itself")
        history = await events()
        assert "DeploymentFailed" not in history
        assert write_requests(cluster.emulator)  # the render was applied, and nothing scaled down
        last = await cluster.kube.get_dgd(NAMESPACE, "chat")
        assert last is not None and last["spec"]["components"][1]["replicas"] == 2
