"""A project owns quota: how many devices of each class its deployments may hold."""

from __future__ import annotations

from typing import Any

from wingsmith.domain.base import Aggregate, Cause, Created, Event, InvalidValue


class Project(Aggregate):
    kind = "project"
    quota: dict[str, int]

    @classmethod
    def register(cls, cause: Cause, name: str) -> Project:
        return cls._start(ProjectRegistered, name, cause)

    def set_quota(self, cause: Cause, device_class: str, devices: int) -> None:
        if devices < 0:
            raise InvalidValue("quota cannot be negative", field="devices")
        if self.quota.get(device_class, 0) == devices:  # an absent class has a quota of 0
            return
        self._record(QuotaSet, cause, device_class=device_class, devices=devices)


class ProjectRegistered(Created):
    aggregate_class = Project

    def apply(self, project: Any) -> None:
        project.quota = {}


class QuotaSet(Event):
    device_class: str
    devices: int

    def apply(self, project: Any) -> None:
        project.quota = {**project.quota, self.device_class: self.devices}
