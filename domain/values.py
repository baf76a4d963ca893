"""Value objects shared by the aggregates: names, device classes and the serving configuration."""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

# A DNS label: it is safe as a Kubernetes name, a NATS subject token and a KV key.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=63)]


def is_name(text: str) -> bool:
    """Whether `text` is a valid `Name`."""
    return len(text) <= 63 and re.fullmatch(NAME_PATTERN, text) is not None


# Device classes come from node labels (`NVIDIA-H100-80GB-HBM3`), so upper case is allowed.
DeviceClass = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9]([-_A-Za-z0-9]*[A-Za-z0-9])?$", max_length=63)
]
EngineArg = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Backend(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class ServingMode(StrEnum):
    AGGREGATED = "aggregated"
    DISAGGREGATED = "disaggregated"


class Parallelism(Frozen):
    tensor: int = Field(default=1, ge=1, le=64)
    pipeline: int = Field(default=1, ge=1, le=64)
    expert: int = Field(default=1, ge=1, le=256)


class KvCache(Frozen):
    dtype: str | None = Field(default=None, max_length=32)
    block_size: int | None = Field(default=None, ge=1, le=1024)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)


class ServingConfig(Frozen):
    """How a model is served. Any change here is a new generation with a new digest."""

    model: str = Field(min_length=1, max_length=256)
    backend: Backend
    engine_version: str = Field(min_length=1, max_length=64)
    image: str | None = Field(default=None, min_length=1, max_length=512)
    mode: ServingMode = ServingMode.AGGREGATED
    devices_per_replica: int = Field(ge=1, le=512)
    parallelism: Parallelism = Parallelism()
    context_length: int | None = Field(default=None, ge=1, le=10_000_000)
    quantization: str | None = Field(default=None, min_length=1, max_length=32)
    kv_cache: KvCache = KvCache()

    @model_validator(mode="after")
    def _footprint_holds_parallelism(self) -> ServingConfig:
        """A replica's devices run whole engines: in disaggregated serving a replica is one
        prefill and one decode worker with half of them each."""
        workers = 2 if self.mode is ServingMode.DISAGGREGATED else 1
        needed = self.parallelism.tensor * self.parallelism.pipeline * workers
        if self.devices_per_replica % needed:
            engines = "2 workers x " if workers == 2 else ""
            raise ValueError(
                f"devices_per_replica ({self.devices_per_replica}) must be a multiple of "
                f"{engines}tensor x pipeline parallelism ({needed})"
            )
        return self

    @property
    def devices_per_worker(self) -> int:
        """The devices of one engine process: a prefill or decode worker gets half."""
        return self.devices_per_replica // (2 if self.mode is ServingMode.DISAGGREGATED else 1)

    def digest(self) -> str:
        """A stable hash: equal configurations give equal digests, in any process."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return "svg_" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


class ResourceRef(Frozen):
    """A Kubernetes object by namespace and name, e.g. the DynamoGraphDeployment a deployment
    was adopted from."""

    namespace: Name
    name: str = Field(pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253)
