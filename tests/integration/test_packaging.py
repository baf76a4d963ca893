"""The wheel installs one name, `wingsmith`: no generic top-level module such as `domain` or
`services` lands in site-packages, and the linked folders are in it as files."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the Dockerfile copies, too: enough to build the distribution.
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "wingsmith"]
SOURCES += ["domain", "projections", "adapters", "services", "deploy"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel built from a copy of the sources (the checkout gets no build/ or egg-info),
    offline: the environment's setuptools, no isolated build environment."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(
                path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet"]
    built = subprocess.run(
        [*pip, "--wheel-dir", str(tmp / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [path] = (tmp / "dist").glob("wingsmith-*.whl")
    with zipfile.ZipFile(path) as opened:
        yield opened


@pytest.mark.packaging
def test_the_wheel_holds_only_wingsmith(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    [dist_info] = [name for name in top if name.endswith(".dist-info")]
    assert top == {"wingsmith", dist_info}, top
    assert dist_info.startswith("wingsmith-")


@pytest.mark.packaging
def test_the_linked_folders_are_in_the_wheel_as_files(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for module in [
        "wingsmith/__main__.py",
        "wingsmith/py.typed",
        "wingsmith/domain/deployment.py",
        "wingsmith/projections/render.py",
        "wingsmith/adapters/store.py",
        "wingsmith/services/hub/service.py",
        "wingsmith/services/operator/backends/simulated.py",
        "wingsmith/services/cli/main.py",
        "wingsmith/adapters/protos/kubelet_podresources_v1.proto",  # compiled at import
    ]:
        assert module in names, module


@pytest.mark.packaging
def test_the_operators_kustomize_files_are_in_the_wheel_as_data(wheel: zipfile.ZipFile) -> None:
    """`wingsmith operator manifests` renders them; nothing else of deploy/ is shipped, and
    none of its directories is taken for a package."""
    shipped = {n for n in wheel.namelist() if n.startswith("wingsmith/deploy/")}
    operator = ROOT / "deploy" / "kubernetes" / "operator"
    expected = {
        f"wingsmith/deploy/kubernetes/operator/{path.relative_to(operator)}"
        for path in operator.rglob("*")
        if path.is_file()
    }
    assert shipped == expected
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(record).decode().split() == ["wingsmith"]


@pytest.mark.packaging
def test_operator_manifests_work_from_the_wheel(wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    """The wheel's own files, not the checkout's (run elsewhere, the wheel's first on the
    path): its manifests as the command prints them."""
    wheel.extractall(tmp_path)
    # not measured by `make test`'s coverage: a second copy of the package would count as
    # lines never run
    measured = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")
    env = {k: v for k, v in os.environ.items() if k not in measured} | {"PYTHONPATH": str(tmp_path)}
    run = functools.partial(subprocess.run, env=env, cwd=tmp_path, capture_output=True, text=True)
    where = run([sys.executable, "-c", "import wingsmith; print(wingsmith.__file__)"])
    assert where.stdout.startswith(str(tmp_path)), where.stdout + where.stderr
    done = run(
        [sys.executable, "-m", "wingsmith", "operator", "manifests", "--cluster-id", "c1"],
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "WINGSMITH_CLUSTER_ID: c1" in done.stdout
    assert "kind: Deployment" in done.stdout


@pytest.mark.packaging
def test_the_wheel_carries_the_license(wheel: zipfile.ZipFile) -> None:
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    text = wheel.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())
