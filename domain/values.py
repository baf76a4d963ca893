"""Value objects shared by the aggregates: names, device classes and the serving configuration."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Hashable, Iterable, Sequence
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from wingsmith.domain import releases

T = TypeVar("T", bound=Hashable)

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

# What the outside names goes into NATS subjects (`wingsmith.evt.replica.<id>.<Type>`), KV keys
# and consumer names, where a space, a control character, `.`, `*` or `>` breaks or changes
# the subject. Each value is checked here, as what Kubernetes itself allows for it, before it
# reaches an aggregate; a refusal says what the value should have been. See
# docs/commands.md#names-and-limits.


def matching(pattern: str, what: str, max_length: int, min_length: int = 1) -> Any:
    """The constraints of a text of `min_length` to `max_length` characters that matches
    `pattern`; one that does not is refused as not being `what` (pydantic's own message would
    quote the pattern). The JSON Schema keeps the pattern and the lengths."""
    compiled = re.compile(pattern)
    schema = {"type": "string", "pattern": pattern, "minLength": min_length}

    def check(text: str) -> str:
        if compiled.fullmatch(text) is None:
            shown = repr(text) if len(text) <= 80 else f"{text[:60]!r}…"
            raise ValueError(f"{shown} is not {what}")
        return text

    return (
        StringConstraints(min_length=min_length, max_length=max_length),
        AfterValidator(check),
        WithJsonSchema(schema | {"maxLength": max_length}),
    )


# A DNS subdomain (RFC 1123): pod, node and object names. Its dots never reach a subject token
# whole: ids built from one replace them (`Replica.key_for`).
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_SUBDOMAIN = matching(
    SUBDOMAIN_PATTERN,
    "a DNS subdomain: lower-case letters, digits, '-' and '.', "
    "starting and ending with a letter or digit",
    253,
)
Subdomain = Annotated[str, *_SUBDOMAIN]
PodName = Subdomain
NodeName = Subdomain
ObjectName = Subdomain  # a DynamoGraphDeployment's or any other Kubernetes object's name
Namespace = Name

# Ids the plane makes of names: a deployment is `<workload>--<cluster>`, a discovery
# `<cluster>--<namespace>--<name with dots as dashes>`; both stay one DNS-label-like token.
_ID = "an id: lower-case letters, digits and '-', starting and ending with a letter or digit"
DeploymentId = Annotated[str, *matching(NAME_PATTERN, _ID, 128)]
DiscoveryId = Annotated[str, *matching(NAME_PATTERN, _ID, 383)]

# A device as its plugin names it: GPU UUIDs (`GPU-8f6c…`), MIG devices (`MIG-GPU-…/1/0`), or
# the operator's stand-in `<node>/<pod>/gpu<i>`. Letters, digits and `-_.:/`, nothing else.
_DEVICE_ID = matching(
    r"^[A-Za-z0-9][-_.:/A-Za-z0-9]*$",
    "a device id: letters, digits and '-_.:/', starting with a letter or digit",
    600,  # the operator's stand-in for the longest node and pod names fits
)
DeviceId = Annotated[str, *_DEVICE_ID]
# The stand-in: a node's and a pod's name (DNS subdomains, so never a `/` or an upper-case
# letter) and `gpu<i>`. A GPU UUID or a MIG device (`MIG-GPU-…/1/0`) never has this form.
_STAND_IN = re.compile(
    r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?/gpu(0|[1-9][0-9]*)"
)


def stand_in_device_id(node: str, pod: str, index: int) -> str:
    """What the operator reports for the `index`th GPU of a pod whose devices the cluster did
    not name: it counts the device, and names no real one."""
    return f"{node}/{pod}/gpu{index}"


def is_stand_in(device_id: str) -> bool:
    """Whether a device id is the operator's stand-in rather than a device's own id."""
    return "/gpu" in device_id and _STAND_IN.fullmatch(device_id) is not None


def holds_stand_ins(device_ids: Iterable[str]) -> bool:
    """Whether any of a replica's devices is a stand-in."""
    return any(map(is_stand_in, device_ids))


# What a node can hold: 8 GPUs on most servers, 16 on the densest; split into MIG instances
# (at most 7 each: 112) or shared by time-slicing (the device plugin advertises each GPU N
# times: 8 x 16 = 128, 16 x 16 = 256). 256 holds all of these without letting one report claim
# a data centre per node.
MAX_DEVICES_PER_NODE = 256

# Versions, digests and instance ids: one word of letters, digits and `-_.:+`, no spaces.
_TOKEN = matching(
    r"^[A-Za-z0-9][-_.:+A-Za-z0-9]*$",
    "one word: letters, digits and '-_.:+', starting with a letter or digit",
    64,
)
Token = Annotated[str, *_TOKEN]
# A Kubernetes label value (region, topology domain): empty, or up to 63 of `A-Za-z0-9-_.`.
_LABEL_VALUE = matching(
    r"^([A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?)?$",
    "a label value: letters, digits and '-_.', starting and ending with a letter or digit",
    63,
    min_length=0,
)
LabelValue = Annotated[str, *_LABEL_VALUE]
# A label key: an optional DNS-subdomain prefix and `/`, then a name of up to 63.
_LABEL_KEY = matching(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$",
    "a label key: an optional DNS-subdomain prefix and '/', then letters, digits and '-_.'",
    317,
)
LabelKey = Annotated[str, *_LABEL_KEY]


