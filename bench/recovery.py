"""Recovery: a restarted hub's time to its first admission decision, as the history grows.

**Method.** For each size (100,000 and 1,000,000 events by default) a steady fleet with a long
history is written straight into a SQLite event store, as `bench/replay.py` writes it (20
clusters, 5 projects, 500 workloads; then churn, so the fleet's live state stays the same size
while its history grows). A nats-server of the bench's own runs for the whole size, so the
streams outlive the hub as they do in production.

The hub (`wingsmith up --no-api`, its own process, the embedded defaults otherwise: relay,
projector and scheduler on) starts once and is left to catch up with the whole store: the relay
publishes it, the projector projects it, the scheduler folds it (that first start is timed and
printed, not counted). It is stopped, then restarted `--rounds` times. Each restart is timed
from the start of the process to the first `AdmissionDecided` of a new workload: a
`workload.create` pinned to a cluster, sent as soon as the hub answers (the hub is asked again
until it does), with a subscription to the deployment's admission events made before the start.
Between restarts the hub is left to catch up again and stopped.

The baseline is the same restart over the smaller history, in the same run: the last line is
`recovery_ratio=<median restart at the largest size / median restart at the smallest>`. A
restart that folded the whole history again would scale with it (ten times the events).

Before the hub first starts, for each size, the project with the longest history (quota churn)
is loaded in this process, `--rounds` times each way, and the medians printed: replayed from its
whole history (`replay(EventStore.history(...))`, the baseline), with `EventStore.load` before
it has a snapshot, and with `EventStore.load` from a snapshot `SNAPSHOT_EVERY - 1` events back
(the most events a load replays after one). At the largest size the line
`snapshot_load_ratio=<load from the snapshot / full replay>` follows. `--loads-only` skips the
hub.

    python bench/recovery.py [--sizes 100000 1000000] [--rounds 3] [--loads-only]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replay import PROJECTS, write_history  # bench/replay.py, beside this file

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.snapshots import SNAPSHOT_EVERY
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain.base import Aggregate, replay
from wingsmith.domain.names import HEALTH_SUBJECT
from wingsmith.domain.subjects import event_subject

ROOT = Path(__file__).resolve().parent.parent
CLUSTER, PROJECT = "gpu-00", "research"  # in the written fleet
SERVING = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "backend": "vllm",
    "engine_version": "0.9.2",
    "devices_per_replica": 1,
}


def hub_env(data_dir: Path, nats_url: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WINGSMITH_PROJECTOR", "WINGSMITH_STORE", "WINGSMITH_NO_RELAY")
    }
    return env | {"WINGSMITH_NATS_URL": nats_url, "WINGSMITH_DATA_DIR": str(data_dir)}


def start_hub(env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = Path(env["WINGSMITH_DATA_DIR"]).parent / "hub.log"  # the hub's own, looked at on failure
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "wingsmith", "up", "--no-api"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=ROOT,
        )


def stop_hub(hub: subprocess.Popen[bytes]) -> None:
    hub.terminate()
    if hub.wait(120) != 0:
        raise RuntimeError(f"the hub exited with {hub.returncode}")


async def health(nc: Client) -> dict[str, Any] | None:
    try:
        return orjson.loads((await nc.request(HEALTH_SUBJECT, b"", timeout=5)).data)  # type: ignore[no-any-return]
    except (NoRespondersError, NatsTimeout):
        return None


async def caught_up(nc: Client, hub: subprocess.Popen[bytes]) -> None:
    """Until the relay, the projector and the scheduler are all at the store's position."""
    stages = {"relay", "projector", "scheduler"}
    while True:
        if hub.poll() is not None:
            raise RuntimeError(f"the hub exited with {hub.returncode}")
        report = await health(nc)
        if report is not None:
            at = {c["stage"]: c for c in report["checks"] if c["stage"] in stages}
            if len(at) == len(stages) and all(
                c["lag"] == 0 and c["position"] is not None for c in at.values()
            ):
                return
        await asyncio.sleep(0.5)


