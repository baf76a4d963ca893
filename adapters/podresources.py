"""The kubelet's pod-resources API: which devices each pod on a node holds, and which devices
the node can allocate, read over gRPC on the kubelet's Unix socket.

With the NVIDIA device plugin the ids are GPU UUIDs (`GPU-8f6c…`), MIG devices' UUIDs, or a
UUID with `::<n>` for a GPU shared by time-slicing. The API's messages are compiled at import
from `protos/kubelet_podresources_v1.proto` (grpcio-tools), the one description of the wire
format the node agent and its tests share.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
PROTO = "kubelet_podresources_v1.proto"
CALL_TIMEOUT = 10.0  # seconds for one call; the kubelet answers from memory


def _compiled() -> tuple[Any, Any]:
    """The proto's messages and service stubs, compiled once."""
    where = str(Path(__file__).with_name("protos"))
    sys.path.insert(0, where)  # grpc resolves a proto file through sys.path
    try:
        return grpc.protos_and_services(PROTO)
    finally:
        sys.path.remove(where)


messages, services = _compiled()


class KubeletUnavailable(Exception):
    """The kubelet did not answer (its socket is missing, or a call failed): the message says
    which call and why."""


@dataclass(frozen=True)
class NodeDevices:
    """What the kubelet says of one node, for the resources asked about: the devices it can
    allocate (None when the kubelet is too old to tell) and, per pod (namespace, name), the
    devices its containers hold, in the kubelet's order, each once."""

    allocatable: tuple[str, ...] | None
    pods: dict[tuple[str, str], tuple[str, ...]]


class PodResources:
    """A connection to a kubelet's pod-resources socket, kept open across reads (gRPC
    reconnects by itself when the kubelet restarts)."""

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout: float = CALL_TIMEOUT) -> None:
        self.socket, self.timeout = socket, timeout
        self._channel = grpc.aio.insecure_channel(f"unix://{Path(socket).absolute()}")
        self._stub = services.PodResourcesListerStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def read(self, resources: Iterable[str]) -> NodeDevices:
        """The node's devices of these resources (say `nvidia.com/gpu`); pods holding none of
        them are left out."""
        wanted = frozenset(resources)
        listed = await self._call("List", messages.ListPodResourcesRequest())
        pods: dict[tuple[str, str], tuple[str, ...]] = {}
        for pod in listed.pod_resources:
            held = _ids(d for c in pod.containers for d in c.devices if d.resource_name in wanted)
            if held:
                pods[(pod.namespace, pod.name)] = held
        try:
            answer = await self._call(
                "GetAllocatableResources", messages.AllocatableResourcesRequest()
            )
        except _Unimplemented:  # a kubelet before 1.23, or with the feature off
            return NodeDevices(allocatable=None, pods=pods)
        allocatable = _ids(d for d in answer.devices if d.resource_name in wanted)
        return NodeDevices(allocatable=allocatable, pods=pods)

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise _Unimplemented(method) from None
            raise KubeletUnavailable(
                f"{method} on {self.socket}: {e.code().name}: {e.details()}"
            ) from None


class _Unimplemented(Exception):
    pass


def _ids(devices: Iterable[Any]) -> tuple[str, ...]:
    """The device ids of these ContainerDevices, each once, in order."""
    return tuple(dict.fromkeys(i for d in devices for i in d.device_ids))
