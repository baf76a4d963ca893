"""What a workload's pods need beyond the engine's command line: environment (plain and from
Secrets), a model cache, resource requests, shared memory, where they may be scheduled, which
registries they pull from, their priority, and the frontend in front of the workers.

Each is checked here, where a request enters, as what Kubernetes would accept for it, so that a
refusal names the field instead of a DynamoGraphDeployment failing on the cluster later. The
same shape serves a cluster's defaults (`wingsmith operator --pod-defaults`), which fill what a
workload leaves unset (services/operator/pods.py).

Only some of it changes the engine that runs, and only that part is in the serving digest
(`PodNeeds.engine_part`): changing where a pod may run, or the frontend, is not a new generation.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from wingsmith.domain.values import (
    Frozen,
    LabelKey,
    LabelValue,
    Name,
    Subdomain,
    matching,
    once_each,
    text,
)

HF_HOME = "HF_HOME"  # where Hugging Face libraries keep downloads: the model cache's mount
DEFAULT_CACHE_PATH = "/model-cache"  # as Dynamo's own recipes mount theirs

MAX_ENV = 64
MAX_SECRET_ENV = 32
MAX_TOLERATIONS = 16
MAX_TERMS = 8
MAX_EXPRESSIONS = 16
MAX_VALUES = 32
MAX_PULL_SECRETS = 8
MAX_FRONTEND_REPLICAS = 64

# An environment variable's name as a shell can use it: a C identifier.
EnvName = Annotated[
    str,
    *matching(
        r"^[A-Za-z_][A-Za-z0-9_]*$",
        "an environment variable name: letters, digits and '_', not starting with a digit",
        128,
    ),
]
EnvValue = Annotated[str, *text(4096)]
# A key of a Secret's data, as Kubernetes allows it.
SecretKey = Annotated[
    str, *matching(r"^[-._A-Za-z0-9]+$", "a Secret key: letters, digits and '-._'", 253)
]
# A Kubernetes quantity without a sign or exponent: `500m`, `2`, `16Gi`, `1.5G`.
Quantity = Annotated[
    str,
    *matching(
        r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)([KMGTPE]i|[mkMGTPE])?$",
        "a Kubernetes quantity such as 500m, 4, 16Gi or 1.5G",
        32,
    ),
]
_PATH = re.compile(r"^(/[-._A-Za-z0-9]+)+$")


def _mount_path(path: str) -> str:
    if _PATH.fullmatch(path) is None or any(p in (".", "..") for p in path.split("/")):
        raise ValueError(
            f"{path!r} is not an absolute path of letters, digits and '-._' (no '.' or '..' parts)"
        )
    if path == "/dev/shm" or path.startswith("/dev/shm/"):
        raise ValueError(f"{path!r} is where shared memory is mounted")
    return path


MountPath = Annotated[str, Field(max_length=256), AfterValidator(_mount_path)]


class EnvVar(Frozen):
    """A plain environment variable of every container the workload runs."""

    name: EnvName
    value: EnvValue = ""


class SecretEnv(Frozen):
    """An environment variable taken from one key of a Secret in the DGD's namespace, e.g. a
    Hugging Face token: `HF_TOKEN` from Secret `hf-token`, key `token`."""

    name: EnvName
    secret: Subdomain
    key: SecretKey


class ModelCache(Frozen):
    """A PersistentVolumeClaim (which must exist) mounted where Hugging Face libraries keep
    their downloads: `HF_HOME` is set to the mount path, so a model is fetched once per cache,
    not once per pod."""

    claim: Name
    mount_path: MountPath = DEFAULT_CACHE_PATH


class Resources(Frozen):
    """What each engine pod requests besides its devices (the scheduler's arithmetic)."""

    cpu: Quantity | None = None
    memory: Quantity | None = None
    ephemeral_storage: Quantity | None = None


class TolerationOperator(StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(Frozen):
    """A taint the pods tolerate, as Kubernetes spells it (without a key: every taint)."""

    key: LabelKey | None = None
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: LabelValue | None = None
    effect: TaintEffect | None = None
    toleration_seconds: int | None = Field(default=None, ge=0, le=31_536_000)

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.key is None and self.operator is not TolerationOperator.EXISTS:
            raise ValueError("a toleration without a key must use operator Exists")
        if self.operator is TolerationOperator.EXISTS and self.value:
            raise ValueError("a toleration with operator Exists has no value")
        if self.toleration_seconds is not None and self.effect is not TaintEffect.NO_EXECUTE:
            raise ValueError("toleration_seconds goes only with effect NoExecute")
        return self


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class NodeRequirement(Frozen):
    """One node-label condition: `zone In [a, b]`, `spot DoesNotExist`, `gpus Gt 4`."""

    key: LabelKey
    operator: SelectorOperator
    values: tuple[LabelValue, ...] = Field(default=(), max_length=MAX_VALUES)

    @model_validator(mode="after")
    def _values_fit(self) -> NodeRequirement:
        op = self.operator
        if op in (SelectorOperator.IN, SelectorOperator.NOT_IN) and not self.values:
            raise ValueError(f"operator {op.value} needs at least one value")
        if op in (SelectorOperator.EXISTS, SelectorOperator.DOES_NOT_EXIST) and self.values:
            raise ValueError(f"operator {op.value} takes no values")
        if op in (SelectorOperator.GT, SelectorOperator.LT) and (
            len(self.values) != 1 or not self.values[0].isdigit()
        ):
            raise ValueError(f"operator {op.value} takes exactly one whole number")
        return self


class NodeSelectorTerm(Frozen):
    """Conditions a node must meet all of."""

    match_expressions: tuple[NodeRequirement, ...] = Field(min_length=1, max_length=MAX_EXPRESSIONS)


class RouterMode(StrEnum):
    """How the frontend picks a worker (`python3 -m dynamo.frontend --router-mode`): the modes
    every Dynamo release has."""

    KV = "kv"
    ROUND_ROBIN = "round-robin"
    RANDOM = "random"


def _distinct_names(items: tuple[Any, ...]) -> tuple[Any, ...]:
    once_each([item.name for item in items])
    return items


def _distinct(items: tuple[str, ...] | None) -> tuple[str, ...] | None:
    return None if items is None else tuple(once_each(items))


class PodNeeds(Frozen):
    """Everything here is optional: what is not given is the cluster's default, or nothing.

    Plain and secret environment, the model cache and shared memory reach the engine and are
    in the serving digest; the rest only says where and how pods are scheduled, and is not.
    Environment goes to every container of the graph (the frontend reads gated models' configs
    too), as do the model cache, tolerations, node affinity, pull secrets and the priority
    class; resource requests and shared memory go to the engine workers.
    """

    env: Annotated[tuple[EnvVar, ...], AfterValidator(_distinct_names)] = Field(
        default=(), max_length=MAX_ENV
    )
    secret_env: Annotated[tuple[SecretEnv, ...], AfterValidator(_distinct_names)] = Field(
        default=(), max_length=MAX_SECRET_ENV
    )
    model_cache: ModelCache | None = None
    # /dev/shm of each engine worker; "0" turns it off (Dynamo's default is 8Gi)
    shared_memory: Quantity | None = None
    resources: Resources | None = None
    tolerations: tuple[Toleration, ...] | None = Field(default=None, max_length=MAX_TOLERATIONS)
    # required node affinity: a node must meet one of these terms
    node_affinity: tuple[NodeSelectorTerm, ...] | None = Field(
        default=None, min_length=1, max_length=MAX_TERMS
    )
    image_pull_secrets: Annotated[tuple[Name, ...] | None, AfterValidator(_distinct)] = Field(
        default=None, max_length=MAX_PULL_SECRETS
    )
    priority_class: Subdomain | None = None
    frontend_replicas: int | None = Field(default=None, ge=1, le=MAX_FRONTEND_REPLICAS)
    router_mode: RouterMode | None = None

    @model_validator(mode="after")
    def _one_source_per_variable(self) -> PodNeeds:
        plain = {e.name for e in self.env}
        both = sorted(plain & {e.name for e in self.secret_env})
        if both:
            raise ValueError(f"{', '.join(both)} is given in both env and secret_env")
        if self.model_cache is not None and HF_HOME in plain | {e.name for e in self.secret_env}:
            raise ValueError(f"{HF_HOME} is set by model_cache (its mount path): leave it out")
        return self

    def engine_part(self) -> dict[str, Any]:
        """What of it changes the running engine, in a canonical form (order-free where order
        does not matter); empty when nothing does. The serving digest covers this only."""
        part: dict[str, Any] = {}
        if self.env:
            part["env"] = sorted([e.name, e.value] for e in self.env)
        if self.secret_env:
            part["secret_env"] = sorted([e.name, e.secret, e.key] for e in self.secret_env)
        if self.model_cache is not None:
            part["model_cache"] = self.model_cache.model_dump(mode="json")
        if self.shared_memory is not None:
            part["shared_memory"] = self.shared_memory
        return part
