"""The Kubernetes adapter against kmock over real HTTP, through the real kubernetes_asyncio client.

kmock keeps objects and streams their changes, but never ends a watch, never answers 410 and
ignores selectors (the emulator adds resourceVersions). Where a test needs one of those, it
scripts kmock's response to the first matching request; later requests fall through to the
emulator.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import kmock
import pytest

from tests.integration.kube_fixtures import (
    NAMESPACE,
    cluster_create,
    cluster_delete,
    cluster_patch,
    dgd,
    kube_emulator,
    names,
    next_change,
    node,
    pod,
    requests,
    resource,
    status_body,
    until_synced,
    wait_until,
    write_kubeconfig,
)
from wingsmith.adapters.kube import Kind, KindNotServed, Kube, KubeConflict, KubeError, KubeNotFound
from wingsmith.adapters.kube import selector_matcher as matcher

DGD: Kind = "dgd/v1beta1"
WATCH, LIST, UPDATE = kmock.action.WATCH, kmock.action.LIST, kmock.action.UPDATE


# --- reads and writes ----------------------------------------------------------------------------


async def test_create_then_get() -> None:
    async with kube_emulator() as (_, _, kube):
        created = await kube.create_dgd(dgd("llama", labels={"app": "llama"}))
        assert created["metadata"]["name"] == "llama"

        got = await kube.get_dgd(NAMESPACE, "llama")
        assert got == created
        assert await kube.get_dgd(NAMESPACE, "missing") is None
        assert await kube.get_dgd("elsewhere", "llama") is None


async def test_v1alpha1_objects_are_addressed_by_their_version() -> None:
    async with kube_emulator() as (emulator, _, kube):
        await kube.create_dgd(dgd("old", version="v1alpha1"))
        assert await kube.get_dgd(NAMESPACE, "old", version="v1alpha1") is not None
        assert await kube.get_dgd(NAMESPACE, "old", version="v1beta1") is None
        assert requests(emulator, kmock.action.CREATE, "dgd/v1alpha1")


async def test_merge_patch_sends_its_content_type_and_changes_only_the_given_fields() -> None:
    async with kube_emulator() as (emulator, _, kube):
        spec = {"backendFramework": "vllm", "components": [{"name": "worker", "replicas": 1}]}
        await kube.create_dgd(dgd("llama", labels={"keep": "1", "drop": "1"}, spec=spec))

        patch = {
            "metadata": {"labels": {"drop": None, "new": "2"}},
            "spec": {"components": [{"name": "worker", "replicas": 3}]},
        }
        patched = await kube.patch_dgd(NAMESPACE, "llama", patch, "v1beta1")

        [sent] = requests(emulator, UPDATE, DGD)
        assert sent.headers["Content-Type"] == "application/merge-patch+json"
        assert sent.data == patch
        assert patched["metadata"]["labels"] == {"keep": "1", "new": "2"}
        assert patched["spec"] == {
            "backendFramework": "vllm",
            "components": [{"name": "worker", "replicas": 3}],
        }
        assert await kube.get_dgd(NAMESPACE, "llama") == patched


async def test_delete_then_delete_again() -> None:
    async with kube_emulator() as (_, _, kube):
        await kube.create_dgd(dgd("llama"))
        assert await kube.delete_dgd(NAMESPACE, "llama", "v1beta1") is True
        assert await kube.get_dgd(NAMESPACE, "llama") is None
        assert await kube.delete_dgd(NAMESPACE, "llama", "v1beta1") is False


async def test_errors_are_named_with_status_and_reason() -> None:
    async with kube_emulator() as (emulator, _, kube):
        await kube.create_dgd(dgd("llama"))
        with pytest.raises(KubeConflict) as conflict:
            await kube.create_dgd(dgd("llama"))
        assert conflict.value.status == 409

        with pytest.raises(KubeNotFound) as missing:
            await kube.patch_dgd(NAMESPACE, "ghost", {"spec": {}}, "v1beta1")
        assert missing.value.status == 404

        # kmock never fails on its own: script a server error for one object.
        (
            emulator[kmock.action.FETCH, resource(DGD), kmock.name("sick")]
            << 500
            << status_body(500, "InternalError", "etcd is sad")
        )
        with pytest.raises(KubeError) as failed:
            await kube.get_dgd(NAMESPACE, "sick")
        assert (failed.value.status, failed.value.reason) == (500, "InternalError")
        assert "etcd is sad" in str(failed.value)
        assert not isinstance(failed.value, KubeNotFound | KubeConflict)


async def test_an_unreachable_server_is_a_kube_error() -> None:
    async with kube_emulator() as (_, server, _):
        url = str(server.url)
    # The emulator is gone: nothing listens on its port any more.
    async with Kube(host=url, request_timeout=5) as kube:
        with pytest.raises(KubeError) as e:
            await kube.get_dgd(NAMESPACE, "llama")
    assert e.value.status == 0


async def test_kube_from_a_kubeconfig_file(tmp_path: Path) -> None:
    async with kube_emulator() as (_, server, kube):
        await kube.create_dgd(dgd("llama"))
        kubeconfig = write_kubeconfig(tmp_path / "config", str(server.url))
        async with Kube(kubeconfig=kubeconfig) as from_file:
            assert await from_file.get_dgd(NAMESPACE, "llama") is not None


# --- the informer --------------------------------------------------------------------------------


async def test_informer_lists_then_watches_changes() -> None:
    async with kube_emulator() as (emulator, _, kube):
        a, b = dgd("a"), dgd("b")
        await kube.create_dgd(a)
        await kube.create_dgd(b)

        async with kube.informer(DGD, NAMESPACE) as changes:
            assert sorted(names(await until_synced(changes))) == [("ADDED", "a"), ("ADDED", "b")]

            c = dgd("c")
            await cluster_create(emulator, DGD, c)
            assert names([await next_change(changes)]) == [("ADDED", "c")]
            await cluster_patch(emulator, DGD, c, {"spec": {"replicas": 2}})
            modified = await next_change(changes)
            assert (modified.type, modified.obj["spec"]["replicas"]) == ("MODIFIED", 2)
            await cluster_delete(emulator, DGD, a)
            assert names([await next_change(changes)]) == [("DELETED", "a")]
            assert set(changes.objects) == {(NAMESPACE, "b"), (NAMESPACE, "c")}

        assert len(requests(emulator, LIST, DGD)) == 1
        [watched] = requests(emulator, WATCH, DGD)
        # kmock only recognises the lower-case spelling; a real server accepts it as well.
        assert watched.params["watch"] == "true"
        assert watched.params["allowWatchBookmarks"] == "true"
        assert watched.params["resourceVersion"] == "2"  # the list's: after two writes
        assert all("True" not in r.params.values() for r in emulator)


BOOKMARK = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}}


@pytest.mark.parametrize(
    ("ending", "resumes_at"),
    [
        # A clean end (a server-side timeout does this): the bookmark before it counts.
        ("closed", "13"),
        # kmock renders a failing stream as an ERROR event with code 500.
        ("error-event", "13"),
        # The connection is cut mid-stream (reset by the server).
        ("dropped", "12"),
    ],
)
async def test_informer_rewatches_from_the_last_resource_version(
    ending: str, resumes_at: str
) -> None:
    async with kube_emulator(revisions=False) as (emulator, _, kube):
        await kube.create_dgd(dgd("a"))
        b = dgd("b")
        b["metadata"]["resourceVersion"] = "12"
        # kmock's watches never end, and these carry resourceVersions of the test's choosing
        # (the emulator gives none): script the first one. It
        # sends b, waits until the test has seen b (so nothing is lost in the socket when the
        # connection is cut), then ends its own way.
        seen_b = asyncio.Event()

        async def gate() -> None:  # streams nothing itself
            await seen_b.wait()

        tail = {
            "closed": (BOOKMARK,),
            "error-event": (BOOKMARK, RuntimeError("stream broke")),
            "dropped": (lambda request: request._raw_request.transport.abort(),),
        }[ending]
        emulator[WATCH, resource(DGD)][:1] << ({"type": "ADDED", "object": b}, gate, *tail)

        async with kube.informer(DGD, NAMESPACE) as changes:
            assert names(await until_synced(changes)) == [("ADDED", "a")]
            await cluster_create(emulator, DGD, b)  # stored, but the scripted watch reports it
            assert names([await next_change(changes)]) == [("ADDED", "b")]
            seen_b.set()

            pending = asyncio.create_task(next_change(changes))
            await wait_until(lambda: len(requests(emulator, WATCH, DGD)) == 2)
            await cluster_create(emulator, DGD, dgd("c"))
            # Nothing repeats: kmock replays a and b on the new watch, but neither changed.
            assert names([await pending]) == [("ADDED", "c")]

        _, second = requests(emulator, WATCH, DGD)
        assert second.params["resourceVersion"] == resumes_at
        assert len(requests(emulator, LIST, DGD)) == 1


@pytest.mark.parametrize("gone", ["http-status", "error-event"])
async def test_informer_relists_on_410_and_reports_what_vanished(gone: str) -> None:
    async with kube_emulator() as (emulator, _, kube):
        a, b = dgd("a"), dgd("b")
        await kube.create_dgd(a)
        await kube.create_dgd(b)
        expired = status_body(410, "Expired", "too old resource version: 1 (500)")
        # kmock never expires a resourceVersion: script the first watch's answer.
        watch = emulator[WATCH, resource(DGD)][:1]
        if gone == "http-status":
            watch << 410 << expired
        else:
            watch << ({"type": "ERROR", "object": expired},)

        async with kube.informer(DGD, NAMESPACE) as changes:
            assert len(await until_synced(changes)) == 2
            # Deleted while the informer cannot see it: its first watch is the scripted one.
            await cluster_delete(emulator, DGD, b)
            await cluster_patch(emulator, DGD, a, {"spec": {"replicas": 4}})
            relisted = await until_synced(changes)
            assert sorted(names(relisted)) == [("DELETED", "b"), ("MODIFIED", "a")]
            assert set(changes.objects) == {(NAMESPACE, "a")}

            await cluster_create(emulator, DGD, dgd("c"))
            assert names([await next_change(changes)]) == [("ADDED", "c")]

        assert len(requests(emulator, LIST, DGD)) == 2


async def test_informer_retries_a_failing_list() -> None:
    async with kube_emulator() as (emulator, _, kube):
        await kube.create_dgd(dgd("a"))
        emulator[LIST, resource(DGD)][:2] << 503 << status_body(503, "ServiceUnavailable")
        async with kube.informer(DGD, NAMESPACE) as changes:
            assert names(await until_synced(changes)) == [("ADDED", "a")]
        assert len(requests(emulator, LIST, DGD)) == 3


async def test_informer_filters_by_label_selector() -> None:
    async with kube_emulator() as (emulator, _, kube):
        x, y = dgd("x", labels={"app": "x"}), dgd("y", labels={"app": "y"})
        await kube.create_dgd(x)
        await kube.create_dgd(y)

        async with kube.informer(DGD, NAMESPACE, label_selector="app=x") as changes:
            assert names(await until_synced(changes)) == [("ADDED", "x")]
            await cluster_patch(emulator, DGD, y, {"metadata": {"labels": {"app": "x"}}})
            assert names([await next_change(changes)]) == [("ADDED", "y")]
            # Leaving the selector reads as a deletion, as a real server's filtered watch says.
            await cluster_patch(emulator, DGD, x, {"metadata": {"labels": {"app": "z"}}})
            assert names([await next_change(changes)]) == [("DELETED", "x")]
            await cluster_create(emulator, DGD, dgd("other", labels={"app": "y"}))
            await cluster_create(emulator, DGD, dgd("mine", labels={"app": "x"}))
            assert names([await next_change(changes)]) == [("ADDED", "mine")]

        [listed] = requests(emulator, LIST, DGD)
        assert listed.params["labelSelector"] == "app=x"  # the server is asked to filter too


async def test_informer_reports_a_missing_crd() -> None:
    async with kube_emulator(kinds=["dgd/v1beta1", "pod", "node"]) as (_, _, kube):
        async with kube.informer("dgd/v1alpha1", NAMESPACE) as changes:
            with pytest.raises(KindNotServed, match="CRD"):
                await next_change(changes)
        with pytest.raises(KindNotServed, match=r"dynamographdeployments\.nvidia\.com/v1alpha1"):
            await kube.list_objects("dgd/v1alpha1")


async def test_pods_by_namespace_and_nodes_for_inventory() -> None:
    async with kube_emulator() as (emulator, _, kube):
        h100, l4 = node("n1"), node("n2", product="NVIDIA-L4", gpus=4)
        await cluster_create(emulator, "node", h100)
        await cluster_create(emulator, "node", l4)
        await cluster_create(emulator, "pod", pod("p1", node="n1", labels={"role": "worker"}))
        await cluster_create(emulator, "pod", pod("p2", "other", labels={"role": "worker"}))

        assert {n["metadata"]["name"] for n in await kube.list_nodes()} == {"n1", "n2"}
        l4_only = await kube.list_nodes("nvidia.com/gpu.product=NVIDIA-L4")
        assert [n["metadata"]["name"] for n in l4_only] == ["n2"]

        async with kube.informer("node") as nodes:
            assert sorted(names(await until_synced(nodes))) == [("ADDED", "n1"), ("ADDED", "n2")]
            await cluster_delete(emulator, "node", l4)
            assert names([await next_change(nodes)]) == [("DELETED", "n2")]

        async with kube.informer("pod", NAMESPACE, label_selector="role=worker") as pods:
            assert names(await until_synced(pods)) == [("ADDED", "p1")]
            await cluster_create(emulator, "pod", pod("p3", "other", labels={"role": "worker"}))
            await cluster_create(emulator, "pod", pod("p4", labels={"role": "worker"}))
            assert names([await next_change(pods)]) == [("ADDED", "p4")]


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=x", {"app": "x"}, True),
        ("app==x", {"app": "y"}, False),
        ("app!=x", {}, True),
        ("app in (x, y),tier", {"app": "y", "tier": "1"}, True),
        ("app notin (x,y)", {"app": "y"}, False),
        ("!canary", {"canary": "1"}, False),
        ("wingsmith.dev/managed-by=wingsmith", {"wingsmith.dev/managed-by": "wingsmith"}, True),
        ("", {"anything": "1"}, True),
    ],
)
def test_label_selector_matching(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert matcher(selector)({"metadata": {"labels": labels}}) is expected


def test_an_unsupported_selector_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        matcher("app=(x")


async def test_an_informer_started_from_what_was_known_reports_what_went_meanwhile() -> None:
    async with kube_emulator() as (emulator, _, kube):
        await cluster_create(emulator, DGD, dgd("kept"))
        async with kube.informer(DGD) as first:
            seen = {
                (NAMESPACE, c.obj["metadata"]["name"]): c.obj for c in await until_synced(first)
            }
        await cluster_create(emulator, DGD, dgd("gone"))
        async with kube.informer(DGD) as second:  # what another informer saw, "gone" included
            seen |= {
                (NAMESPACE, c.obj["metadata"]["name"]): c.obj for c in await until_synced(second)
            }
        await cluster_delete(emulator, DGD, dgd("gone"))  # while nobody watches
        async with kube.informer(DGD, known=seen) as again:
            assert names(await until_synced(again)) == [("DELETED", "gone")]  # "kept" is no news


def test_the_informers_wait_doubles_up_to_the_cap_with_at_most_half_a_first_delay_of_jitter() -> (
    None
):
    kube = Kube(host="http://127.0.0.1:1", backoff=(0.2, 5.0))
    for failures, plain in [(0, 0.2), (1, 0.2), (2, 0.4), (3, 0.8), (6, 5.0), (60, 5.0)]:
        for _ in range(20):
            assert plain <= kube._delay(failures) <= min(5.0, plain + 0.1)


# --- server-side apply, refusals, scaling adapters, served versions ------------------------


async def test_server_side_apply_creates_then_removes_what_it_stops_applying() -> None:
    async with kube_emulator() as (emulator, _, kube):
        body = dgd("llama", labels={"a": "1", "b": "2"})
        created = await kube.apply_dgd(body, force=True)
        assert created["metadata"]["labels"] == {"a": "1", "b": "2"}
        # another manager's field
        await cluster_patch(emulator, DGD, body, {"metadata": {"labels": {"theirs": "x"}}})
        again = dgd("llama", labels={"a": "1"})
        applied = await kube.apply_dgd(again, force=True)
        assert applied["metadata"]["labels"] == {"a": "1", "theirs": "x"}

        first, second = requests(emulator, UPDATE, DGD)
        for sent in (first, second):
            assert sent.headers["Content-Type"] == "application/apply-patch+yaml"
            assert (sent.params["fieldManager"], sent.params["force"]) == ("wingsmith", "true")


async def test_a_webhook_refusal_is_a_permanent_error_with_the_servers_message() -> None:
    async with kube_emulator() as (_, _, kube):
        spec = {"backendFramework": "vllm", "components": [{"name": "w", "type": "worker"}]}
        await kube.apply_dgd(dgd("llama", spec=spec), force=True)
        changed = {"backendFramework": "sglang", "components": [{"name": "w", "type": "worker"}]}
        with pytest.raises(KubeError) as refused:
            await kube.apply_dgd(dgd("llama", spec=changed), force=True)
        assert refused.value.status == 422 and refused.value.permanent
        assert "backendFramework: Forbidden" in refused.value.message
        assert "denied the request" in refused.value.message


@pytest.mark.parametrize(
    ("status", "permanent"),
    [
        (400, True),
        (403, True),
        (404, True),
        (422, True),
        (408, False),
        (409, False),
        (429, False),
        (500, False),
        (503, False),
        (0, False),
    ],
)
def test_which_errors_are_permanent(status: int, permanent: bool) -> None:
    assert KubeError(status, "X").permanent is permanent


async def test_a_scaling_adapter_is_scaled_through_its_scale_subresource() -> None:
    async with kube_emulator() as (emulator, _, kube):
        adapter = {
            "apiVersion": "nvidia.com/v1beta1",
            "kind": "DynamoGraphDeploymentScalingAdapter",
            "metadata": {"name": "qwen-worker", "namespace": NAMESPACE},
            "spec": {"replicas": 1, "dgdRef": {"name": "qwen", "componentName": "Worker"}},
        }
        path = f"/apis/nvidia.com/v1beta1/namespaces/{NAMESPACE}/"
        async with emulator.post(path + "dynamographdeploymentscalingadapters", json=adapter):
            pass
        await kube.scale_adapter(NAMESPACE, "qwen-worker", 4, "v1beta1")
        [sent] = [r for r in emulator if r.method.value == "PATCH"]
        assert sent.subresource == "scale" and sent.data == {"spec": {"replicas": 4}}


async def test_which_dgd_versions_are_served() -> None:
    async with kube_emulator(kinds=["dgd/v1alpha1", "pod", "node"]) as (_, _, kube):
        assert await kube.serves("dgd/v1alpha1")
        assert not await kube.serves("dgd/v1beta1")
