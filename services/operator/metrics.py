"""An operator's metrics: what it did with each render object the hub sent, each write it
made to its cluster (or held back: read-only, observed), and each write the Kubernetes API
refused. Every series of its cluster starts at zero, so a rate over it is never missing."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import StrEnum
from typing import get_args

from prometheus_client import CollectorRegistry, Counter

from wingsmith.services.operator.plan import Verb


class Reconcile(StrEnum):
    """What became of a render object."""

    APPLIED = "applied"
    STALE = "stale"  # older than one applied already
    FOREIGN = "foreign"  # for another cluster: refused
    UNRENDERABLE = "unrenderable"  # cannot be expressed: reported failed, not tried again
    FAILED = "failed"  # tried again later


@dataclass(frozen=True)
class _Families:
    reconciles: Counter
    actions: Counter
    errors: Counter


# a registry's families, made once: the operators of one process (the simulated clusters of
# `wingsmith up`) share them, each with its cluster's series
_made: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()


def _families(registry: CollectorRegistry | None) -> _Families:
    if registry is not None and registry in _made:
        return _made[registry]
    families = _Families(
        Counter(
            "wingsmith_operator_reconciles",
            "Render objects handled by the operator, by cluster and outcome.",
            ["cluster", "outcome"],
            registry=registry,
        ),
        Counter(
            "wingsmith_operator_actions",
            "Writes to the cluster's DynamoGraphDeployments, by cluster, verb and whether "
            "they were performed (false: held back, read-only or observed).",
            ["cluster", "verb", "performed"],
            registry=registry,
        ),
        Counter(
            "wingsmith_operator_api_errors",
            "Writes the Kubernetes API refused or failed, by cluster and verb.",
            ["cluster", "verb"],
            registry=registry,
        ),
    )
    if registry is not None:
        _made[registry] = families
    return families


class OperatorMetrics:
    def __init__(self, cluster_id: str, registry: CollectorRegistry | None = None) -> None:
        self.cluster_id = cluster_id
        families = _families(registry)
        reconciles, actions, errors = families.reconciles, families.actions, families.errors
        self.reconciles = {o: reconciles.labels(cluster_id, o.value) for o in Reconcile}
        verbs: tuple[str, ...] = get_args(Verb)
        self.actions = {
            (verb, performed): actions.labels(cluster_id, verb, str(performed).lower())
            for verb in verbs
            for performed in (True, False)
        }
        self.api_errors = {verb: errors.labels(cluster_id, verb) for verb in verbs}

    def reconciled(self, outcome: Reconcile) -> None:
        self.reconciles[outcome].inc()

    def acted(self, verb: str, *, performed: bool) -> None:
        self.actions[(verb, performed)].inc()
