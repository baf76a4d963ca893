"""A hub whose event store cannot be written refuses to start, saying which store and why,
instead of saying "ready" and then refusing every command."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import EventStore, NotWritable, store_env
from wingsmith.services.config import Settings
from wingsmith.services.hub.owner import DataDirUnusable
from wingsmith.services.hub.wiring import running_hub


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
            [sys.executable, "-m", "wingsmith", "up", "--no-api"],
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


async def test_a_read_only_data_directory_stops_the_hub(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "hub"
    data_dir.mkdir()
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=data_dir)
    with read_only(data_dir), pytest.raises(DataDirUnusable, match="cannot be written"):
        async with running_hub(settings):
            pytest.fail("the hub started in a directory it cannot write")


def test_the_write_probe_passes_on_a_writable_store(store_url: str) -> None:
    store = EventStore(store_env(store_url, Path("/nonexistent")))
    try:
        store.probe_write()
        store.probe_write()  # the same row again
    finally:
        store.close()


@pytest.mark.postgres
async def test_a_read_only_postgres_user_stops_the_hub(
    pg_url: str, nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    import psycopg

    EventStore(store_env(pg_url, tmp_path)).close()  # the tables exist
    role = f"ws_ro_{uuid.uuid4().hex[:8]}"
    schema = parse_qs(urlparse(pg_url).query)["schema"][0]
    admin = pg_url.split("?")[0]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
        conn.execute(f"GRANT ALL ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}")
    try:
        url = urlparse(pg_url)._replace(netloc=f"{role}@{urlparse(pg_url).hostname}:5432")
        settings = Settings(nats_url=nats_server.url, store_url=url.geturl(), data_dir=tmp_path)
        with pytest.raises(NotWritable, match="read-only transaction") as refused:
            async with running_hub(settings):
                pytest.fail("the hub started on a store it cannot write")
        assert "event store postgresql://" in str(refused.value)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
