"""Dynamic Resource Allocation through the Kubernetes adapter, against kmock over real HTTP with
the real kubernetes_asyncio client: which version of resource.k8s.io a cluster serves (none on a
cluster without DRA), and informers that list and watch ResourceClaims and ResourceSlices, whose
objects then say which GPUs each pod holds."""

from __future__ import annotations

from collections.abc import Mapping

import kmock
import pytest

from tests.dra_objects import (
    Gpu,
    claim_pod,
    resource_claim,
    resource_slice,
)
from tests.integration.kube_fixtures import (
    NAMESPACE,
    cluster_create,
    cluster_delete,
    cluster_patch,
    kube_emulator,
    names,
    next_change,
    requests,
    status_body,
    until_synced,
)
from wingsmith.adapters.kube import DRA_KINDS, Kind, KubeError, served_dra
from wingsmith.services.operator.dra import dra_devices

LIST = kmock.action.LIST
H100 = [Gpu("gpu-0", "GPU-0f1e"), Gpu("gpu-1", "GPU-1f2e")]


def dra_kinds(*versions: str) -> list[Kind]:
    kinds: list[Kind] = ["pod", "node"]
    for version in versions:
        kinds += [DRA_KINDS[version].claims, DRA_KINDS[version].slices]
    return kinds


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        (("v1", "v1beta2", "v1beta1"), "v1"),
        (("v1beta2", "v1beta1"), "v1beta2"),  # Kubernetes 1.33 with both betas enabled
        (("v1beta1",), "v1beta1"),  # 1.32
    ],
)
async def test_the_newest_dra_version_served_is_chosen(
    served: tuple[str, ...], chosen: str
) -> None:
    async with kube_emulator(dra_kinds(*served)) as (emulator, _, kube):
        assert await served_dra(kube) == DRA_KINDS[chosen]
        # asked of discovery, which needs no RBAC, not by listing; newest first
        asked = [r.url.path for r in emulator]
        newer = ("v1", "v1beta2", "v1beta1")[: ("v1", "v1beta2", "v1beta1").index(chosen) + 1]
        assert asked == [f"/apis/resource.k8s.io/{v}" for v in newer]


async def test_a_cluster_without_resource_k8s_io_is_not_a_dra_cluster() -> None:
    async with kube_emulator(["pod", "node", "dgd/v1beta1"]) as (emulator, _, kube):
        assert await served_dra(kube) is None
        asked = [r.url.path for r in emulator]
        assert asked == [f"/apis/resource.k8s.io/{v}" for v in ("v1", "v1beta2", "v1beta1")]


async def test_a_version_serving_only_one_of_the_two_kinds_is_passed_over() -> None:
    kinds: list[Kind] = ["pod", "resourceslice/v1", *dra_kinds("v1beta1")]
    async with kube_emulator(kinds) as (_, _, kube):
        assert await served_dra(kube) == DRA_KINDS["v1beta1"]


async def test_a_failing_discovery_is_an_error_not_a_no() -> None:
    async with kube_emulator(dra_kinds("v1")) as (emulator, _, kube):
        emulator["get /apis/resource.k8s.io/v1"][:1] << 503 << status_body(503, "Unavailable")
        with pytest.raises(KubeError) as failed:
            await served_dra(kube)
        assert failed.value.status == 503
        assert await served_dra(kube) == DRA_KINDS["v1"]  # answered the next time


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_informers_list_and_watch_claims_and_slices_whose_devices_pods_then_hold(
    version: str,
) -> None:
    async with kube_emulator(dra_kinds(version)) as (emulator, _, kube):
        kinds = await served_dra(kube)
        assert kinds is not None and kinds.version == version
        worker = claim_pod("worker-0", generated="worker-0-gpus-7xk2p")
        await cluster_create(emulator, "pod", worker)
        gpus = resource_slice("n1-gpu.nvidia.com-x", H100, version=version, node="n1")
        await cluster_create(emulator, kinds.slices, gpus)
        claim = resource_claim("worker-0-gpus-7xk2p", version=version, owner=worker)
        await cluster_create(emulator, kinds.claims, claim)

        async with (
            kube.informer(kinds.claims) as claims,
            kube.informer(kinds.slices) as slices,
            kube.informer("pod") as pods,
        ):
            assert names(await until_synced(slices)) == [("ADDED", "n1-gpu.nvidia.com-x")]
            assert names(await until_synced(claims)) == [("ADDED", "worker-0-gpus-7xk2p")]
            assert names(await until_synced(pods)) == [("ADDED", "worker-0")]

            def held() -> Mapping[tuple[str, str], tuple[str, ...]]:
                return dra_devices(
                    pods.objects.values(), claims.objects.values(), slices.objects.values()
                ).by_pod

            assert held() == {}  # not allocated yet

            # the scheduler allocates, then reserves, as it writes a claim's status
            allocated = resource_claim(
                "worker-0-gpus-7xk2p",
                version=version,
                owner=worker,
                allocated=[("n1", "gpu-1")],
                reserved_for=[worker],
            )
            await cluster_patch(emulator, kinds.claims, claim, {"status": allocated["status"]})
            modified = await next_change(claims)
            assert modified.type == "MODIFIED"
            assert held() == {(NAMESPACE, "worker-0"): ("GPU-1f2e",)}

            # the driver publishes a new generation of its pool; the old slice goes
            newer = resource_slice(
                "n1-gpu.nvidia.com-y",
                [Gpu("gpu-1", "GPU-1f2e"), Gpu("gpu-2", "GPU-2f3e")],
                version=version,
                node="n1",
                generation=2,
            )
            await cluster_create(emulator, kinds.slices, newer)
            assert names([await next_change(slices)]) == [("ADDED", "n1-gpu.nvidia.com-y")]
            await cluster_delete(emulator, kinds.slices, gpus)
            assert names([await next_change(slices)]) == [("DELETED", "n1-gpu.nvidia.com-x")]
            view = dra_devices(
                pods.objects.values(), claims.objects.values(), slices.objects.values()
            )
            assert set(view.published["n1"]) == {"GPU-1f2e", "GPU-2f3e"}
            assert view.held_outside([(NAMESPACE, "worker-0")]) == {}

            await cluster_delete(emulator, kinds.claims, claim)
            assert names([await next_change(claims)]) == [("DELETED", "worker-0-gpus-7xk2p")]
            assert held() == {}

        # cluster-wide: claims of every namespace, slices (which have none)
        listed = {r.url.path for r in requests(emulator, LIST)}
        assert f"/apis/resource.k8s.io/{version}/resourceclaims" in listed
        assert f"/apis/resource.k8s.io/{version}/resourceslices" in listed