async def first_decision(nc: Client, name: str) -> tuple[float, float]:
    """Seconds until the hub accepts `workload.create` for `name`, and until its deployment's
    first admission decision is published."""
    started = time.perf_counter()
    decided = asyncio.get_running_loop().create_future()
    subject = event_subject("deployment", f"{name}--{CLUSTER}", "AdmissionDecided")

    async def on_decision(msg: Msg) -> None:
        if not decided.done():
            decided.set_result(None)

    sub = await nc.subscribe(subject, cb=on_decision)
    await nc.flush()
    body = orjson.dumps(
        {
            "command_id": f"create-{name}",
            "workload_id": name,
            "project": PROJECT,
            "device_class": "H100",
            "serving": SERVING,
            "replicas": 1,
            "cluster": CLUSTER,
        }
    )
    while True:
        try:
            reply = orjson.loads((await nc.request("wingsmith.cmd.workload.create", body, 5)).data)
        except (NoRespondersError, NatsTimeout):
            await asyncio.sleep(0.02)
            continue
        if not reply["ok"]:
            raise RuntimeError(f"workload.create: {reply['error']}")
        break
    accepted = time.perf_counter() - started
    async with asyncio.timeout(600):
        await decided
    await sub.unsubscribe()
    return accepted, time.perf_counter() - started


def timed(load: Callable[[], Aggregate | None], rounds: int) -> tuple[float, Aggregate | None]:
    """The median seconds a load takes, and what it loaded."""
    times, loaded = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        loaded = load()
        times.append(time.perf_counter() - started)
    return statistics.median(times), loaded


def project_loads(store: EventStore, rounds: int) -> float:
    """Load the longest project history each way; returns from-a-snapshot / full replay."""
    agg_id = max((f"project:{name}" for name in PROJECTS), key=store.version)
    events = store.history(agg_id)
    full, replayed = timed(lambda: replay(store.history(agg_id)), rounds)
    unsnapshotted, loaded = timed(lambda: store.load(agg_id), rounds)
    back = replay(events[: len(events) - SNAPSHOT_EVERY + 1])
    assert back is not None and store.snapshots.save(back)
    snapshotted, from_snapshot = timed(lambda: store.load(agg_id), rounds)
    assert replayed == loaded == from_snapshot, "a load differs from the full replay"
    print(
        f"  {agg_id}, {len(events):,} events: full replay {full * 1000:.1f} ms; load without "
        f"a snapshot {unsnapshotted * 1000:.1f} ms ({unsnapshotted / full:.3f}), from a snapshot "
        f"{SNAPSHOT_EVERY - 1} events back {snapshotted * 1000:.1f} ms ({snapshotted / full:.3f})"
    )
    return snapshotted / full


async def restarts(size: int, rounds: int, loads_only: bool) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory(prefix="wingsmith-recovery-") as tmp:
        data_dir = Path(tmp) / "hub"
        store = EventStore(store_env(None, data_dir))
        try:
            write_history(store, size)
            load_ratio = project_loads(store, rounds)
        finally:
            store.close()
        if loads_only:
            return [], load_ratio
        async with EmbeddedNatsServer(Path(tmp) / "nats") as server:
            env = hub_env(data_dir, server.url)
            nc = await nats.connect(server.url)
            try:
                started = time.perf_counter()
                hub = start_hub(env)
                await caught_up(nc, hub)
                first = time.perf_counter() - started
                print(f"  first start, caught up with the store: {first:.1f} s")
                stop_hub(hub)
                times = []
                for k in range(rounds):
                    started = time.perf_counter()
                    hub = start_hub(env)
                    accepted, decided = await first_decision(nc, f"probe-{k}")
                    times.append(decided)
                    print(
                        f"  restart {k + 1}: command accepted after {accepted:.2f} s, "
                        f"first admission decision after {decided:.2f} s"
                    )
                    await caught_up(nc, hub)
                    stop_hub(hub)
            finally:
                await nc.close()
    return times, load_ratio


def main(args: argparse.Namespace) -> None:
    medians = []
    for size in args.sizes:
        print(f"history of {size:,} events")
        times, load_ratio = asyncio.run(restarts(size, args.rounds, args.loads_only))
        if args.loads_only:
            continue
        median = statistics.median(times)
        medians.append(median)
        spread = f"{min(times):.2f}-{max(times):.2f}"
        print(f"  restart -> first decision: median {median:.2f} s ({spread})")
    print(f"snapshot_load_ratio={load_ratio:.3f}")
    if medians:
        print(f"recovery_ratio={medians[-1] / medians[0]:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loads-only", action="store_true", help="time the project loads only")
    main(parser.parse_args())
