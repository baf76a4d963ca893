"""Fixtures shared by every test: real servers, real stores, and a guard against leaked tasks."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from wingsmith.adapters.nats_server import EmbeddedNatsServer

PG_URL = os.environ.get("WINGSMITH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running behind it."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if not t.done()]
    leaked = [t for t in leaked if t is not asyncio.current_task()]
    for task in leaked:
        task.cancel()
    assert not leaked, f"leaked tasks: {[t.get_name() for t in leaked]}"


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[EmbeddedNatsServer]:
    async with EmbeddedNatsServer(tmp_path / "nats") as server:
        yield server


def postgres_reachable() -> str | None:
    """None when reachable, else why not."""
    try:
        import psycopg

        with psycopg.connect(PG_URL, connect_timeout=2):
            return None
    except Exception as e:
        return f"PostgreSQL not reachable at {PG_URL}: {e}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A store URL on a fresh PostgreSQL schema, dropped afterwards."""
    why = postgres_reachable()
    if why:
        pytest.skip(why)
    import psycopg

    schema = f"ws_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store test runs against the SQLite default and against PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'events.sqlite'}"
    return str(request.getfixturevalue("pg_url"))
