"""How a workload's total replicas are shared among its deployments' clusters (pure)."""

from __future__ import annotations


def divide(total: int, clusters: list[str]) -> dict[str, int]:
    """Even shares in cluster order; the first `total % n` clusters take one more. They sum to
    `total`, and a cluster keeps its share whenever the total and the cluster list do."""
    if not clusters:
        return {}
    base, extra = divmod(total, len(clusters))
    return {c: base + (1 if i < extra else 0) for i, c in enumerate(clusters)}
