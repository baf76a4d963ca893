"""How engine workers fit on a cluster's nodes (pure). docs/scheduling.md, "Per node".

An engine worker (the replica when aggregated, each of its prefill and decode workers when
disaggregated) runs on one node when one node of its class has the devices, or else on several,
as one pod per node with its devices split evenly (Dynamo's multinode workers). A device class's
nodes may differ in size; a worker's span is chosen from the largest of them, so it changes only
when that size does, not when a node comes or goes, and the rendered shape does not flap. Pods
smaller than a node's free devices may share a node; those larger may not use it.

Admission and placement count these pods per node: free devices on each node, less what live
replicas hold there, less the pods that grants not yet started will need (placed first fit,
largest first, nodes in id order).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, MutableSequence, Sequence
from typing import Any

MAX_NODES_PER_WORKER = 64  # the render object's bound (domain/contracts/render.py)


def workers_per_replica(serving: Mapping[str, Any]) -> int:
    """Engine workers in a replica of this serving configuration (as JSON): a disaggregated
    replica is one prefill and one decode worker (ServingConfig.devices_per_worker)."""
    return 2 if serving.get("mode") == "disaggregated" else 1


def worker_devices(serving: Mapping[str, Any]) -> int:
    """The devices of one engine worker of this serving configuration (as JSON)."""
    return int(serving["devices_per_replica"]) // workers_per_replica(serving)


@functools.lru_cache(maxsize=4096)
def span(worker: int, largest_node: int) -> int | None:
    """The fewest nodes a worker of `worker` devices spans on nodes of `largest_node` devices:
    n such that the devices split evenly (worker % n == 0) and worker / n fit on one node. None
    when no split into at most MAX_NODES_PER_WORKER pods fits (or there are no devices)."""
    if worker <= largest_node:
        return 1
    for n in range(2, min(worker, MAX_NODES_PER_WORKER) + 1):
        if worker % n == 0 and worker // n <= largest_node:
            return n
    return None


def nodes_per_worker(worker: int, node_devices: Iterable[int]) -> int | None:
    """`span` over a device class's node sizes, as a cluster's inventory reports them."""
    return span(worker, max(node_devices, default=0))


def smallest_pod(worker: int) -> int:
    """The fewest devices one pod of a worker can have (evidence when it fits no node)."""
    return min(
        worker // n for n in range(1, min(worker, MAX_NODES_PER_WORKER) + 1) if worker % n == 0
    )


def pods(devices: int, pod_devices: int) -> dict[int, int]:
    """`devices` as pods of `pod_devices` (pod size -> count); a remainder that is not a
    whole pod (a grant counted in an earlier pod size) is one smaller pod."""
    whole, rest = divmod(max(devices, 0), pod_devices)
    found = {pod_devices: whole} if whole else {}
    if rest:
        found[rest] = found.get(rest, 0) + 1
    return found


def pack(free: MutableSequence[int], wanted: Mapping[int, int]) -> int:
    """Place pods (size -> count) first fit, largest first, on nodes with `free` devices each
    (taken from `free`); returns how many pods found no node."""
    left = 0
    for size in sorted(wanted, reverse=True):
        count = wanted[size]
        for i, room in enumerate(free):
            if not count:
                break
            take = min(count, room // size)
            if take:
                free[i] = room - take * size
                count -= take
        left += count
    return left


def room(free: Sequence[int], pod_devices: int) -> int:
    """How many pods of `pod_devices` the nodes' free devices hold."""
    return sum(f // pod_devices for f in free)
