"""End-to-end ingest: command sent -> event stored -> event on WINGSMITH_EVENTS.

The hub runs in its own process (`wingsmith up`) on the embedded defaults (SQLite, the
nats-server from the wheel); this process is the client. Latency is measured from sending a
command to its event arriving from the stream's subject. The baseline is raw JetStream
`publish_async` of messages the size of our events, on the same server in the same run.

    python bench/ingest.py [--commands 20000] [--aggregates 1000]

The last line is `ingest_ratio=<commands/s at 256 in flight / raw msgs/s>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
import orjson
from nats.aio.client import Client
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.nats_server import EmbeddedNatsServer

EVENT_BYTES = 300


async def raw_publish_rate(nc: Client, count: int) -> float:
    js = nc.jetstream(publish_async_max_pending=4000)
    await js.add_stream(
        StreamConfig(name="BENCH_RAW", subjects=["bench.raw.>"], storage=StorageType.FILE)
    )
    payload = b"x" * EVENT_BYTES
    start = time.perf_counter()
    for i in range(count):
        await js.publish_async(f"bench.raw.{i % 1000}", payload)
    await js.publish_async_completed()
    rate = count / (time.perf_counter() - start)
    await js.delete_stream("BENCH_RAW")
    return rate


class Load:
    """Sends commands with a fixed number in flight and times each until its event arrives."""

    def __init__(self, nc: Client, aggregates: int) -> None:
        self.nc, self.aggregates = nc, aggregates
        self.sent: dict[str, float] = {}
        self.arrived: dict[str, float] = {}
        self.serial = 0

    async def listen(self) -> None:
        async def on_event(msg: nats.aio.msg.Msg) -> None:
            command_id = orjson.loads(msg.data)["event"]["command_id"]
            self.arrived[command_id] = time.perf_counter()

        await self.nc.subscribe("wingsmith.evt.project.*.QuotaSet", cb=on_event)

    def _next(self) -> tuple[str, bytes]:
        self.serial += 1
        n = self.serial
        command_id = f"bench-{n}"
        body = {
            "command_id": command_id,
            "project": f"p{n % self.aggregates}",
            "device_class": "H100",
            "devices": n // self.aggregates + 1,
        }
        return command_id, orjson.dumps(body)

    async def run(self, count: int, in_flight: int) -> tuple[float, list[float]]:
        todo = [self._next() for _ in range(count)]
        ids = [command_id for command_id, _ in todo]
        todo.reverse()

        async def worker() -> None:
            while todo:
                command_id, body = todo.pop()
                self.sent[command_id] = time.perf_counter()
                reply = await self.nc.request("wingsmith.cmd.project.set_quota", body, timeout=30)
                if not orjson.loads(reply.data)["ok"]:
                    raise RuntimeError(reply.data.decode())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        while not all(i in self.arrived for i in ids):
            await asyncio.sleep(0.002)
        elapsed = max(self.arrived[i] for i in ids) - start
        latencies = [(self.arrived[i] - self.sent[i]) * 1000 for i in ids]
        return count / elapsed, latencies


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


async def main(commands: int, aggregates: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedNatsServer(Path(tmp) / "nats") as server:
            nc = await nats.connect(server.url, pending_size=256 * 1024 * 1024)
            raw = await raw_publish_rate(nc, commands)
            print(f"raw JetStream publish_async: {raw:,.0f} msg/s ({EVENT_BYTES}-byte messages)")
            # The command path only: the projector is another consumer of the stream, which on
            # a two-core machine would compete with the hub for CPU (see docs/performance.md).
            env = os.environ | {
                "WINGSMITH_PROJECTOR": "false",
                "WINGSMITH_NATS_URL": server.url,
                "WINGSMITH_DATA_DIR": str(Path(tmp) / "hub"),
            }
            hub = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up"],
                env=env,
                stdout=subprocess.PIPE,
                cwd=Path(__file__).parent.parent,
            )
            try:
                assert hub.stdout is not None and b"ready" in hub.stdout.readline()
                load = Load(nc, aggregates)
                await load.listen()
                await load.run(aggregates, 64)  # warm-up: every aggregate exists
                rates = {}
                for in_flight in (1, 64, 256):
                    count = min(commands, 1000) if in_flight == 1 else commands
                    rate, latencies = await load.run(count, in_flight)
                    rates[in_flight] = rate
                    print(
                        f"{in_flight:>3} in flight: {rate:8,.0f} commands/s   "
                        f"p50 {percentile(latencies, 50):7.2f} ms   "
                        f"p99 {percentile(latencies, 99):7.2f} ms   ({count} commands)"
                    )
            finally:
                hub.terminate()
                hub.wait(30)
                await nc.close()
    print(f"ingest_ratio={rates[256] / raw:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--aggregates", type=int, default=1_000)
    args = parser.parse_args()
    asyncio.run(main(args.commands, args.aggregates))
