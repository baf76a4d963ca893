"""A hub whose event store cannot be written refuses to start, saying which store and why,
instead of saying "ready" and then refusing every command."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.nats_server import EmbeddedNatsServer
from adapters.store import EventStore, NotWritable, store_env
from services.bootstrap import running_hub
from services.config import Settings


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` cannot be written, even by root (who ignores permission bits): immutable."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: cannot make a file read-only")
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"chattr +i is not supported here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def existing_store(data_dir: Path) -> Path:
    EventStore(store_env(None, data_dir)).close()
    return data_dir / "events.sqlite"


def test_a_read_only_store_file_stops_wingsmith_up_with_a_clear_message(
    nats_server: EmbeddedNatsServer, env: dict[str, str], tmp_path: Path
) -> None:
    data_dir = Path(env["WINGSMITH_DATA_DIR"])
    store = existing_store(data_dir)
    with read_only(store):
        up = subprocess.run(
            [sys.executable, "-m", "services.cli", "up", "--no-api"],
            env=env | {"WINGSMITH_NATS_URL": nats_server.url},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert up.returncode == 2
    assert "ready" not in up.stdout
    assert f"wingsmith: the event store {store} cannot be written" in up.stderr
    assert "readonly database" in up.stderr
    assert "Traceback" not in up.stderr


async def test_a_read_only_store_directory_stops_the_hub(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "hub"
    data_dir.mkdir()
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=data_dir)
    with read_only(data_dir), pytest.raises(NotWritable, match="cannot open the event store"):
        async with running_hub(settings):
            pytest.fail("the hub started on a store it cannot create")
