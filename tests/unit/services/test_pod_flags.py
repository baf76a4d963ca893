"""Pod needs from the command line (`workloads create|serving` flags) and a cluster's pod
defaults from a file named by a flag or WINGSMITH_OPERATOR_POD_DEFAULTS."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml

from wingsmith.domain.values import ServingConfig
from wingsmith.services.cli.main import main
from wingsmith.services.cli.podflags import add_pod_flags, pod_from
from wingsmith.services.cli.shared import pod_defaults
from wingsmith.services.config import Settings


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_pod_flags(parser)
    return parser.parse_args(argv)


def test_no_flags_leave_the_needs_as_they_are() -> None:
    assert pod_from(_parse(), None) is None
    assert pod_from(_parse(), {"router_mode": "kv"}) == {"router_mode": "kv"}


def test_every_flag_sets_its_field() -> None:
    args = _parse(
        *("--env", "A=1", "--env", "B=x=y"),
        *("--secret-env", "HF_TOKEN=hf-token:token"),
        *("--model-cache", "models:/opt/models", "--shared-memory", "16Gi"),
        *("--cpu", "8", "--memory", "64Gi", "--ephemeral-storage", "100Gi"),
        *("--toleration", "nvidia.com/gpu:NoSchedule", "--toleration", "spot=yes:NoExecute"),
        *("--node-affinity", "zone=a,b", "--image-pull-secret", "ngc"),
        *("--priority-class", "high", "--frontend-replicas", "2", "--router-mode", "kv"),
    )
    pod = pod_from(args, None)
    assert pod == {
        "shared_memory": "16Gi",
        "priority_class": "high",
        "frontend_replicas": 2,
        "router_mode": "kv",
        "resources": {"cpu": "8", "memory": "64Gi", "ephemeral_storage": "100Gi"},
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "x=y"}],
        "secret_env": [{"name": "HF_TOKEN", "secret": "hf-token", "key": "token"}],
        "model_cache": {"claim": "models", "mount_path": "/opt/models"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Equal", "value": "yes", "effect": "NoExecute"},
        ],
        "node_affinity": [
            {"match_expressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
        ],
        "image_pull_secrets": ["ngc"],
    }
    base = {"model": "m", "backend": "vllm", "engine_version": "1.3.0", "devices_per_replica": 1}
    assert ServingConfig.model_validate(base | {"pod": pod}).pod is not None  # the hub accepts it


def test_flags_apply_over_the_current_needs_variables_by_name() -> None:
    current = {
        "env": [{"name": "A", "value": "old"}, {"name": "C", "value": "3"}],
        "resources": {"cpu": "4"},
        "tolerations": [{"key": "x", "operator": "Exists"}],
    }
    pod = pod_from(_parse("--env", "A=new", "--memory", "8Gi"), current)
    assert pod == {
        "env": [{"name": "C", "value": "3"}, {"name": "A", "value": "new"}],
        "resources": {"cpu": "4", "memory": "8Gi"},
        "tolerations": [{"key": "x", "operator": "Exists"}],
    }


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--env", "A"), "--env: 'A' is not NAME=VALUE"),
        (("--secret-env", "T=secret"), "--secret-env: 'secret' is not NAME=SECRET:KEY"),
        (("--node-affinity", "zone"), "--node-affinity: 'zone' is not KEY=V1[,V2]"),
    ],
)
def test_a_flag_that_cannot_be_split_is_named(argv: tuple[str, ...], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        pod_from(_parse(*argv), None)


def test_the_defaults_file_is_named_by_a_setting_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "defaults.yaml"
    path.write_text("image_pull_secrets: [ngc]\nresources: {cpu: lots}\n")
    settings = Settings.from_env({"WINGSMITH_OPERATOR_POD_DEFAULTS": str(path)})
    assert settings.operator_pod_defaults == str(path)
    with pytest.raises(ValueError, match=r"defaults\.yaml: resources\.cpu: 'lots' is not"):
        pod_defaults(settings.operator_pod_defaults)
    path.write_text("image_pull_secrets: [ngc]\n")
    found = pod_defaults(str(path))
    assert found is not None and found.image_pull_secrets == ("ngc",)
    assert pod_defaults(None) is None
    with pytest.raises(ValueError, match=r"pod defaults .*missing\.yaml: No such file"):
        pod_defaults(str(tmp_path / "missing.yaml"))


def test_render_shows_a_render_object_with_the_clusters_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serving = {"model": "m", "backend": "vllm", "engine_version": "1.3.0", "devices_per_replica": 1}
    obj = {
        "deployment_id": "llama--east",
        "workload_id": "llama",
        "cluster_id": "east",
        "project": "research",
        "device_class": "H100",
        "generation": 1,
        "serving": serving | {"pod": {"router_mode": "kv"}},
        "serving_digest": ServingConfig.model_validate(serving).digest(),
        "replicas": 1,
        "authority": "managed",
    }
    (tmp_path / "desired.json").write_text(json.dumps(obj))
    (tmp_path / "defaults.yaml").write_text("image_pull_secrets: [ngc]\nrouter_mode: random\n")
    argv = ["render", str(tmp_path / "desired.json"), "--pod-defaults"]
    assert main([*argv, str(tmp_path / "defaults.yaml")]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    frontend = manifest["spec"]["components"][0]
    assert frontend["podTemplate"]["spec"]["imagePullSecrets"] == [{"name": "ngc"}]
    assert frontend["podTemplate"]["spec"]["containers"][0]["args"] == ["--router-mode", "kv"]
    (tmp_path / "defaults.yaml").write_text("router_mode: fastest\n")
    assert main([*argv, str(tmp_path / "defaults.yaml")]) != 0
    assert "defaults.yaml: router_mode: Input should be 'kv'" in capsys.readouterr().err
