"""What `wingsmith operator manifests` prints is what `kubectl kustomize` renders for an
overlay of one's own over the same operator overlay (the cluster's settings merged into the
ConfigMap, the image set), object for object."""

from __future__ import annotations

import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.integration.kustomize import DEPLOY, Object, kustomize, of_kind
from wingsmith.services.cli.main import main

CASES = [
    # (overlay, cluster id, extra options, the same as an overlay of one's own says it)
    ("base", "gpu-prod-1", [], {}),
    ("read-only", "lab", [], {}),
    ("base", "b", ["--nats-url", "tls://nats.example.com:4222?a=<b>&c"], {}),
    (
        "read-only",
        "east-2",
        ["--image", "registry.example.com:5000/team/wingsmith:1.2"],
        {"newName": "registry.example.com:5000/team/wingsmith", "newTag": "1.2"},
    ),
    (
        "adopt",
        "a0",
        ["--image", f"wingsmith@sha256:{'0' * 64}"],
        {"newName": "wingsmith", "digest": f"sha256:{'0' * 64}"},
    ),
]


def own_overlay(
    tmp_path: Path, overlay: str, cluster_id: str, options: list[str], image: dict[str, str]
) -> Path:
    """An overlay of one's own over a copy of deploy/kubernetes/operator, as docs/operations.md
    shows: a ConfigMap merged with the cluster's settings, and the image."""
    shutil.copytree(DEPLOY / "operator", tmp_path / "operator")
    literals = [f"WINGSMITH_CLUSTER_ID={cluster_id}"]
    if "--nats-url" in options:
        literals.append(f"WINGSMITH_NATS_URL={options[options.index('--nats-url') + 1]}")
    kustomization: Object = {
        "resources": [f"../operator/{overlay}"],
        "configMapGenerator": [
            {"name": "wingsmith-operator", "behavior": "merge", "literals": literals}
        ],
    }
    if image:
        kustomization["images"] = [{"name": "wingsmith", **image}]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return mine


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> list[Object]:
    assert main(["operator", "manifests", *argv]) == 0
    return [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]


def identity(doc: Object) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


@pytest.mark.parametrize(("overlay", "cluster_id", "options", "image"), CASES)
def test_operator_manifests_equal_what_kustomize_renders(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    overlay: str,
    cluster_id: str,
    options: list[str],
    image: dict[str, str],
) -> None:
    flag = {"base": [], "read-only": ["--read-only"], "adopt": ["--adopt"]}[overlay]
    ours = printed(capsys, "--cluster-id", cluster_id, *flag, *options)
    theirs = kustomize(own_overlay(tmp_path, overlay, cluster_id, options, image))
    assert [identity(d) for d in ours] == [identity(d) for d in theirs]  # and in that order
    assert {identity(d): d for d in ours} == {identity(d): d for d in theirs}
    [config] = of_kind(ours, "ConfigMap")
    assert config["data"]["WINGSMITH_CLUSTER_ID"] == cluster_id
    for doc in ours:
        kubernetes_validate.validate(doc, "1.32", strict=True)


def test_operator_manifests_refuse_what_is_no_cluster_id_url_or_image(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (
        ["--cluster-id", "Not_A_Label"],
        ["--cluster-id", "east", "--nats-url", "http://nats:4222"],
        ["--cluster-id", "east", "--image", "with space"],
        ["--cluster-id", "east", "--read-only", "--adopt"],
    ):
        with pytest.raises(SystemExit) as exited:
            main(["operator", "manifests", *argv])
        assert exited.value.code == 2
    assert "a cluster id is a DNS label" in capsys.readouterr().err
