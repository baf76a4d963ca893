"""Pod needs in the rendered DynamoGraphDeployment (both API versions, each admissible), and a
cluster's defaults filling what a workload leaves unset."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wingsmith.domain.pods import PodNeeds
from wingsmith.domain.values import ServingConfig
from wingsmith.services.operator import pods
from wingsmith.services.operator.dgd import V1ALPHA1, V1BETA1, render_dgd

from .test_dgd import assert_admissible, components, desired, main_container, serving

ZONE = "topology.kubernetes.io/zone"
HF_TOKEN = {"name": "HF_TOKEN", "secret": "hf-token", "key": "token"}
EVERYTHING: dict[str, Any] = {
    "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
    "secret_env": [HF_TOKEN],
    "model_cache": {"claim": "models", "mount_path": "/opt/models"},
    "shared_memory": "16Gi",
    "resources": {"cpu": "8", "memory": "64Gi", "ephemeral_storage": "100Gi"},
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "value": "yes", "effect": "NoExecute", "toleration_seconds": 60},
    ],
    "node_affinity": [
        {"match_expressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]},
        {"match_expressions": [{"key": "pool", "operator": "Exists"}]},
    ],
    "image_pull_secrets": ["ngc"],
    "priority_class": "inference-high",
    "frontend_replicas": 2,
    "router_mode": "kv",
}  # fmt: skip
ENV = [
    {"name": "HF_HOME", "value": "/opt/models"},
    {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
]
SCHEDULING = {
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "spot",
            "operator": "Equal",
            "value": "yes",
            "effect": "NoExecute",
            "tolerationSeconds": 60,
        },
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
                ]
            }
        }
    },
    "imagePullSecrets": [{"name": "ngc"}],
    "priorityClassName": "inference-high",
}


def _render(pod: dict[str, Any] | None, api_version: str, **changes: Any) -> dict[str, Any]:
    config = serving(pod=pod, **changes)
    manifest = render_dgd(desired(config), namespace="wingsmith", api_version=api_version)
    assert_admissible(manifest)
    return manifest


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_v1beta1_carries_every_need(mode: str) -> None:
    manifest = _render(EVERYTHING, V1BETA1, mode=mode, devices_per_replica=4)
    found = components(manifest)
    frontend = found.pop("frontend")
    assert frontend["replicas"] == 2
    assert main_container(frontend)["args"] == ["--router-mode", "kv"]
    assert "sharedMemorySize" not in frontend
    assert "resources" not in main_container(frontend)
    assert set(found) == ({"worker"} if mode == "aggregated" else {"prefill", "decode"})
    for component in [frontend, *found.values()]:
        spec = component["podTemplate"]["spec"]
        container = main_container(component)
        assert container["env"] == ENV
        assert container["volumeMounts"] == [{"name": "model-cache", "mountPath": "/opt/models"}]
        assert spec["volumes"] == [
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}}
        ]
        assert {k: spec[k] for k in SCHEDULING} == SCHEDULING
    for worker in found.values():
        assert worker["sharedMemorySize"] == "16Gi"
        gpus = str(4 if mode == "aggregated" else 2)
        assert main_container(worker)["resources"] == {
            "limits": {"nvidia.com/gpu": gpus},
            "requests": {
                "cpu": "8",
                "memory": "64Gi",
                "ephemeral-storage": "100Gi",
                "nvidia.com/gpu": gpus,
            },
        }
    assert "priorityClassName" not in manifest["spec"]  # the graph's: Grove only


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_v1alpha1_carries_every_need_in_dynamos_own_fields(mode: str) -> None:
    manifest = _render(EVERYTHING, V1ALPHA1, mode=mode, devices_per_replica=4)
    assert manifest["spec"]["pvcs"] == [{"name": "models", "create": False}]
    services = dict(manifest["spec"]["services"])
    frontend = services.pop("frontend")
    assert frontend["replicas"] == 2
    assert frontend["extraPodSpec"]["mainContainer"]["args"] == ["--router-mode", "kv"]
    assert "sharedMemory" not in frontend and "resources" not in frontend
    for service in [frontend, *services.values()]:
        assert service["envs"] == ENV
        assert service["volumeMounts"] == [{"name": "models", "mountPoint": "/opt/models"}]
        extra = service["extraPodSpec"]
        assert {k: extra[k] for k in SCHEDULING} == SCHEDULING
    for worker in services.values():
        assert worker["sharedMemory"] == {"size": "16Gi"}
        gpus = str(4 if mode == "aggregated" else 2)
        assert worker["resources"]["requests"] == {
            "cpu": "8",
            "memory": "64Gi",
            "custom": {"ephemeral-storage": "100Gi"},
            "gpu": gpus,
        }


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
def test_no_needs_render_as_before(api_version: str) -> None:
    plain = render_dgd(desired(serving()), namespace="wingsmith", api_version=api_version)
    assert _render({}, api_version) == plain
    frontend = (
        components(plain)["frontend"]
        if api_version == V1BETA1
        else plain["spec"]["services"]["frontend"]
    )
    assert frontend["replicas"] == 1


def test_shared_memory_zero_turns_it_off_in_both_versions() -> None:
    beta = components(_render({"shared_memory": "0"}, V1BETA1))["worker"]
    assert beta["sharedMemorySize"] == "0"
    alpha = _render({"shared_memory": "0"}, V1ALPHA1)["spec"]["services"]["worker"]
    assert alpha["sharedMemory"] == {"disabled": True}


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
def test_no_frontends_while_no_workers_run(api_version: str) -> None:
    config = serving(pod={"frontend_replicas": 3})
    obj = desired(config, replicas=0)
    manifest = render_dgd(obj, namespace="wingsmith", api_version=api_version)
    assert_admissible(manifest)
    if api_version == V1BETA1:
        assert components(manifest)["frontend"]["replicas"] == 0
    else:
        assert manifest["spec"]["services"]["frontend"]["replicas"] == 0


# --- generated needs: always admissible --------------------------------------------------------

_names = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
_env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: n != "HF_HOME")
_quantities = st.from_regex(r"[1-9][0-9]{0,3}(Mi|Gi|m|)", fullmatch=True)


@st.composite
def pod_needs(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(_env_names, max_size=6, unique=True))
    split = draw(st.integers(0, len(names)))
    pod: dict[str, Any] = {
        "env": [{"name": n, "value": draw(st.text("ab c=", max_size=5))} for n in names[:split]],
        "secret_env": [{"name": n, "secret": draw(_names), "key": "k"} for n in names[split:]],
    }
    optional: dict[str, Any] = {
        "model_cache": st.builds(lambda c: {"claim": c}, _names),
        "shared_memory": st.one_of(st.just("0"), _quantities),
        "resources": st.fixed_dictionaries(
            {}, optional={"cpu": _quantities, "memory": _quantities}
        ),
        "tolerations": st.lists(
            st.builds(lambda k: {"key": k, "operator": "Exists"}, _names), max_size=3
        ),
        "image_pull_secrets": st.lists(_names, min_size=1, max_size=3, unique=True),
        "priority_class": _names,
        "frontend_replicas": st.integers(1, 64),
        "router_mode": st.sampled_from(["kv", "round-robin", "random"]),
    }
    for field, strategy in optional.items():
        if draw(st.booleans()):
            pod[field] = draw(strategy)
    return pod


@pytest.mark.parametrize("api_version", [V1BETA1, V1ALPHA1])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pod_needs(), disaggregated=st.booleans())
def test_every_pod_needs_render_admissibly(
    api_version: str, pod: dict[str, Any], disaggregated: bool
) -> None:
    mode = "disaggregated" if disaggregated else "aggregated"
    manifest = _render(pod, api_version, mode=mode, devices_per_replica=4)
    again = render_dgd(
        desired(serving(pod=copy.deepcopy(pod), mode=mode, devices_per_replica=4)),
        namespace="wingsmith",
        api_version=api_version,
    )
    assert again == manifest


# --- a cluster's defaults ----------------------------------------------------------------------

DEFAULTS = PodNeeds.model_validate(
    {
        "env": [{"name": "HF_HUB_OFFLINE", "value": "0"}, {"name": "LOG", "value": "info"}],
        "secret_env": [{"name": "HF_TOKEN", "secret": "cluster-hf", "key": "token"}],
        "model_cache": {"claim": "cluster-cache"},
        "resources": {"cpu": "4", "memory": "32Gi"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "image_pull_secrets": ["cluster-ngc"],
        "priority_class": "standard",
        "router_mode": "round-robin",
    }
)


def test_the_workload_wins_and_variables_merge_by_name() -> None:
    own = PodNeeds.model_validate(
        {
            "env": [{"name": "LOG", "value": "debug"}, {"name": "HF_TOKEN", "value": "public"}],
            "resources": {"memory": "64Gi"},
            "tolerations": [],
            "router_mode": "kv",
        }
    )
    merged = pods.merge(own, DEFAULTS)
    assert merged is not None
    assert [(e.name, e.value) for e in merged.env] == [
        ("HF_HUB_OFFLINE", "0"),
        ("LOG", "debug"),
        ("HF_TOKEN", "public"),  # a plain variable of the workload replaces the secret one
    ]
    assert merged.secret_env == ()
    assert merged.model_cache == DEFAULTS.model_cache
    assert merged.resources is not None
    assert (merged.resources.cpu, merged.resources.memory) == ("4", "64Gi")
    assert merged.tolerations == ()  # given as none: none
    assert merged.image_pull_secrets == ("cluster-ngc",)
    assert (merged.priority_class, merged.router_mode) == ("standard", "kv")


def test_a_model_cache_and_hf_home_from_different_sides() -> None:
    """Whichever side the workload set wins; the other side's is dropped."""
    own_home = PodNeeds.model_validate({"env": [{"name": "HF_HOME", "value": "/data"}]})
    merged = pods.merge(own_home, DEFAULTS)
    assert merged is not None and merged.model_cache is None
    defaults_home = PodNeeds.model_validate({"env": [{"name": "HF_HOME", "value": "/data"}]})
    own_cache = PodNeeds.model_validate({"model_cache": {"claim": "mine"}})
    merged = pods.merge(own_cache, defaults_home)
    assert merged is not None
    assert merged.env == () and merged.model_cache == own_cache.model_cache


