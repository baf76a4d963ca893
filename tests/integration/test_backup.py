"""`wingsmith backup` while commands flow, restored into a new data directory: the restored
hub's views equal a rebuild of the copy (`wingsmith replay`) and the original hub's views."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import orjson
from nats.aio.client import Client

from wingsmith.adapters import nats_bus
from wingsmith.adapters.checkpoints import Checkpoint, CheckpointStore
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain import names
from wingsmith.projections.fleet import PROJECTIONS

WINGSMITH = [sys.executable, "-m", "wingsmith"]
Views = dict[str, dict[str, tuple[int, bytes | None]]]


async def wingsmith(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *WINGSMITH, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def running_hub(env: dict[str, str], *args: str) -> AsyncIterator[Client]:
    """`wingsmith up` in a process of its own, and a connection to its NATS server."""
    process = await asyncio.create_subprocess_exec(
        *WINGSMITH, "up", "--no-api", *args, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            while b"wingsmith hub ready" not in (line := await process.stdout.readline()):
                assert line, "the hub ended before it was ready"
        url = (Path(env["WINGSMITH_DATA_DIR"]) / "nats.url").read_text()
        nc = await nats.connect(url)
        try:
            yield nc
        finally:
            await nc.close()
    finally:
        process.terminate()
        async with asyncio.timeout(30):
            assert await process.wait() == 0


async def send(nc: Client, verb: str, body: dict[str, Any]) -> None:
    msg = await nc.request(f"wingsmith.cmd.{verb}", orjson.dumps(body), timeout=30)
    reply = orjson.loads(msg.data)
    assert reply["ok"], reply


def workload(n: int) -> dict[str, Any]:
    return {
        "command_id": f"create-{n}",
        "workload_id": f"w{n}",
        "project": "team",
        "device_class": "H100",
        "replicas": 1 + n % 3,
        "serving": {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "backend": "vllm",
            "runtime_release": "1.0.1",
            "devices_per_replica": 1,
        },
    }


async def commands(nc: Client, backed_up: asyncio.Event) -> int:
    """Workloads created and scaled, one command after the other, until some time after the
    backup; how many were created."""
    quota = {"command_id": "quota", "project": "team", "device_class": "H100", "devices": 24}
    await send(nc, "project.set_quota", quota)
    n, after = 0, 20
    while after:
        await send(nc, "workload.create", workload(n))
        if n % 4 == 3:
            scale = {"command_id": f"scale-{n}", "workload_id": f"w{n - 2}", "replicas": 1}
            await send(nc, "workload.scale", scale)
        n += 1
        after -= backed_up.is_set()
    return n


def backed_up_to(copy: Path, scratch: Path) -> int:
    """The last position in a backup."""
    store = EventStore(store_env(f"sqlite:{copy}", scratch))
    try:
        return store.last_position()
    finally:
        store.close()


async def events(nc: Client, upto: int) -> list[tuple[int, int]]:
    """Each message's stream sequence and store position on WINGSMITH_EVENTS, up to `upto`."""
    found = []
    subject = names.every(names.EVENTS)
    async for m in nats_bus.read_stream(nc, names.EVENTS_STREAM, subject, follow=False):
        position = int(m.headers[nats_bus.POSITION_HEADER])
        if position <= upto:
            found.append((m.seq, position))
    return found


async def served_views(env: dict[str, str], nc: Client) -> Views:
    """Every projection's views once the projector has applied the whole store (`replay`
    waits for it, and must find them equal to a rebuild)."""
    code, out, err = await wingsmith(env, "replay")
    assert code == 0 and "the live views equal the rebuild" in out, out + err
    return {p.name: await nats_bus.latest_views(nc, p.name) for p in PROJECTIONS}


async def test_a_backup_taken_online_restores_every_view(
    tmp_path: Path, env: dict[str, str]
) -> None:
    original = env | {"WINGSMITH_CHECKPOINT_SECONDS": "0.2", "WINGSMITH_CLUSTER_SILENCE": "3600"}
    copy = tmp_path / "backup.sqlite"
    async with running_hub(original, "--simulated", "east=2x8:H100") as nc:
        backed_up = asyncio.Event()
        flow = asyncio.create_task(commands(nc, backed_up))
        while (await nats_bus.projector_progress(nc) or {}).get("position", 0) < 60:
            await asyncio.sleep(0.2)  # some views published, and checkpointed (0.2 s)
        code, out, err = await wingsmith(original, "backup", str(copy))
        assert code == 0, out + err
        assert not flow.done(), "the commands ended before the backup did"
        last = backed_up_to(copy, tmp_path)
        assert f"events up to position {last:,}" in out
        backed_up.set()
        assert await flow > 20
        before = await served_views(original, nc)
        published = await events(nc, last)
        again = await wingsmith(original, "backup", str(copy))
        assert again[0] == 2 and f"DEST: {copy} exists already" in again[2]

    restored_dir = tmp_path / "restored"
    restored_dir.mkdir()
    shutil.copy(copy, restored_dir / "events.sqlite")
    restored = env | {"WINGSMITH_DATA_DIR": str(restored_dir), "WINGSMITH_CLUSTER_SILENCE": "3600"}
    async with running_hub(restored) as nc:
        after = await served_views(restored, nc)
        # the relay published the restored store again, onto the new server's empty stream
        assert await events(nc, last) == published

    # every view as the original served it at the backup's last position, the restored hub
    # serves too, unless it has moved on since (deciding what the backup caught undecided)
    compared = moved_on = 0
    for name, views in before.items():
        for key, (position, payload) in views.items():
            if position > last:
                continue  # changed after the backup
            assert key in after[name], (name, key)
            if after[name][key][0] > last:
                moved_on += 1
                continue
            assert after[name][key] == (position, payload), (name, key)
            compared += 1
    assert compared > 100 and moved_on < compared / 10, (compared, moved_on)
    assert 0 < last < max(p for views in before.values() for p, _ in views.values())


async def test_a_postgresql_store_is_backed_up_with_pg_dump(env: dict[str, str]) -> None:
    pg = env | {"WINGSMITH_STORE": "postgresql://postgres@127.0.0.1:5432/test"}
    code, _, err = await wingsmith(pg, "backup", "copy.sqlite")
    assert code == 2 and "PostgreSQL" in err and "pg_dump" in err


def test_checkpoints_from_before_streams_were_recorded_still_read(tmp_path: Path) -> None:
    env = store_env(None, tmp_path)
    with contextlib.closing(sqlite3.connect(env["SQLITE_DBNAME"])) as db, db:
        db.execute(  # the table as earlier versions made it
            "CREATE TABLE wingsmith_checkpoints (projection TEXT, position BIGINT, "
            "stream_seq BIGINT, event_time TEXT, state BLOB, PRIMARY KEY (projection, position))"
        )
        db.execute(
            "INSERT INTO wingsmith_checkpoints VALUES ('capacity', 7, 5, ?, ?)",
            ("2026-12-01T00:00:00+00:00", b"{}"),
        )
    checkpoints = CheckpointStore(env)
    try:
        old = checkpoints.latest("capacity")
        assert old is not None and (old.position, old.streams) == (7, "")
        when = datetime(2026, 12, 1, 1, tzinfo=UTC)
        checkpoints.save([Checkpoint("capacity", 9, 6, when, {}, "WINGSMITH_PROJ@t")])
        assert checkpoints.latest("capacity") == Checkpoint(
            "capacity", 9, 6, when, {}, "WINGSMITH_PROJ@t"
        )
    finally:
        checkpoints.close()
