"""End-to-end ingest: command sent -> event stored -> event on WINGSMITH_EVENTS; then
sustained mixed load: scale command sent -> its admission decided.

The hub runs in its own process (`wingsmith up`) on the embedded defaults (SQLite, the
nats-server from the wheel); this process is the client. Latency is measured from sending a
command to its event arriving from the stream's subject. The baseline is raw JetStream
`publish_async` of messages the size of our events, on the same server in the same run.

The admission part then sends `--duration` seconds of alternating `workload.scale` and
`project.set_quota` commands at 64 and at 256 in flight, and times each scale from sending it
to the `AdmissionDecided` that follows it for the same workload (the first whose evidence
position is at or past the scale's own event). It samples the hub's resident memory at 10 s
and at the end of each run.

    python bench/ingest.py [--commands 20000] [--aggregates 1000] [--duration 60]

The last lines are `admission_lag_p99_s=<worst p99 of the two runs>`, `hub_rss_growth=<worst
RSS at the end / RSS at 10 s>` and `ingest_ratio=<commands/s at 256 in flight / raw msgs/s>`.
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
from typing import Any

import nats
import orjson
from nats.aio.client import Client
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wingsmith.adapters.nats_server import EmbeddedNatsServer

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
        while not all(i in self.arrived for i in ids):  # noqa: ASYNC110 - a poll times no worse
            await asyncio.sleep(0.002)
        elapsed = max(self.arrived[i] for i in ids) - start
        latencies = [(self.arrived[i] - self.sent[i]) * 1000 for i in ids]
        return count / elapsed, latencies


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


CLUSTERS, NODES, PER_NODE, PROJECTS = 8, 128, 8, 10


class Mixed:
    """Alternating scale and quota commands on a fleet every scale of which is admitted: each
    workload cycles through 1..4 replicas of one device, far within capacity and quota."""

    def __init__(self, nc: Client, workloads: int) -> None:
        self.nc, self.workloads = nc, workloads
        self.serial = 0
        self.scales: list[tuple[str, int, float]] = []  # (workload, position, sent at)
        self.decided: dict[str, list[tuple[int, float]]] = {}  # workload -> (position, at)
        self.busy = 0

    async def request(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send until answered other than busy (waiting as the hub says)."""
        while True:
            msg = await self.nc.request(f"wingsmith.cmd.{verb}", orjson.dumps(body), timeout=60)
            reply: dict[str, Any] = orjson.loads(msg.data)
            if reply["ok"]:
                return reply
            if reply["error"]["code"] != "busy":
                raise RuntimeError(f"{verb}: {reply['error']}")
            self.busy += 1
            await asyncio.sleep(reply["error"]["details"]["retry_after_ms"] / 1000)

    async def setup(self) -> None:
        for c in range(CLUSTERS):
            await self.request("cluster.register", {"command_id": f"mc{c}", "cluster_id": f"bc{c}"})
            nodes = [
                {"node_id": f"bc{c}-n{n}", "device_class": "H100", "devices": PER_NODE}
                for n in range(NODES)
            ]
            inventory = {"command_id": f"mi{c}", "cluster_id": f"bc{c}", "nodes": nodes}
            await self.request("cluster.report_inventory", inventory)
        for p in range(PROJECTS):
            quota = {"command_id": f"mq{p}", "project": f"bp{p}", "device_class": "H100"}
            await self.request("project.set_quota", quota | {"devices": 100_000})
        serving = {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "backend": "vllm",
            "engine_version": "0.9.2",
            "devices_per_replica": 1,
        }

        async def create(i: int) -> None:
            body = {
                "command_id": f"mw{i}",
                "workload_id": f"bw{i}",
                "project": f"bp{i % PROJECTS}",
                "device_class": "H100",
                "serving": serving,
                "replicas": 4,
            }
            if i % 4:  # a quarter unpinned: placement chooses their clusters
                body["cluster"] = f"bc{i % CLUSTERS}"
            await self.request("workload.create", body)

        for start in range(0, self.workloads, 64):
            await asyncio.gather(*(create(i) for i in range(start, start + 64)))

    async def listen(self) -> None:
        async def on_decision(msg: nats.aio.msg.Msg) -> None:
            at = time.perf_counter()
            body = orjson.loads(msg.data)
            workload = body["aggregate_id"].partition("--")[0]
            position = body["event"]["evidence"].get("position", 0)
            self.decided.setdefault(workload, []).append((position, at))

        subject = "wingsmith.evt.deployment.*.AdmissionDecided"
        await self.nc.subscribe(subject, cb=on_decision, pending_msgs_limit=1_000_000)

    def _next(self) -> tuple[str, dict[str, Any]]:
        self.serial += 1
        n = self.serial
        if n % 2:
            return "project.set_quota", {
                "command_id": f"mq-{n}",
                "project": f"bp{n // 2 % PROJECTS}",
                "device_class": "H100",
                "devices": 100_000 + n,
            }
        k = n // 2
        workload = f"bw{k % self.workloads}"
        replicas = k // self.workloads % 4 + 1  # never what it had: it had the one before
        body = {"command_id": f"ms-{n}", "workload_id": workload, "replicas": replicas}
        return "workload.scale", body

    async def run(self, seconds: float, in_flight: int, pid: int) -> dict[str, float]:
        first = len(self.scales)
        end = time.perf_counter() + seconds
        rss: dict[str, float] = {}

        async def sample() -> None:
            await asyncio.sleep(10)
            rss["10s"] = rss_mb(pid)

        async def worker() -> None:
            while time.perf_counter() < end:
                verb, body = self._next()
                sent = time.perf_counter()
                reply = await self.request(verb, body)
                if verb == "workload.scale":
                    self.scales.append((body["workload_id"], reply["position"], sent))

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        rss["end"] = rss_mb(pid)
        if "10s" not in rss:  # a run shorter than 10 s: compare with its start
            sampler.cancel()
            rss["10s"] = rss["end"]
        lags = await self._lags(self.scales[first:])
        return {
            "scales/s": (len(self.scales) - first) / seconds,
            "p50": percentile(lags, 50),
            "p99": percentile(lags, 99),
            "rss_10s": rss["10s"],
            "rss_end": rss["end"],
        }

    async def _lags(self, scales: list[tuple[str, int, float]]) -> list[float]:
        """Seconds from each scale to the first decision for its workload at or past it; waits
        up to a minute for the last ones."""
        deadline = time.perf_counter() + 60
        while True:
            lags = [self._lag(*scale) for scale in scales]
            missing = sum(lag is None for lag in lags)
            if not missing or time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.2)
        if missing:
            print(f"    {missing} scales saw no decision after them (counted as 60 s)")
        return [60.0 if lag is None else lag for lag in lags]

    def _lag(self, workload: str, position: int, sent: float) -> float | None:
        for decided_at, at in self.decided.get(workload, ()):
            if decided_at >= position and at >= sent:
                return at - sent
        return None