def test_defaults_fill_a_render_object_and_leave_its_digest() -> None:
    obj = desired(serving(pod={"frontend_replicas": 2}))
    before = copy.deepcopy(obj)
    filled = pods.with_defaults(obj, DEFAULTS)
    assert filled["serving_digest"] == obj["serving_digest"]
    needs = ServingConfig.model_validate(filled["serving"]).pod
    assert needs is not None
    assert (needs.frontend_replicas, needs.priority_class) == (2, "standard")
    assert obj == before  # the input is left alone
    for api_version in (V1BETA1, V1ALPHA1):
        manifest = render_dgd(filled, namespace="wingsmith", api_version=api_version)
        assert_admissible(manifest)
        assert (
            manifest["metadata"]["labels"]["wingsmith.dev/serving-digest"]
            == (obj["serving_digest"])
        )
    assert pods.with_defaults(obj, None) is obj
    plain = desired(serving())
    assert ServingConfig.model_validate(pods.with_defaults(plain, DEFAULTS)["serving"]).pod == (
        DEFAULTS
    )


def test_an_unreadable_render_object_is_left_for_the_renderer_to_refuse() -> None:
    obj = desired(serving()) | {"serving": {"pod": {"router_mode": "fastest"}}}
    assert pods.with_defaults(obj, DEFAULTS) is obj


def test_a_defaults_file_is_checked_field_by_field() -> None:
    text = "env:\n  - name: A\n    value: b\nrouter_mode: kv\n"
    assert pods.parse_defaults(text, "d.yaml").router_mode == "kv"
    assert pods.parse_defaults("", "d.yaml") == PodNeeds()
    with pytest.raises(ValueError, match=r"d\.yaml: resources\.cpu: .*quantity"):
        pods.parse_defaults('{"resources": {"cpu": "lots"}}', "d.yaml")
    with pytest.raises(ValueError, match=r"d\.yaml: tolerations\.0: .*without a key"):
        pods.parse_defaults("tolerations: [{operator: Equal}]", "d.yaml")
    with pytest.raises(ValueError, match=r"d\.yaml: neither JSON nor YAML"):
        pods.parse_defaults("a: [", "d.yaml")
    with pytest.raises(ValueError, match=r"d\.yaml: <root>: Input should be"):
        pods.parse_defaults("- a", "d.yaml")
