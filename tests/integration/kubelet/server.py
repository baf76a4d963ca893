"""A kubelet's pod-resources service for tests: a real gRPC server on a Unix socket, speaking
the API in full (podresources_v1.proto), serving a node's state from a JSON file that it reads
again at every call, so a test changes the node by rewriting the file.

    python server.py SOCKET STATE_FILE

The state: {"allocatable": {resource: [device id, ...]},
            "pods": [{"namespace", "name", "devices": {resource: [device id, ...]}}],
            "unimplemented": [method, ...]}   (methods answered UNIMPLEMENTED, as by an old
kubelet). Every container also gets CPU ids, memory and NUMA topology, as a real kubelet
sends them, which Wingsmith's reader does not know and must skip.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).parent))
protos, services = grpc.protos_and_services("podresources_v1.proto")


def _numa(node: int) -> Any:
    return protos.TopologyInfo(nodes=[protos.NUMANode(ID=node)])


def _devices(by_resource: dict[str, list[str]]) -> list[Any]:
    return [
        protos.ContainerDevices(resource_name=r, device_ids=ids, topology=_numa(0))
        for r, ids in by_resource.items()
    ]


Servicer: Any = services.PodResourcesListerServicer


class Kubelet(Servicer):  # type: ignore[misc]
    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file

    async def _state(self, method: str, context: Any) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.state_file.read_text())
        if method in state.get("unimplemented", ()):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method}")
        return state

    def _pod(self, pod: dict[str, Any]) -> Any:
        container = protos.ContainerResources(
            name="main",
            devices=_devices(pod.get("devices", {})),
            cpu_ids=[2, 3],
            memory=[protos.ContainerMemory(memory_type="memory", size=1 << 30, topology=_numa(0))],
        )
        sidecar = protos.ContainerResources(name="sidecar", cpu_ids=[4])
        return protos.PodResources(
            name=pod["name"], namespace=pod["namespace"], containers=[container, sidecar]
        )

    async def List(self, request: Any, context: Any) -> Any:
        state = await self._state("List", context)
        return protos.ListPodResourcesResponse(pod_resources=[self._pod(p) for p in state["pods"]])

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        state = await self._state("GetAllocatableResources", context)
        return protos.AllocatableResourcesResponse(
            devices=_devices(state.get("allocatable", {})), cpu_ids=list(range(16))
        )

    async def Get(self, request: Any, context: Any) -> Any:
        state = await self._state("Get", context)
        for pod in state["pods"]:
            if (pod["namespace"], pod["name"]) == (request.pod_namespace, request.pod_name):
                return protos.GetPodResourcesResponse(pod_resources=self._pod(pod))
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such pod")


async def serve(socket: str, state_file: Path) -> None:
    server = grpc.aio.server()
    services.add_PodResourcesListerServicer_to_server(Kubelet(state_file), server)
    server.add_insecure_port(f"unix://{socket}")  # an absolute path
    await server.start()
    print("serving", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(serve(str(Path(sys.argv[1]).absolute()), Path(sys.argv[2])))
