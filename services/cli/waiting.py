"""`--wait`: whether a workload serves what it was asked to, and why not yet.

A workload is ready when every deployment with a share runs as many replicas *ready on the
workload's current serving digest* as it wants. Pods that exist are not enough (they may never
become ready), nor are replicas ready on an older configuration (a rollout keeps them serving).
`readiness` decides it from the API's documents alone; `follow` reads them until the workload is
ready or the wait gives up: at its timeout, or at a failure that happened while it waited. A
deployment short of quota or capacity keeps its reason and numbers in the note meanwhile, and the
wait goes on (raising the quota starts the rest); at the timeout that reason is what it prints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wingsmith.domain.deployment import AdmissionPhase, AdmissionReason, Authority

if TYPE_CHECKING:  # the API's documents, as types only: the command line starts without them
    from wingsmith.domain.contracts import views as v

POLL_EVERY = 0.5  # seconds between two reads of the API


class WaitGaveUp(RuntimeError):
    """The workload did not get ready: the message says how far it got and why."""


@dataclass(frozen=True, slots=True)
class Readiness:
    """How far a workload is: `ready` of `wanted` replicas ready on its current serving digest,
    why the rest are not (`reasons`, none once `done`), and a failure that ends the wait."""

    ready: int
    wanted: int
    done: bool
    reasons: tuple[str, ...] = ()
    failure: str | None = None

    @property
    def note(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "ready"


@dataclass(frozen=True, slots=True)
class Target:
    """What the command asked for, as its answer said: the wait judges the workload once the
    views show it (`shown`: at once for an answer the views already had)."""

    name: str  # the workload's name: the views key it by that
    replicas: int
    serving_digest: str
    shown: bool


Failures = Collection[tuple[str, str]]  # (deployment id, since): failures seen before the wait
Look = Callable[[], Awaitable[tuple["v.Workload | None", "list[v.Deployment]"]]]


def ready_on(deployment: v.Deployment, digest: str) -> int:
    """The deployment's whole replicas ready on `digest`, never counted high: its ready replicas
    less every replica on another digest (those may be the ready ones), and at most its replicas
    on `digest` and its ready pods on `digest` (the cluster reports these apart)."""
    live = deployment["live_digests"]
    others = sum(count for key, count in live.items() if key != digest)
    pods = sum(1 for r in deployment["replicas"] if r["ready"] and r["serving_digest"] == digest)
    return max(0, min(deployment["ready_replicas"] - others, live.get(digest, 0), pods))


def failures(deployments: Sequence[v.Deployment]) -> frozenset[tuple[str, str]]:
    """The failures the deployments show now: a wait counts only failures that come after."""
    return frozenset(
        (d["deployment_id"], d["admission"]["since"])
        for d in deployments
        if d["admission"]["phase"] == AdmissionPhase.FAILED
    )


def readiness(
    workload: v.Workload, deployments: Sequence[v.Deployment], before: Failures = ()
) -> Readiness:
    """Ready once placement shares all the replicas wanted, every deployment with a share has
    exactly its share ready on the workload's serving digest (a scale down is done once the
    replicas beyond it have stopped), and the workload's phase says `running` too. A failure
    not in `before` ends the wait."""
    digest, wanted = workload["serving_digest"], workload["replicas"]
    mine = {p["deployment_id"] for p in workload["deployments"]}
    shares = [d for d in deployments if d["deployment_id"] in mine and d["desired_replicas"] > 0]
    placed = sum(d["desired_replicas"] for d in shares)
    reasons = [] if placed == wanted else [_unplaced(workload, placed)]
    ready, failure = 0, None
    for d in shares:
        on_digest = ready_on(d, digest)
        ready += min(on_digest, d["desired_replicas"])
        if (why := why_not(d, on_digest, digest)) is not None:
            reasons.append(f"{d['cluster_id']}: {why}")
        if failure is None and _failed(d) and _key(d) not in before:
            failure = f"{d['cluster_id']}: {why}"
    if not reasons and workload["phase"] != AdmissionPhase.RUNNING:  # its views lag a moment
        reasons.append(f"phase {workload['phase']}, not running yet")
    return Readiness(ready, wanted, not reasons, tuple(reasons), failure)


def why_not(d: v.Deployment, on_digest: int, digest: str) -> str | None:
    """Why the deployment does not have its share ready on `digest`; None when it does."""
    if _failed(d):
        message = d["admission"].get("message")
        return f"failed: {d['admission']['reason']}" + (f": {message}" if message else "")
    desired = d["desired_replicas"]
    if on_digest == desired and d["enabled"] and not d["stale"]:
        return None
    parts = [f"{on_digest}/{desired} ready", *_held_back(d), *_config(d, digest)]
    if on_digest > desired:
        parts.append(f"{_replicas(on_digest - desired)} beyond its share to stop")
    return ", ".join(parts)


def _held_back(d: v.Deployment) -> list[str]:
    """What keeps replicas from starting: the plane (disabled, observed, admission) or the
    cluster."""
    parts = [] if d["enabled"] else ["disabled"]
    if d["authority"] == Authority.OBSERVED:
        parts.append("observed: the operator changes nothing of it until it is promoted")
    if d["stale"]:
        parts.append("its cluster is unreachable (this is its last report)")
    if d["waiting_replicas"]:
        parts.append(waiting(d))
    elif d["enabled"] and d["admission"]["phase"] == AdmissionPhase.PENDING:
        parts.append(f"pending: {d['admission']['reason'] or AdmissionReason.AWAITING_ADMISSION}")
    status = d["status"]
    return parts + [_condition(c) for c in (status.get("conditions", []) if status else [])]


def _config(d: v.Deployment, digest: str) -> list[str]:
    """A rollout under way: the new config not there yet, or replicas still on an older one."""
    parts = [] if d["serving_digest"] == digest else ["the new serving config has not reached it"]
    if older := sum(n for key, n in d["live_digests"].items() if key != digest):
        parts.append(f"{_replicas(older)} on an older serving config")
    return parts


def waiting(d: v.Deployment) -> str:
    """`2 replicas wait: insufficient_quota (quota 4, wanted 6, granted 4 devices)`: the
    admission decision's reason and the numbers it was made on."""
    admission = d["admission"]
    reason = admission["reason"] or AdmissionReason.AWAITING_ADMISSION
    numbers = _numbers(reason, admission.get("evidence") or {})
    said = f"{_replicas(d['waiting_replicas'])} wait: {reason}"
    return f"{said} ({numbers})" if numbers else said


