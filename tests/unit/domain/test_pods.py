"""Pod needs: what is refused (naming the field), what the serving digest covers, and a change
the engine does not see amending the serving config in the same generation."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from wingsmith.domain.deployment import Deployment
from wingsmith.domain.pods import PodNeeds
from wingsmith.domain.values import ServingConfig
from wingsmith.domain.workload import Workload

from .conftest import plane, recorded, serving

SECRET_ENV = [{"name": "HF_TOKEN", "secret": "hf-token", "key": "token"}]
EVERYTHING: dict[str, Any] = {
    "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
    "secret_env": SECRET_ENV,
    "model_cache": {"claim": "models", "mount_path": "/opt/models"},
    "shared_memory": "16Gi",
    "resources": {"cpu": "8", "memory": "64Gi", "ephemeral_storage": "100Gi"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "node_affinity": [
        {"match_expressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
    ],
    "image_pull_secrets": ["ngc"],
    "priority_class": "inference-high",
    "frontend_replicas": 2,
    "router_mode": "kv",
}


# --- refusals name the field -------------------------------------------------------------------


def _term(**requirement: Any) -> dict[str, Any]:
    return {"node_affinity": [{"match_expressions": [requirement]}]}


def _cache(path: str) -> dict[str, Any]:
    return {"model_cache": {"claim": "m", "mount_path": path}}


def _secret(secret: str = "hf", key: str = "t") -> dict[str, Any]:
    return {"secret_env": [{"name": "T", "secret": secret, "key": key}]}


EXPRESSION = "node_affinity.0.match_expressions.0"
REFUSALS = [
    ({"env": [{"name": "1ABC", "value": "x"}]}, "env.0.name", "environment variable name"),
    ({"env": [{"name": "A-B"}]}, "env.0.name", "environment variable name"),
    ({"env": [{"name": "A"}, {"name": "A"}]}, "env", "listed more than once"),
    ({"env": [{"name": "A", "value": "a\x00b"}]}, "env.0.value", "control characters"),
    ({"env": [{"name": f"V{i}"} for i in range(65)]}, "env", "at most 64"),
    (_secret(secret="Hf_Token"), "secret_env.0.secret", "DNS subdomain"),
    (_secret(key="a/b"), "secret_env.0.key", "Secret key"),
    ({"env": [{"name": "HF_TOKEN"}], "secret_env": SECRET_ENV}, "<root>", "both env and"),
    ({"env": [{"name": "HF_HOME"}], "model_cache": {"claim": "m"}}, "<root>", "by model_cache"),
    ({"model_cache": {"claim": "my.claim"}}, "model_cache.claim", "pattern"),
    (_cache("models"), "model_cache.mount_path", "absolute path"),
    (_cache("/a/../b"), "model_cache.mount_path", "'..'"),
    (_cache("/dev/shm"), "model_cache.mount_path", "shared memory"),
    ({"shared_memory": "lots"}, "shared_memory", "Kubernetes quantity"),
    ({"resources": {"cpu": "-1"}}, "resources.cpu", "Kubernetes quantity"),
    ({"resources": {"memory": "1e9"}}, "resources.memory", "Kubernetes quantity"),
    ({"resources": {"gpu": "1"}}, "resources.gpu", "Extra inputs"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "tolerations.0", "without a key"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "tolerations.0", "no"),
    ({"tolerations": [{"key": "k", "toleration_seconds": 5}]}, "tolerations.0", "NoExecute"),
    ({"tolerations": [{"key": "k", "effect": "Often"}]}, "tolerations.0.effect", "NoSchedule"),
    ({"tolerations": [{"key": "k"}] * 17}, "tolerations", "at most 16"),
    ({"node_affinity": []}, "node_affinity", "at least 1"),
    (
        {"node_affinity": [{"match_expressions": []}]},
        "node_affinity.0.match_expressions",
        "at least 1",
    ),
    (_term(key="z", operator="In"), EXPRESSION, "at least one value"),
    (_term(key="z", operator="Exists", values=["a"]), EXPRESSION, "no values"),
    (_term(key="z", operator="Gt", values=["x"]), EXPRESSION, "whole number"),
    (_term(key="z z", operator="Exists"), f"{EXPRESSION}.key", "label key"),
    ({"image_pull_secrets": ["ngc", "ngc"]}, "image_pull_secrets", "listed more than once"),
    ({"image_pull_secrets": ["NGC"]}, "image_pull_secrets.0", "pattern"),
    ({"priority_class": "High Priority"}, "priority_class", "DNS subdomain"),
    ({"frontend_replicas": 0}, "frontend_replicas", "greater than or equal to 1"),
    ({"frontend_replicas": 65}, "frontend_replicas", "less than or equal to 64"),
    ({"router_mode": "kv-aware"}, "router_mode", "'kv', 'round-robin' or 'random'"),
    ({"hugepages": "1Gi"}, "hugepages", "Extra inputs"),
]


@pytest.mark.parametrize(("pod", "field", "says"), REFUSALS)
def test_every_refusal_names_the_field(pod: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        serving(pod=pod)
    errors = refused.value.errors()
    where = {".".join(str(p) for p in e["loc"][1:]) or "<root>" for e in errors}
    assert field in where, where
    assert any(says in e["msg"] for e in errors), [e["msg"] for e in errors]


def test_everything_at_once_is_accepted_and_round_trips() -> None:
    config = serving(pod=EVERYTHING)
    assert ServingConfig.model_validate(config.model_dump(mode="json")) == config


# --- the digest ----------------------------------------------------------------------------------


# Digests computed before pod needs existed: a configuration without them must keep its digest
# (every deployment's generation, label and live digest depends on it).
BEFORE = [
    (
        {
            "model": "m",
            "backend": "vllm",
            "engine_version": "1.3.0",
            "devices_per_replica": 2,
            "parallelism": {"tensor": 2},
        },
        "svg_4ffee490ef00861a",
    ),
    (
        {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "backend": "sglang",
            "engine_version": "0.5.0",
            "mode": "disaggregated",
            "devices_per_replica": 4,
            "parallelism": {"tensor": 2},
            "image": "x/y:1",
            "context_length": 4096,
            "quantization": "fp8",
            "kv_cache": {"dtype": "fp8", "block_size": 16, "gpu_memory_utilization": 0.9},
        },
        "svg_6df457147e0f1e2e",
    ),
]


@pytest.mark.parametrize(("config", "digest"), BEFORE)
def test_a_config_without_pod_needs_keeps_its_digest_and_its_form(
    config: dict[str, Any], digest: str
) -> None:
    parsed = ServingConfig.model_validate(config)
    assert parsed.digest() == digest
    assert "pod" not in parsed.model_dump(mode="json")  # the events and views keep their form
    assert ServingConfig.model_validate(config | {"pod": None}).digest() == digest
    assert ServingConfig.model_validate(config | {"pod": {}}).pod is None


SCHEDULING = {
    "resources": {"cpu": "8"},
    "tolerations": [{"key": "gpu", "operator": "Exists"}],
    "node_affinity": EVERYTHING["node_affinity"],
    "image_pull_secrets": ["ngc"],
    "priority_class": "high",
    "frontend_replicas": 3,
    "router_mode": "round-robin",
}


@pytest.mark.parametrize("field", sorted(SCHEDULING))
def test_what_the_engine_does_not_see_leaves_the_digest(field: str) -> None:
    assert serving(pod={field: SCHEDULING[field]}).digest() == serving().digest()


ENGINE = {
    "env": [{"name": "A", "value": "1"}],
    "secret_env": SECRET_ENV,
    "model_cache": {"claim": "models"},
    "shared_memory": "32Gi",
}


@pytest.mark.parametrize("field", sorted(ENGINE))
def test_what_reaches_the_engine_changes_the_digest(field: str) -> None:
    assert serving(pod={field: ENGINE[field]}).digest() != serving().digest()


def test_the_order_of_variables_is_not_a_new_engine() -> None:
    a, b = {"name": "A", "value": "1"}, {"name": "B", "value": "2"}
    assert serving(pod={"env": [a, b]}).digest() == serving(pod={"env": [b, a]}).digest()
    assert serving(pod={"env": [a]}).digest() != serving(pod={"env": [a, b]}).digest()


def test_engine_part_is_only_the_engine_fields() -> None:
    part = PodNeeds.model_validate(EVERYTHING).engine_part()
    assert set(part) == {"env", "secret_env", "model_cache", "shared_memory"}


# --- amendments: same generation, still on its way to the cluster --------------------------------


def _deployment() -> Deployment:
    d = Deployment.create(
        plane(),
        workload_id="llama",
        cluster_id="east",
        project="research",
        device_class="H100",
        serving=serving(),
        desired_replicas=2,
    )
    recorded(d)
    return d


def test_a_scheduling_change_amends_the_deployment_in_its_generation() -> None:
    d = _deployment()
    moved = serving(pod={"tolerations": [{"key": "gpu", "operator": "Exists"}]})
    assert d.change_serving_config(plane(), moved)
    assert recorded(d) == ["ServingConfigAmended"]
    assert (d.generation, d.serving, d.serving_digest) == (1, moved, serving().digest())
    assert not d.change_serving_config(plane(), moved)
    assert recorded(d) == []


def test_an_engine_change_in_the_pod_needs_is_a_new_generation() -> None:
    d = _deployment()
    token = serving(pod={"secret_env": SECRET_ENV})
    assert d.change_serving_config(plane(), token)
    assert recorded(d) == ["ServingConfigChanged"]
    assert (d.generation, d.serving_digest) == (2, token.digest())


def test_a_workload_amends_too() -> None:
    w = Workload.create(
        plane(),
        "llama",
        project="research",
        device_class="H100",
        serving=serving(),
        replicas=2,
        cluster_pin=None,
    )
    recorded(w)
    moved = serving(pod={"router_mode": "kv", "frontend_replicas": 2})
    assert w.change_serving_config(plane(), moved)
    assert recorded(w) == ["WorkloadServingConfigAmended"]
    assert (w.serving, w.serving_digest) == (moved, serving().digest())
    assert w.change_serving_config(plane(), serving(pod={"shared_memory": "1Gi"}))
    assert recorded(w) == ["WorkloadServingConfigChanged"]