async def admission(nc: Client, pid: int, workloads: int, seconds: float) -> tuple[float, float]:
    """Both runs; the worst p99 (s) and the worst RSS growth."""
    mixed = Mixed(nc, workloads)
    await mixed.listen()
    await mixed.setup()
    await asyncio.sleep(2)  # the admissions that follow the creations
    worst_p99, worst_growth = 0.0, 0.0
    for in_flight in (64, 256):
        r = await mixed.run(seconds, in_flight, pid)
        growth = r["rss_end"] / r["rss_10s"]
        print(
            f"admission, {in_flight:>3} in flight: {r['scales/s'] * 2:7,.0f} commands/s "
            f"({r['scales/s']:,.0f} scales/s)   lag p50 {r['p50']:.3f} s   p99 {r['p99']:.3f} s   "
            f"hub RSS {r['rss_10s']:.0f} MB at 10 s, {r['rss_end']:.0f} MB at the end "
            f"(x{growth:.2f})"
        )
        worst_p99, worst_growth = max(worst_p99, r["p99"]), max(worst_growth, growth)
    print(f"busy replies (retried after the hint): {mixed.busy}")
    return worst_p99, worst_growth


async def main(commands: int, aggregates: int, seconds: float, workloads: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedNatsServer(Path(tmp) / "nats") as server:
            nc = await nats.connect(server.url, pending_size=256 * 1024 * 1024)
            raw = await raw_publish_rate(nc, commands)
            print(f"raw JetStream publish_async: {raw:,.0f} msg/s ({EVENT_BYTES}-byte messages)")
            # The command path only: the projector is another consumer of the stream, which on
            # a two-core machine would compete with the hub for CPU (see docs/performance.md).
            env = os.environ | {
                "WINGSMITH_PROJECTOR": "false",
                "WINGSMITH_API_LISTEN": "127.0.0.1:0",
                "WINGSMITH_NATS_URL": server.url,
                "WINGSMITH_DATA_DIR": str(Path(tmp) / "hub"),
            }
            hub = subprocess.Popen(  # noqa: ASYNC220 - returns once forked
                [sys.executable, "-m", "wingsmith", "up"],
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
                p99, growth = await admission(nc, hub.pid, workloads, seconds)
            finally:
                hub.terminate()
                hub.wait(30)
                await nc.close()
    print(f"admission_lag_p99_s={p99:.3f}")
    print(f"hub_rss_growth={growth:.3f}")
    print(f"ingest_ratio={rates[256] / raw:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--aggregates", type=int, default=1_000)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per admission run")
    parser.add_argument("--workloads", type=int, default=1_000, help="for the admission runs")
    args = parser.parse_args()
    asyncio.run(main(args.commands, args.aggregates, args.duration, args.workloads))
