"""Device classes at the edge (given / when / then): a workload's class close to one the fleet
reports is refused with did-you-mean; a class close to none, or one its project has a quota
for, is accepted."""

from __future__ import annotations

import pytest

from wingsmith.domain import commands as c
from wingsmith.domain.base import InvalidValue
from wingsmith.domain.cluster import Cluster, Node
from wingsmith.domain.project import Project
from wingsmith.domain.workload import Workload
from wingsmith.services.hub.handlers import create_workload

from ..domain.conftest import plane, serving
from .test_observe import Repo

LONG = "NVIDIA-H100-80GB-HBM3"


def fleet(*quota: str) -> Repo:
    east = Cluster.register(plane(), "east", None, {})
    east.report_inventory(plane(), (Node(node_id="n1", device_class=LONG, devices=8),))
    project = Project.register(plane(), "p")
    for device_class in quota:
        project.set_quota(plane(), device_class, 4)
    return Repo(east, project)


def create(repo: Repo, device_class: str) -> None:
    command = c.CreateWorkload(
        command_id="create",
        workload_id="chat",
        project="p",
        device_class=device_class,
        serving=serving(devices_per_replica=1, parallelism={}),
        replicas=1,
    )
    create_workload(repo, command, plane())


def test_a_typo_of_a_reported_class_is_refused_naming_the_reported_ones() -> None:
    repo = fleet()
    with pytest.raises(InvalidValue) as refused:
        create(repo, "NVIDIA-H100")
    assert refused.value.field == "device_class"
    assert refused.value.details == {"reported": [LONG], "did_you_mean": [LONG]}
    assert "did you mean 'NVIDIA-H100-80GB-HBM3'" in refused.value.message
    assert repo.get(Workload, "chat") is None


def test_a_class_no_cluster_has_yet_is_accepted() -> None:
    repo = fleet()
    create(repo, "MI300X")
    assert repo.get(Workload, "chat").device_class == "MI300X"


def test_a_reported_class_is_accepted() -> None:
    repo = fleet()
    create(repo, LONG)
    assert repo.get(Workload, "chat") is not None


def test_a_class_the_project_has_a_quota_for_is_accepted_even_close_to_a_reported_one() -> None:
    repo = fleet("NVIDIA-H100")
    create(repo, "NVIDIA-H100")
    assert repo.get(Workload, "chat").device_class == "NVIDIA-H100"