def text(max_length: int, min_length: int = 0) -> Any:
    """Words for people (a reason, a message): any text but control characters, bounded."""
    what = "text without control characters"
    return matching(r"^[^\x00-\x1f\x7f]*$", what, max_length, min_length)


def once_each(items: Sequence[T]) -> Sequence[T]:
    """`items` when none is repeated; for lists whose entries name distinct things."""
    seen: set[T] = set()
    for item in items:
        if item in seen:
            raise ValueError(f"{item!r} is listed more than once")
        seen.add(item)
    return items


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


def _unset(value: object) -> bool:
    return value is None


def _known_release(version: str) -> str:
    return releases.known(version).version


RuntimeRelease = Annotated[
    str,
    AfterValidator(_known_release),
    WithJsonSchema({"type": "string", "enum": list(releases.RELEASES)}),
]


class ServingConfig(Frozen):
    """How a model is served. A change to what the engine runs is a new generation with a new
    digest; one to where its pods are scheduled or to the frontend (most of `pod`) is not.

    `runtime_release` names the Dynamo release that runs it (its image, module and flags);
    `engine_version` is the engine's own version, by default the one that release ships.
    A config stored before runtime releases existed has none: its engine_version was used as
    the release, and still is (`release`), so it renders and hashes as it always did.
    """

    model: str = Field(min_length=1, max_length=256)
    backend: Backend
    # Added after configs were first stored: left out of dumps (and so of the digest) while
    # unset, so every config stored before it dumps and hashes as it did. Declared before
    # engine_version, whose default it gives.
    runtime_release: RuntimeRelease | None = Field(
        default=None,
        description="The Dynamo runtime release: picks the image, module and flags",
        exclude_if=_unset,
    )
    engine_version: str = Field(
        default="",
        max_length=64,
        validate_default=True,
        description="The engine's version; defaults to the one runtime_release ships",
    )
    image: str | None = Field(default=None, min_length=1, max_length=512)
    mode: ServingMode = ServingMode.AGGREGATED
    devices_per_replica: int = Field(ge=1, le=512)
    parallelism: Parallelism = Parallelism()
    context_length: int | None = Field(default=None, ge=1, le=10_000_000)
    quantization: str | None = Field(default=None, min_length=1, max_length=32)
    kv_cache: KvCache = KvCache()
    # what the pods need besides the command line (domain/pods.py); left out of the JSON when
    # unset, so configurations from before it keep their exact form and digest
    pod: PodNeeds | None = Field(default=None, exclude_if=lambda pod: pod is None)

    @field_validator("pod")
    @classmethod
    def _nothing_is_unset(cls, pod: PodNeeds | None) -> PodNeeds | None:
        """Needs that say nothing are no needs: one configuration, one form."""
        return None if pod == PodNeeds() else pod

    @field_validator("engine_version", mode="before")
    @classmethod
    def _no_engine_version(cls, version: object) -> object:
        return "" if version is None else version  # null: as if left out

    @field_validator("engine_version")
    @classmethod
    def _engine_version_from_release(cls, version: str, info: ValidationInfo) -> str:
        """No engine_version: the one the runtime release's image of the backend ships. (A
        field validator, not a model one: a model `before` validator would make the hub's
        strict JSON parsing refuse every list given for a tuple.)"""
        if version:
            return version
        if "runtime_release" not in info.data or "backend" not in info.data:
            return "unknown"  # refused already: that is the one problem to report
        release, backend = info.data["runtime_release"], info.data["backend"]
        if release is None:
            raise ValueError("required when runtime_release is not given")
        return releases.known(release).engine_version(backend.value)

    @model_validator(mode="after")
    def _engine_version_matches_release(self) -> ServingConfig:
        """Dynamo's image of a release ships one engine version; another one needs an image."""
        if self.runtime_release is None or self.image is not None:
            return self
        shipped = releases.known(self.runtime_release).engine_version(self.backend.value)
        if self.engine_version != shipped:
            raise ValueError(
                f"engine_version {self.engine_version!r} contradicts runtime_release "
                f"{self.runtime_release!r}, whose {self.backend.value} image ships {shipped!r}; "
                f"leave engine_version out, or give an image that has it"
            )
        return self

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

    @property
    def release(self) -> str:
        """The Dynamo release that runs this config: runtime_release, or for a config stored
        before it existed the engine_version it used as one."""
        return self.runtime_release or self.engine_version

    def digest(self) -> str:
        """A stable hash: equal configurations give equal digests, in any process. Of the pod
        needs only what reaches the engine counts (`PodNeeds.engine_part`)."""
        content = self.model_dump(mode="json", exclude={"pod"})
        if self.pod is not None and (engine := self.pod.engine_part()):
            content["pod"] = engine
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return "svg_" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


class ResourceRef(Frozen):
    """A Kubernetes object by namespace and name, e.g. the DynamoGraphDeployment a deployment
    was adopted from."""

    namespace: Namespace
    name: ObjectName


# Pod needs are built of the values above, so they are imported last; the package imports this
# module before any other (domain/__init__.py), so that this order always holds.
from wingsmith.domain.pods import PodNeeds  # noqa: E402

ServingConfig.model_rebuild()
