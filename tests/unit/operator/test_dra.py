"""Which devices a pod holds, and a node has, under Dynamic Resource Allocation (pure): given the
pods, ResourceClaims and ResourceSlices as an API server returns them, in each served version of
resource.k8s.io, when they are joined, then each pod holds the devices of the claims reserved
for it or named in its status, named by their UUIDs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.dra_objects import (
    NAMESPACE,
    NVIDIA,
    VERSIONS,
    Gpu,
    as_listed,
    claim_pod,
    resource_claim,
    resource_slice,
    uid_of,
)
from wingsmith.services.operator.dra import DraDevices, Oddity, dra_devices

Obj = dict[str, Any]
versions = pytest.mark.parametrize("version", VERSIONS)

H100 = [Gpu("gpu-0", "GPU-aaaa0000"), Gpu("gpu-1", "GPU-aaaa0001"), Gpu("gpu-2", "GPU-aaaa0002")]


def node_slice(version: str, node: str = "n1", devices: list[Gpu] = H100, **kw: Any) -> Obj:
    return resource_slice(f"{node}-gpu.nvidia.com-x", devices, version=version, node=node, **kw)


def oddities(devices: DraDevices) -> list[tuple[str, str, Oddity]]:
    return [(s.kind, s.name, s.oddity) for s in devices.skipped]


# --- which claims a pod holds ------------------------------------------------------------------


@versions
def test_a_pod_holds_the_uuids_allocated_to_the_claim_made_for_it(version: str) -> None:
    worker = claim_pod("worker-0", generated="worker-0-gpus-7xk2p")
    claim = resource_claim(
        "worker-0-gpus-7xk2p",
        version=version,
        allocated=[("n1", "gpu-0"), ("n1", "gpu-2")],
        reserved_for=[worker],
        owner=worker,
    )

    devices = dra_devices([worker], [claim], [node_slice(version)])

    assert devices.by_pod == {(NAMESPACE, "worker-0"): ("GPU-aaaa0000", "GPU-aaaa0002")}
    assert devices.allocated == {"n1": frozenset({"GPU-aaaa0000", "GPU-aaaa0002"})}
    assert devices.skipped == ()


@versions
def test_list_items_without_api_version_and_kind_read_the_same(version: str) -> None:
    worker = claim_pod("worker-0", generated="c")
    claim = resource_claim("c", version=version, allocated=[("n1", "gpu-1")], reserved_for=[worker])

    listed = dra_devices([as_listed(worker)], [as_listed(claim)], [as_listed(node_slice(version))])

    assert listed.by_pod == {(NAMESPACE, "worker-0"): ("GPU-aaaa0001",)}


@versions
def test_a_device_without_a_uuid_is_named_by_driver_pool_and_device(version: str) -> None:
    mig = Gpu("gpu-0-mig-1g10gb-19-0", None, type="mig")
    worker = claim_pod("worker-0", generated="c")
    claim = resource_claim(
        "c", version=version, allocated=[("n1", mig.name)], reserved_for=[worker]
    )

    devices = dra_devices([worker], [claim], [node_slice(version, devices=[mig])])

    fallback = "gpu.nvidia.com/n1/gpu-0-mig-1g10gb-19-0"
    assert devices.by_pod == {(NAMESPACE, "worker-0"): (fallback,)}
    [published] = devices.published["n1"].values()
    assert (published.id, published.type) == (fallback, "mig")
    assert devices.skipped == ()  # no uuid is no oddity: other drivers publish none


@versions
def test_a_mig_device_is_named_by_its_own_uuid(version: str) -> None:
    mig = Gpu("gpu-0-mig-1g10gb-19-0", "MIG-5c89c1a0-0000", type="mig")
    worker = claim_pod("worker-0", generated="c")
    claim = resource_claim(
        "c", version=version, allocated=[("n1", mig.name)], reserved_for=[worker]
    )

    devices = dra_devices([worker], [claim], [node_slice(version, devices=[mig])])

    assert devices.by_pod == {(NAMESPACE, "worker-0"): ("MIG-5c89c1a0-0000",)}


@versions
def test_a_fully_qualified_uuid_attribute_counts_as_the_drivers_own(version: str) -> None:
    s = node_slice(version, devices=[Gpu("gpu-0")])
    device = s["spec"]["devices"][0]
    fields = device["basic"] if version == "v1beta1" else device
    fields["attributes"]["gpu.nvidia.com/uuid"] = {"string": "GPU-qualified"}
    worker = claim_pod("worker-0", generated="c")
    claim = resource_claim("c", version=version, allocated=[("n1", "gpu-0")], reserved_for=[worker])

    assert dra_devices([worker], [claim], [s]).by_pod == {
        (NAMESPACE, "worker-0"): ("GPU-qualified",)
    }


@versions
def test_a_claim_several_pods_share_gives_its_devices_to_each(version: str) -> None:
    a, b = claim_pod("a", shared="team-gpus"), claim_pod("b", shared="team-gpus")
    claim = resource_claim(
        "team-gpus", version=version, allocated=[("n1", "gpu-1")], reserved_for=[a, b]
    )

    devices = dra_devices([a, b], [claim], [node_slice(version)])

    assert devices.by_pod == {
        (NAMESPACE, "a"): ("GPU-aaaa0001",),
        (NAMESPACE, "b"): ("GPU-aaaa0001",),
    }
    assert devices.held_outside([(NAMESPACE, "a")]) == {}  # shared with ours: ours


@versions
def test_a_claim_allocated_but_not_yet_reserved(version: str) -> None:
    # made for the pod from a template: its status names it, so the devices are the pod's
    mine = claim_pod("worker-0", generated="worker-0-gpus")
    generated = resource_claim("worker-0-gpus", version=version, allocated=[("n1", "gpu-0")])
    # named only in another pod's spec: not the pod's until reserved for it
    other = claim_pod("other", shared="loose")
    loose = resource_claim("loose", version=version, allocated=[("n1", "gpu-1")])

    devices = dra_devices([mine, other], [generated, loose], [node_slice(version)])

    assert devices.by_pod == {(NAMESPACE, "worker-0"): ("GPU-aaaa0000",)}
    # yet allocated is allocated: no other claim can have it, so it is held, if not by ours
    assert devices.allocated == {"n1": frozenset({"GPU-aaaa0000", "GPU-aaaa0001"})}
    assert devices.held_outside([(NAMESPACE, "worker-0")]) == {"n1": frozenset({"GPU-aaaa0001"})}


@versions
def test_a_reservation_for_an_earlier_pod_of_the_same_name_does_not_count(version: str) -> None:
    earlier = claim_pod("worker-0", shared="c", uid=uid_of("the earlier worker-0"))
    now = claim_pod("worker-0", shared="c")
    claim = resource_claim(
        "c", version=version, allocated=[("n1", "gpu-0")], reserved_for=[earlier]
    )

    devices = dra_devices([now], [claim], [node_slice(version)])

    assert devices.by_pod == {}
    assert devices.held_outside([(NAMESPACE, "worker-0")]) == {"n1": frozenset({"GPU-aaaa0000"})}


@versions
def test_a_claim_reserved_for_others_gives_this_pod_nothing(version: str) -> None:
    mine, theirs = claim_pod("mine"), claim_pod("theirs", shared="c")
    claim = resource_claim("c", version=version, allocated=[("n1", "gpu-2")], reserved_for=[theirs])
    # a consumer that is not a pod (a workload's PodGroup) does not make a pod of the same name
    claim["status"]["reservedFor"].append(
        {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "mine", "uid": "x"}
    )

    devices = dra_devices([mine, theirs], [claim], [node_slice(version)])

    assert devices.by_pod == {(NAMESPACE, "theirs"): ("GPU-aaaa0002",)}
    assert devices.held_outside([(NAMESPACE, "mine")]) == {"n1": frozenset({"GPU-aaaa0002"})}


@versions
def test_a_claim_in_another_namespace_is_not_the_pods(version: str) -> None:
    worker = claim_pod("worker-0", generated="c")
    elsewhere = resource_claim("c", "other", version=version, allocated=[("n1", "gpu-0")])

    assert dra_devices([worker], [elsewhere], [node_slice(version)]).by_pod == {}


@versions
def test_admin_access_holds_no_device(version: str) -> None:
    monitor = claim_pod("dcgm", "monitoring", shared="all-gpus")
    claim = resource_claim(
        "all-gpus",
        "monitoring",
        version=version,
        allocated=[("n1", "gpu-0"), ("n1", "gpu-1")],
        reserved_for=[monitor],
        admin_access=True,
    )

    devices = dra_devices([monitor], [claim], [node_slice(version)])

    assert (devices.by_pod, devices.allocated) == ({}, {})


# --- drivers, pools, generations, nodes --------------------------------------------------------


@versions
def test_only_the_drivers_asked_about_are_read(version: str) -> None:
    nic = resource_slice(
        "n1-nic",
        [Gpu("eth1", "NIC-1", type="nic")],
        version=version,
        node="n1",
        driver="nic.example",
    )
    worker = claim_pod("worker-0", generated="c")
    claim = resource_claim(
        "c",
        version=version,
        allocated=[("n1", "eth1")],
        reserved_for=[worker],
        driver="nic.example",
    )

    assert dra_devices([worker], [claim], [node_slice(version), nic]).by_pod == {}
    both = dra_devices(
        [worker], [claim], [node_slice(version), nic], drivers={NVIDIA, "nic.example"}
    )
    assert both.by_pod == {(NAMESPACE, "worker-0"): ("NIC-1",)}
    assert set(both.published["n1"]) == {"GPU-aaaa0000", "GPU-aaaa0001", "GPU-aaaa0002", "NIC-1"}


@versions
def test_only_the_newest_generation_of_a_pool_counts(version: str) -> None:
    old = node_slice(version, devices=[Gpu("gpu-0", "GPU-old0"), Gpu("gpu-9", "GPU-old9")])
    new = node_slice(version, devices=[Gpu("gpu-0", "GPU-new0")], generation=2)
    new["metadata"]["name"] = "n1-gpu.nvidia.com-y"
    worker = claim_pod("worker-0", generated="c")
    claim = resource_claim(
        "c", version=version, allocated=[("n1", "gpu-0"), ("n1", "gpu-9")], reserved_for=[worker]
    )

    devices = dra_devices([worker], [claim], [old, new])

    assert set(devices.published["n1"]) == {"GPU-new0"}
    # gpu-9 is gone from the pool: named by its place, and said
    assert devices.by_pod == {(NAMESPACE, "worker-0"): ("GPU-new0", "gpu.nvidia.com/n1/gpu-9")}
    assert oddities(devices) == [("ResourceClaim", "c", Oddity.UNPUBLISHED_DEVICE)]
    # its node is still known, from the pod that holds it
    assert devices.allocated == {"n1": frozenset({"GPU-new0", "gpu.nvidia.com/n1/gpu-9"})}


@versions
def test_a_pool_over_several_slices_counts_them_all_and_says_when_one_is_missing(
    version: str,
) -> None:
    first = node_slice(version, devices=H100[:2], slices_in_pool=3)
    second = node_slice(version, devices=H100[2:], slices_in_pool=3)
    second["metadata"]["name"] = "n1-gpu.nvidia.com-y"

    devices = dra_devices([], [], [first, second])

    assert set(devices.published["n1"]) == {"GPU-aaaa0000", "GPU-aaaa0001", "GPU-aaaa0002"}
    [incomplete] = devices.skipped
    assert incomplete.oddity is Oddity.INCOMPLETE_POOL and "2 of 3" in incomplete.detail


@versions
def test_a_device_published_twice_is_counted_once_and_said(version: str) -> None:
    first = node_slice(version, devices=H100[:1], slices_in_pool=2)
    again = node_slice(version, devices=H100[:1], slices_in_pool=2)
    again["metadata"]["name"] = "n1-gpu.nvidia.com-y"

    devices = dra_devices([], [], [first, again])

    assert list(devices.published["n1"]) == ["GPU-aaaa0000"]
    assert oddities(devices) == [("ResourceSlice", "n1-gpu.nvidia.com-y", Oddity.DUPLICATE_DEVICE)]


@versions
def test_per_device_nodes_and_pools_for_every_node(version: str) -> None:
    spread = resource_slice(
        "rack-a",
        [Gpu("gpu-0", "GPU-on-n2", node="n2"), Gpu("gpu-1", "GPU-on-n3", node="n3")],
        version=version,
        pool="rack-a",
    )
    network = resource_slice("fabric", [Gpu("gpu-7", "GPU-anywhere")], version=version, pool="f")

    devices = dra_devices([], [], [spread, network])

    assert {node: set(ids) for node, ids in devices.published.items()} == {
        "n2": {"GPU-on-n2"},
        "n3": {"GPU-on-n3"},
    }  # a device for any node is on none of them


@versions
def test_published_devices_say_what_they_are(version: str) -> None:
    devices = dra_devices([], [], [node_slice(version, devices=H100[:1])])

    [gpu] = devices.published["n1"].values()
    assert (gpu.id, gpu.driver, gpu.pool, gpu.name, gpu.node, gpu.type) == (
        "GPU-aaaa0000",
        NVIDIA,
        "n1",
        "gpu-0",
        "n1",
        "gpu",
    )


# --- what the cluster may hold that does not read ----------------------------------------------


def _malformed_variants(version: str) -> list[tuple[str, Obj]]:
    """(what is broken, the broken object): each would raise in a careless reader."""
    pod = claim_pod("bad-pod", generated="c")
    claim = resource_claim("bad-claim", version=version, allocated=[("n1", "gpu-0")])
    s = node_slice(version)
    variants: list[tuple[str, Obj]] = []

    def broken(kind: str, obj: Obj, path: list[Any], value: Any) -> None:
        obj = copy.deepcopy(obj)
        target = obj
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        variants.append((kind, obj))

    broken("pod", pod, ["metadata"], "not a dict")
    broken("pod", pod, ["metadata", "namespace"], None)
    broken("pod", pod, ["status", "resourceClaimStatuses"], {"name": "x"})
    broken("pod", pod, ["status", "resourceClaimStatuses", 0], "junk")
    broken("pod", pod, ["status", "resourceClaimStatuses", 0, "resourceClaimName"], 7)
    broken("claim", claim, ["status"], ["junk"])
    broken("claim", claim, ["status", "allocation", "devices"], 3)
    broken("claim", claim, ["status", "allocation", "devices", "results", 0], None)
    broken("claim", claim, ["status", "allocation", "devices", "results", 0, "pool"], None)
    broken("claim", claim, ["status", "allocation", "devices", "results", 0, "device"], 0)
    broken("claim", claim, ["status", "reservedFor"], [{"resource": "pods", "name": None}])
    broken("claim", claim, ["metadata", "name"], "")
    broken("slice", s, ["spec"], None)
    broken("slice", s, ["spec", "pool", "generation"], "1")
    broken("slice", s, ["spec", "pool", "generation"], True)
    broken("slice", s, ["spec", "driver"], None)
    broken("slice", s, ["spec", "devices"], {"gpu-0": {}})
    broken("slice", s, ["spec", "devices", 0], ["gpu-0"])
    broken("slice", s, ["spec", "devices", 1, "name"], None)
    broken("slice", s, ["spec", "nodeName"], 12)
    return variants


@versions
def test_malformed_objects_are_passed_over_with_a_reason_and_the_rest_still_count(
    version: str,
) -> None:
    worker = claim_pod("worker-0", generated="c")
    good_slice = node_slice(version, node="n2", devices=[Gpu("gpu-0", "GPU-n2")])
    good_claim = resource_claim(
        "c", version=version, allocated=[("n2", "gpu-0")], reserved_for=[worker]
    )
    assert dra_devices([worker], [good_claim], [good_slice]).skipped == ()
    for what, obj in _malformed_variants(version):
        pods = [worker, obj] if what == "pod" else [worker]
        claims = [good_claim, obj] if what == "claim" else [good_claim]
        slices = [good_slice, obj] if what == "slice" else [good_slice]

        devices = dra_devices(pods, claims, slices)

        assert devices.by_pod[(NAMESPACE, "worker-0")] == ("GPU-n2",), (what, obj)
        assert any(s.oddity is Oddity.MALFORMED for s in devices.skipped), (what, obj)
        assert all(str(s) for s in devices.skipped)


def test_what_is_no_object_at_all_is_passed_over_too() -> None:
    junk: list[Any] = [None, 42, "pod", ["a"]]

    devices = dra_devices(junk, junk, junk)

    assert (devices.by_pod, devices.published, devices.allocated) == ({}, {}, {})
    assert [(s.kind, s.name, s.oddity) for s in devices.skipped[:4]] == [
        ("ResourceSlice", "?", Oddity.MALFORMED)
    ] * 4
    assert len(devices.skipped) == 12


@versions
def test_an_attribute_of_the_wrong_type_falls_back_and_is_said(version: str) -> None:
    s = node_slice(version, devices=[Gpu("gpu-0", "GPU-x")])
    device = s["spec"]["devices"][0]
    fields = device["basic"] if version == "v1beta1" else device
    fields["attributes"]["uuid"] = {"int": 5}

    devices = dra_devices([], [], [s])

    assert list(devices.published["n1"]) == ["gpu.nvidia.com/n1/gpu-0"]
    assert [str(x) for x in devices.skipped] == [
        "ResourceSlice n1-gpu.nvidia.com-x: malformed: attribute 'uuid' is not a string: {'int': 5}"
    ]


# --- properties --------------------------------------------------------------------------------

NODES = ("n1", "n2")


@dataclass(frozen=True)
class Cluster:
    """A cluster drawn at random, to be rendered in any version."""

    slices: tuple[tuple[str, str, int, tuple[Gpu, ...]], ...]  # (driver, node, generation, gpus)
    pods: tuple[Obj, ...]
    claims: tuple[tuple[str, str, tuple[tuple[str, str], ...] | None, tuple[Obj, ...]], ...]

    def render(self, version: str) -> tuple[list[Obj], list[Obj], list[Obj]]:
        slices = []
        for i, (driver, node, generation, gpus) in enumerate(self.slices):
            s = resource_slice(
                f"s{i}", gpus, version=version, node=node, generation=generation, driver=driver
            )
            s["spec"]["pool"]["resourceSliceCount"] = sum(
                (d, n, g) == (driver, node, generation) for d, n, g, _ in self.slices
            )
            slices.append(s)
        claims = [
            resource_claim(
                name, version=version, allocated=allocated, reserved_for=reserved, driver=driver
            )
            for name, driver, allocated, reserved in self.claims
        ]
        return list(self.pods), claims, slices


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    device_names = [f"gpu-{i}" for i in range(4)]
    counter = iter(range(10_000))

    def gpu() -> Gpu:
        has_uuid = draw(st.sampled_from((True, True, True, False)))
        return Gpu(
            draw(st.sampled_from(device_names)), f"GPU-{next(counter)}" if has_uuid else None
        )

    drivers = st.sampled_from((NVIDIA, NVIDIA, NVIDIA, "other.example"))  # mostly NVIDIA's
    slices = tuple(
        (
            draw(drivers),
            draw(st.sampled_from(NODES)),
            draw(st.integers(0, 1)),
            tuple(gpu() for _ in range(draw(st.integers(0, 3)))),
        )
        for _ in range(draw(st.integers(0, 5)))
    )
    # mostly devices some slice publishes; sometimes one none does
    published = sorted({(node, g.name) for _, node, _, gpus in slices for g in gpus})
    anywhere = st.tuples(st.sampled_from(NODES), st.sampled_from(device_names))
    places = st.sampled_from(published) if published else anywhere
    places = st.one_of(places, places, places, anywhere)
    claim_names = [f"c{i}" for i in range(draw(st.integers(0, 4)))]
    pods = []
    for i in range(draw(st.integers(0, 4))):
        generated = draw(st.none() | st.sampled_from(claim_names)) if claim_names else None
        pods.append(claim_pod(f"p{i}", node=draw(st.sampled_from(NODES)), generated=generated))
    claims = []
    for name in claim_names:
        allocated = draw(st.none() | st.lists(places, max_size=3))
        reserved = []
        for pod in draw(st.lists(st.sampled_from(pods), max_size=3, unique_by=id)) if pods else []:
            stale = draw(st.booleans())
            reserved.append(claim_pod(pod["metadata"]["name"], uid="stale") if stale else pod)
        driver = draw(drivers)
        claims.append((name, driver, tuple(allocated) if allocated else None, tuple(reserved)))
    return Cluster(slices, tuple(pods), tuple(claims))


def _linked(pod: Obj, claim: Obj) -> bool:
    """The rule, said the slow way: the pod's status names the claim, or the claim is reserved
    for this very pod (its name and uid)."""
    named = {s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses", ())}
    reserved = {
        (r["name"], r["uid"])
        for r in claim["status"].get("reservedFor", ())
        if r["resource"] == "pods"
    }
    meta = pod["metadata"]
    return claim["metadata"]["name"] in named or (meta["name"], meta["uid"]) in reserved


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_a_pod_gets_only_devices_of_claims_linked_to_it_named_as_published(c: Cluster) -> None:
    pods, claims, slices = c.render("v1")

    devices = dra_devices(pods, claims, slices)

    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        pool = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[pool] = max(newest.get(pool, -1), s["spec"]["pool"]["generation"])
    published_uuids = {
        d["attributes"]["uuid"]["string"]
        for s in slices
        if s["spec"]["driver"] == NVIDIA
        and s["spec"]["pool"]["generation"] == newest[(NVIDIA, s["spec"]["pool"]["name"])]
        for d in s["spec"]["devices"]
        if "uuid" in d["attributes"]
    }
    for pod in pods:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        allowed_places = {
            f"{r['driver']}/{r['pool']}/{r['device']}"
            for claim in claims
            if _linked(pod, claim)
            for r in (claim["status"].get("allocation") or {"devices": {"results": []}})["devices"][
                "results"
            ]
            if r["driver"] == NVIDIA
        }
        for device_id in devices.by_pod.get(key, ()):
            # a published UUID (of the newest generation) or the place of a device it was given
            assert device_id in published_uuids or device_id in allowed_places
        # and as many devices as its claims were given (UUIDs are unique per device here)
        assert len(devices.by_pod.get(key, ())) == len(allowed_places)
    for ids in devices.by_pod.values():
        assert list(ids) == sorted(set(ids))
    assert all(s.oddity is not Oddity.MALFORMED for s in devices.skipped)


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_every_version_of_the_same_cluster_reads_the_same(c: Cluster) -> None:
    results = [dra_devices(*c.render(version)) for version in VERSIONS]

    assert results[1] == results[0] and results[2] == results[0]


JUNK = st.sampled_from([None, 0, -1, True, "", "x", [], {}, [None], {"string": 5}])


def _corrupt(obj: Any, data: st.DataObject) -> Any:
    """The object with one value somewhere inside it replaced by junk."""
    if isinstance(obj, dict) and obj and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(obj)))
        return {**obj, key: _corrupt(obj[key], data)}
    if isinstance(obj, list) and obj and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(obj) - 1))
        return [*obj[:i], _corrupt(obj[i], data), *obj[i + 1 :]]
    return data.draw(JUNK)


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sampled_from(VERSIONS), st.data())
def test_nothing_the_cluster_holds_makes_it_raise(
    c: Cluster, version: str, data: st.DataObject
) -> None:
    pods, claims, slices = c.render(version)
    lists = [pods, claims, slices]
    for _ in range(data.draw(st.integers(1, 4))):
        which = data.draw(st.sampled_from([lst for lst in lists if lst] or [pods]))
        if which:
            i = data.draw(st.integers(0, len(which) - 1))
            which[i] = _corrupt(which[i], data)

    devices = dra_devices(pods, claims, slices)

    for ids in devices.by_pod.values():
        assert all(isinstance(i, str) and i for i in ids)
    for node, published in devices.published.items():
        assert isinstance(node, str) and all(d.id == key for key, d in published.items())
