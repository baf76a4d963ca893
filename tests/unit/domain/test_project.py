from __future__ import annotations

import pytest

from wingsmith.domain.base import InvalidValue
from wingsmith.domain.project import Project

from .conftest import plane, recorded


def test_registering_and_setting_quota() -> None:
    project = Project.register(plane(), "research")
    project.set_quota(plane(), "H100", 16)
    assert recorded(project) == ["ProjectRegistered", "QuotaSet"]
    assert project.quota == {"H100": 16}


def test_setting_the_same_quota_records_nothing() -> None:
    project = Project.register(plane(), "research")
    project.set_quota(plane(), "H100", 16)
    recorded(project)
    project.set_quota(plane(), "H100", 16)
    project.set_quota(plane(), "A100", 0)
    assert recorded(project) == []


def test_negative_quota_is_refused() -> None:
    project = Project.register(plane(), "research")
    with pytest.raises(InvalidValue) as refused:
        project.set_quota(plane(), "H100", -1)
    assert refused.value.field == "devices"
