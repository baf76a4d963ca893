"""What the REST API costs on top of the command API it stands on.

**Method.** One process runs the hub on the embedded defaults (its own nats-server, SQLite, the
projector) and the REST API on a free port. A pinned workload is created, then scaled back and
forth `--requests` times in each of two ways, one request at a time:

- raw: a `workload.scale` command as NATS request/reply, the way any client sends it;
- api: `POST /v1/workloads/{ref}/scale` over HTTP (httpx, one keep-alive connection), which
  sends the same command and then waits until the projection views show the change, so that
  the resource it answers with, and any read after it, reflects the write.

Then `GET /v1/workloads/{ref}` and `GET /v1/deployments` (one deployment per workload, with
100 workloads declared) are timed the same way. The ratio of the median API write to the median
raw command says what read-your-writes over HTTP costs.

    python bench/api.py [--requests 300]

The last line is `api_write_ratio=<median API scale / median raw scale>`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wingsmith.adapters import nats_bus
from wingsmith.services.api.server import running_api
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub

TOKEN = "bench-token-0123456789"
SERVING = {"model": "m", "backend": "vllm", "engine_version": "1", "devices_per_replica": 1}


async def timed(n: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    seconds = []
    for i in range(n):
        started = time.perf_counter()
        await call(i)
        seconds.append(time.perf_counter() - started)
    return seconds


def report(name: str, seconds: list[float]) -> float:
    ordered = sorted(seconds)
    median = statistics.median(ordered)
    p99 = ordered[int(len(ordered) * 0.99) - 1]
    print(f"{name:28} median {median * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms")
    return median


async def main(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = replace(
            Settings.from_env({"WINGSMITH_DATA_DIR": tmp}),
            api_listen=("127.0.0.1", 0),
            api_tokens={TOKEN: "bench"},
        )
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            running_hub(settings) as hub,
            running_api(settings, hub.nats_url) as api,
            httpx.AsyncClient(base_url=api.url, headers=auth, timeout=30) as http,
        ):
            await run(hub.nc, http, requests)


async def run(nc: nats_bus.Connection, http: httpx.AsyncClient, requests: int) -> None:
    await http.put("/v1/projects/bench/quotas/H100", json={"devices": 0})
    await http.post("/v1/clusters", json={"cluster_id": "east"})
    for i in range(100):
        body = {
            "workload_id": f"w{i}",
            "project": "bench",
            "device_class": "H100",
            "replicas": 1,
            "cluster": "east",
            "serving": SERVING,
        }
        assert (await http.post("/v1/workloads", json=body)).status_code == 201

    async def raw(i: int) -> None:
        body = {"command_id": f"raw-{i}", "workload_id": "w0", "replicas": 2 + i % 2}
        reply = await nats_bus.request(nc, "wingsmith.cmd.workload.scale", orjson.dumps(body), 10.0)
        assert orjson.loads(reply)["ok"]

    async def api(i: int) -> None:
        response = await http.post("/v1/workloads/w1/scale", json={"replicas": 2 + i % 2})
        assert response.status_code == 200, response.text

    async def get_one(i: int) -> None:
        assert (await http.get("/v1/workloads/w1")).status_code == 200

    async def list_all(i: int) -> None:
        assert len((await http.get("/v1/deployments")).json()["deployments"]) == 100

    raw_median = report("raw command (NATS)", await timed(requests, raw))
    api_median = report("POST scale (HTTP, consistent)", await timed(requests, api))
    report("GET one workload", await timed(requests, get_one))
    report("GET 100 deployments", await timed(requests, list_all))
    print(f"api_write_ratio={api_median / raw_median:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    asyncio.run(main(parser.parse_args().requests))
