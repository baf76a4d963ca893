"""Reconcile plans (pure) and the executor's zero-write rule, with a fake cluster at the `Kube`
seam that records every write."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.kube_fixtures import ssa
from wingsmith.services.operator.backends.kube import KubeBackend
from wingsmith.services.operator.dgd import render_dgd
from wingsmith.services.operator.inspect import inspect_dgd, load_manifest
from wingsmith.services.operator.plan import APPLIED_ANNOTATION, FOREIGN, plan, stamped

NS = "wingsmith"
SERVING = {
    "model": "m",
    "backend": "vllm",
    "engine_version": "0.4.1",
    "devices_per_replica": 2,
    "parallelism": {"tensor": 2},
}


def desired(**changes: Any) -> dict[str, Any]:
    return {
        "deployment_id": "chat--east",
        "workload_id": "chat",
        "cluster_id": "east",
        "project": "p",
        "device_class": "H100",
        "generation": 1,
        "serving": SERVING,
        "serving_digest": "svg_0000000000000001",
        "engine_args": [],
        "replicas": 2,
        "enabled": True,
        "authority": "managed",
        "adopted": None,
    } | changes


def adopted_dgd(replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "qwen", "namespace": "serving", "resourceVersion": "7"},
        "spec": {
            "components": [
                {"name": "Frontend", "type": "frontend", "replicas": 1},
                {"name": "Worker", "type": "worker", "replicas": replicas},
            ]
        },
    }


def test_no_dgd_is_created_and_a_rendered_one_with_defaults_added_is_up_to_date() -> None:
    assert (
        plan("chat--east", desired(), None, namespace=NS, api_version="nvidia.com/v1beta1").verb
        == "create"
    )
    current = render_dgd(desired(), namespace=NS)
    current["metadata"]["resourceVersion"] = "12"  # what the server adds is no reason to write
    current["spec"]["components"][0]["minAvailable"] = 1
    action = plan("chat--east", desired(), current, namespace=NS, api_version="nvidia.com/v1beta1")
    assert (action.verb, action.why) == (None, "up to date")


def test_a_changed_render_is_applied_and_a_removal_deletes_only_what_we_rendered() -> None:
    current = render_dgd(desired(), namespace=NS)
    action = plan(
        "chat--east", desired(replicas=3), current, namespace=NS, api_version="nvidia.com/v1beta1"
    )
    assert action.verb == "apply" and action.body is not None
    assert action.body["spec"] == render_dgd(desired(replicas=3), namespace=NS)["spec"]
    gone = plan(
        "chat--east",
        None,
        current,
        namespace=NS,
        api_version="nvidia.com/v1beta1",
        previous=desired(),
    )
    assert gone.verb == "delete"
    theirs = adopted_dgd()
    kept = plan(
        "chat--east",
        None,
        theirs,
        namespace=NS,
        api_version="nvidia.com/v1beta1",
        previous=desired(),
    )
    assert kept.verb is None


def test_an_adopted_dgd_only_ever_gets_its_workers_rescaled() -> None:
    ref = {"namespace": "serving", "name": "qwen"}
    same = plan(
        "q", desired(adopted=ref), adopted_dgd(2), namespace=NS, api_version="nvidia.com/v1beta1"
    )
    assert same.verb is None
    scaled = plan(
        "q",
        desired(adopted=ref, replicas=3),
        adopted_dgd(2),
        namespace=NS,
        api_version="nvidia.com/v1beta1",
    )
    assert scaled.verb == "apply" and scaled.body is not None
    # an apply names only what the plane declares: the other fields stay as their owners set them
    assert scaled.body["spec"] == {"components": [{"name": "Worker", "replicas": 3}]}


class FakeKube:
    """A cluster that holds one DGD and records every write."""

    def __init__(self, current: dict[str, Any] | None) -> None:
        self.current = current
        self.writes: list[tuple[str, Any]] = []

    async def get_dgd(self, namespace: str, name: str, version: str = "v1beta1") -> Any:
        return copy.deepcopy(self.current)

    async def create_dgd(self, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("create", body))
        return body

    async def patch_dgd(self, namespace: str, name: str, patch: Any, version: str) -> Any:
        self.writes.append(("patch", patch))
        return patch

    async def apply_dgd(self, body: dict[str, Any], *, force: bool) -> dict[str, Any]:
        self.writes.append(("apply", body))
        return body

    async def scale_adapter(self, namespace: str, name: str, replicas: int, version: str) -> Any:
        self.writes.append(("scale", (name, replicas)))
        return {}

    async def serves(self, kind: str) -> bool:
        return True

    async def delete_dgd(self, namespace: str, name: str, version: str) -> bool:
        self.writes.append(("delete", name))
        return True

    async def create_event(self, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("event", body))
        return body


@settings(max_examples=150, deadline=None)
@given(
    replicas=st.integers(0, 6),
    current_replicas=st.integers(0, 6),
    exists=st.booleans(),
    removed=st.booleans(),
    read_only=st.booleans(),
    observed=st.booleans(),
)
def test_observed_deployments_and_read_only_operators_never_write(
    replicas: int,
    current_replicas: int,
    exists: bool,
    removed: bool,
    read_only: bool,
    observed: bool,
) -> None:
    ref = {"namespace": "serving", "name": "qwen"} if observed else None
    want = desired(replicas=replicas, authority="observed" if observed else "managed", adopted=ref)
    current = (
        (
            adopted_dgd(current_replicas)
            if observed
            else render_dgd(desired(replicas=current_replicas), namespace=NS)
        )
        if exists
        else None
    )
    kube = FakeKube(current)
    backend = KubeBackend(kube, "east", NS, read_only=read_only)  # type: ignore[arg-type]

    async def run() -> None:
        await backend.apply("chat--east", want)
        if removed:
            await backend.apply("chat--east", None)

    asyncio.run(run())
    if read_only or observed:
        assert kube.writes == []
    else:  # the same cluster, managed and writable, is written to whenever it differs
        differs = not exists or current_replicas != replicas or removed
        assert bool(kube.writes) == differs


def with_worker_container(dgd: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    dgd["spec"]["components"][1]["podTemplate"] = {"spec": {"containers": [container]}}
    return dgd


FLAGS = ["--model", "Qwen/Qwen3-8B", "--tensor-parallel-size", "2"]
IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.4.0"


def test_an_adopted_worker_gets_engine_args_only_when_they_differ_from_what_it_runs() -> None:
    ref = {"namespace": "serving", "name": "qwen"}
    container = {
        "name": "main",
        "image": IMAGE,
        "command": ["python3", "-m", "dynamo.vllm"],
        "args": FLAGS,
    }
    current = with_worker_container(adopted_dgd(), container)
    same = plan(
        "q",
        desired(adopted=ref, engine_args=FLAGS),
        current,
        namespace=NS,
        api_version="nvidia.com/v1beta1",
    )
    assert same.verb is None
    more = [*FLAGS, "--max-num-seqs", "64"]
    changed = plan(
        "q",
        desired(adopted=ref, engine_args=more),
        current,
        namespace=NS,
        api_version="nvidia.com/v1beta1",
    )
    assert changed.verb == "apply" and changed.body is not None
    [worker] = changed.body["spec"]["components"]
    [main] = worker["podTemplate"]["spec"]["containers"]
    # the image stays the manifest's own: the apply names only the command line
    assert main == {"name": "main", "command": ["python3", "-m", "dynamo.vllm"], "args": more}


def test_a_shell_command_line_is_never_rewritten() -> None:
    ref = {"namespace": "serving", "name": "qwen"}
    script = "python3 -m dynamo.vllm " + " ".join(FLAGS)
    container = {"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c"], "args": [script]}
    current = with_worker_container(adopted_dgd(), container)
    action = plan(
        "q",
        desired(adopted=ref, engine_args=[]),
        current,
        namespace=NS,
        api_version="nvidia.com/v1beta1",
    )
    assert action.verb is None and "cannot be rewritten" in action.why


FIXTURES = Path(__file__).parent.parent.parent / "fixtures" / "dgd"


def adoptable() -> list[str]:
    """The fixtures with an engine worker to adopt (a frontend-only graph has none)."""
    return sorted(
        p.name
        for p in FIXTURES.glob("*.yaml")
        if inspect_dgd(load_manifest(p.read_text())).primary is not None
    )


@pytest.mark.parametrize("fixture", adoptable())
def test_managing_an_adopted_dgd_as_it_runs_writes_nothing(fixture: str) -> None:
    """The first render after a promotion: the replicas and flags the manifest has."""
    current = load_manifest((FIXTURES / fixture).read_text())
    primary = inspect_dgd(current).primary
    assert primary is not None
    ref = {
        "namespace": current["metadata"].get("namespace", "x"),
        "name": current["metadata"]["name"],
    }
    want = desired(adopted=ref, replicas=primary.replicas, engine_args=list(primary.imported_args))
    action = plan("q", want, current, namespace=NS, api_version="nvidia.com/v1beta1")
    assert action.verb is None, action.why
    if primary.replicas:  # scaling the primary keeps the other workers in proportion
        scaled = plan(
            "q",
            want | {"replicas": primary.replicas * 2},
            current,
            namespace=NS,
            api_version="nvidia.com/v1beta1",
        )
        assert scaled.why == "workers rescaled"
        # workers with a scaling adapter are scaled through it; the rest by an apply
        assert scaled.verb == ("apply" if scaled.body is not None else "patch")
        spec = current["spec"]
        listed = spec.get("components") or list((spec.get("services") or {}).values())
        adapted = [c for c in listed if "scalingAdapter" in c]
        assert len(scaled.scales) == len(adapted)


def test_scaling_an_adopted_disaggregated_graph_down_to_zero_and_back_keeps_its_proportions() -> (
    None
):
    current = load_manifest((FIXTURES / "vllm-disagg-eqflags-v1beta1.yaml").read_text())
    ref = {"namespace": "x", "name": current["metadata"]["name"]}

    def workers(dgd: dict[str, Any]) -> dict[str, int]:
        return {
            c["name"]: c["replicas"]
            for c in dgd["spec"]["components"]
            if c["type"] in {"prefill", "decode"}
        }

    adopted = workers(current)
    primary = inspect_dgd(current).primary
    assert primary is not None
    for replicas in (0, 1, primary.replicas):
        action = plan(
            "q",
            desired(adopted=ref, replicas=replicas, engine_args=list(primary.imported_args)),
            current,
            namespace=NS,
            api_version="nvidia.com/v1beta1",
        )
        assert action.verb == "apply" and action.body is not None
        current = ssa(current, {}, action.body)
    assert workers(current) == adopted


V1BETA1 = "nvidia.com/v1beta1"


def test_a_same_named_dgd_wingsmith_did_not_render_is_refused_not_taken_over() -> None:
    theirs = render_dgd(desired(), namespace=NS)
    del theirs["metadata"]["labels"]["wingsmith.dev/managed-by"]
    action = plan("chat--east", desired(), theirs, namespace=NS, api_version=V1BETA1)
    assert (action.verb, action.refused, action.why) == (None, True, FOREIGN)
    other = render_dgd(desired(), namespace=NS)
    other["metadata"]["annotations"]["wingsmith.dev/deployment-id"] = "chat--west"
    assert plan("chat--east", desired(), other, namespace=NS, api_version=V1BETA1).refused


def test_what_the_webhook_forbids_in_place_is_a_replacement() -> None:
    current = stamped(render_dgd(desired(), namespace=NS))
    disagg = desired(serving=SERVING | {"mode": "disaggregated", "devices_per_replica": 4})
    replaced = plan("chat--east", disagg, current, namespace=NS, api_version=V1BETA1)
    assert (replaced.verb, replaced.why) == ("replace", "its set of components changes")
    sglang = desired(serving=SERVING | {"backend": "sglang"})
    action = plan("chat--east", sglang, current, namespace=NS, api_version=V1BETA1)
    assert (action.verb, action.why) == ("replace", "its backendFramework changes")


def test_a_dgd_applied_from_another_render_is_applied_again_even_when_it_covers_it() -> None:
    """Server-side apply removes what the new render no longer has: the digest tells."""
    current = stamped(render_dgd(desired(), namespace=NS))
    same = plan("chat--east", desired(), current, namespace=NS, api_version=V1BETA1)
    assert same.verb is None
    current["metadata"]["annotations"][APPLIED_ANNOTATION] = "0000000000000000"
    again = plan("chat--east", desired(), current, namespace=NS, api_version=V1BETA1)
    assert again.verb == "apply"


def test_an_adopted_worker_with_a_scaling_adapter_is_scaled_through_it() -> None:
    ref = {"namespace": "serving", "name": "qwen"}
    current = adopted_dgd(2)
    current["spec"]["components"][1]["scalingAdapter"] = {}
    action = plan("q", desired(adopted=ref, replicas=4), current, namespace=NS, api_version=V1BETA1)
    assert (action.verb, action.body, action.scales) == ("patch", None, (("qwen-worker", 4),))


def test_an_adopted_legacy_graph_scales_its_worker_never_its_main_frontend() -> None:
    current = load_manifest((FIXTURES / "vllm-legacy-frontend-main-v1alpha1.yaml").read_text())
    ref = {"namespace": "examples", "name": current["metadata"]["name"]}
    primary = inspect_dgd(current).primary
    assert primary is not None and primary.name == "VllmWorker"
    action = plan(
        "q",
        desired(adopted=ref, replicas=4, engine_args=list(primary.imported_args)),
        current,
        namespace=NS,
        api_version="nvidia.com/v1alpha1",
    )
    assert action.verb == "apply" and action.body is not None
    services = action.body["spec"]["services"]
    assert services["VllmWorker"]["replicas"] == 4
    assert "replicas" not in services.get("Frontend", {})  # not even named: never scaled
