"""The node agent: one per GPU node (a DaemonSet), telling the cluster's operator which devices
each pod on the node holds, as the kubelet allocated them.

Every `interval` seconds it reads the kubelet's pod-resources API (adapters/podresources.py)
and publishes what it read on `wingsmith.obs.<cluster>.devices.<node>`, under the cluster's
credentials: at once when it changed, and every `REFRESHES` reads anyway, so that an operator
that starts later learns it within one refresh and one that stops hearing it knows the agent
is gone. The operator joins it with the pods it watches (services/operator/backends/kube.py):
replicas carry the devices' real ids, and devices held by pods Wingsmith does not manage are
no longer counted free.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import orjson

from wingsmith.adapters.podresources import KubeletUnavailable, NodeDevices, PodResources
from wingsmith.domain.contracts.reports import NodeDevicesReport, PodDevices

log = logging.getLogger(__name__)

DEFAULT_RESOURCES = ("nvidia.com/gpu",)
DEFAULT_INTERVAL = 5.0  # seconds between two reads of the kubelet
REFRESHES = 6  # reads between two publications of what did not change

Publish = Callable[[NodeDevicesReport, str], Awaitable[None]]  # (report, message id)


def node_report(
    cluster_id: str, node_id: str, resources: Sequence[str], devices: NodeDevices, refresh: float
) -> NodeDevicesReport:
    pods = [
        PodDevices.model_construct(namespace=ns, name=name, device_ids=list(ids))
        for (ns, name), ids in sorted(devices.pods.items())
    ]
    allocatable = None if devices.allocatable is None else sorted(devices.allocatable)
    return NodeDevicesReport.model_construct(
        cluster_id=cluster_id,
        node_id=node_id,
        resources=list(resources),
        allocatable=allocatable,
        pods=pods,
        refresh=refresh,
    )


async def run_agent(
    kubelet: PodResources,
    publish: Publish,
    cluster_id: str,
    node_id: str,
    *,
    resources: Sequence[str] = DEFAULT_RESOURCES,
    interval: float = DEFAULT_INTERVAL,
) -> None:
    """Read and publish until cancelled. A kubelet that does not answer is logged (once until
    it answers again) and nothing is published meanwhile: the operator sees the silence."""
    refresh = interval * REFRESHES
    last: str | None = None
    unchanged = 0
    failing = False
    while True:
        try:
            devices = await kubelet.read(resources)
        except KubeletUnavailable as e:
            if not failing:
                log.error("cannot read the kubelet's pod resources: %s", e)
            failing, last = True, None
        else:
            if failing:
                log.info("the kubelet answers again")
            failing = False
            report = node_report(cluster_id, node_id, resources, devices, refresh)
            content = orjson.dumps(report.wire(), option=orjson.OPT_SORT_KEYS)
            digest = hashlib.sha256(content).hexdigest()[:32]
            if digest != last or unchanged + 1 >= REFRESHES:
                # the same content keeps its message id: the stream stores it once per
                # duplicate window, while the operator hears every refresh
                await publish(report, f"{cluster_id}:devices:{node_id}:{digest}")
                last, unchanged = digest, 0
            else:
                unchanged += 1
        await asyncio.sleep(interval)