# the evidence a reason is told with, in devices: (evidence key, how it reads)
_EVIDENCE: Mapping[str, Sequence[tuple[str, str]]] = {
    AdmissionReason.INSUFFICIENT_QUOTA: (("quota", "quota"), ("held_by_project", "others hold")),
    AdmissionReason.INSUFFICIENT_CAPACITY: (
        ("capacity", "cluster"),
        ("held_in_cluster", "others hold"),
        ("largest_node_free", "largest node free"),
    ),
}
_GRANT = (("wanted", "wanted"), ("granted", "granted"))


def _numbers(reason: str, evidence: Mapping[str, int]) -> str:
    shown = [*_EVIDENCE.get(reason, ()), *_GRANT] if evidence.get("waiting") else []
    parts = [f"{label} {evidence[key]}" for key, label in shown if key in evidence]
    if parts:
        parts[-1] += " devices"
    if "queue_position" in evidence:
        parts.append(f"queue position {evidence['queue_position']}")
    return ", ".join(parts)


def _condition(c: v.StatusCondition) -> str:
    if c["permanent"]:
        return f"{c['reason']}: {c['message']}" if c["message"] else c["reason"]
    pods = c["pods"]
    return f"{c['reason']} ({pods} pod{'s' * (pods != 1)})" if pods else c["reason"]


def _unplaced(workload: v.Workload, placed: int) -> str:
    wanted = workload["replicas"]
    said = (
        f"{_replicas(wanted - placed)} not placed"
        if placed < wanted
        else f"placement shares {placed} replicas, not {wanted} yet"
    )
    return f"{said}: {workload['unplaced']}" if workload["unplaced"] else said


def _replicas(n: int) -> str:
    return f"{n} replica{'s' * (n != 1)}"


def _failed(d: v.Deployment) -> bool:
    return d["admission"]["phase"] == AdmissionPhase.FAILED


def _key(d: v.Deployment) -> tuple[str, str]:
    return d["deployment_id"], d["admission"]["since"]


async def follow(
    look: Look,
    target: Target,
    timeout: float,
    show: Callable[[Readiness], Any],
    *,
    every: float = POLL_EVERY,
) -> v.Workload:
    """Read the workload (`look`) until it is ready, showing how far it is after each read;
    WaitGaveUp at the timeout, at a failure that came while waiting, or when it is deleted."""
    loop = asyncio.get_running_loop()
    deadline, key = loop.time() + timeout, target.name
    before: Failures | None = None  # the failures of the first read that had the workload
    shown = target.shown
    while True:
        workload, deployments = await look()
        if workload is None and before is not None:
            raise WaitGaveUp(f"workload {key} was deleted while waiting for it")
        if workload is not None:
            before = failures(deployments) if before is None else before
            shown = shown or _shows(workload, target)
        state = _unseen(target)
        if workload is not None and shown:
            state = readiness(workload, deployments, before or ())
        show(state)
        if state.failure is not None:
            raise WaitGaveUp(f"workload {key} failed: {state.failure}")
        if state.done and workload is not None:
            return workload
        if loop.time() >= deadline:
            raise WaitGaveUp(_gave_up(key, timeout, state))
        await asyncio.sleep(every)


def _shows(workload: v.Workload, target: Target) -> bool:
    return (workload["replicas"], workload["serving_digest"]) == (
        target.replicas,
        target.serving_digest,
    )


def _unseen(target: Target) -> Readiness:
    return Readiness(0, target.replicas, False, ("the views do not show the change yet",))


def _gave_up(key: str, timeout: float, state: Readiness) -> str:
    return (
        f"workload {key} not ready after {timeout:g}s: {state.ready}/{state.wanted} replicas "
        f"ready on its current serving config; {state.note}"
    )
