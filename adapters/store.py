"""The event store: eventsourcing's recorders with pydantic events and orjson.

SQLite by default, PostgreSQL for a `postgresql://` URL. The store is synchronous, and a SQLite
connection belongs to its thread, so callers give it one thread of its own (`StoreThread`).
Aggregates with long histories load from snapshots (adapters/snapshots.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from urllib.parse import parse_qs, unquote, urlparse

import orjson
import psycopg
from eventsourcing.application import Application
from eventsourcing.persistence import (
    IntegrityError,
    Mapper,
    Notification,
    StoredEvent,
    Transcoder,
)
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor
from eventsourcing.utils import get_topic, resolve_topic
from pydantic import BaseModel

from wingsmith.adapters.snapshots import SNAPSHOT_EVERY, SNAPSHOT_FORMAT, Snapshots
from wingsmith.domain.base import Aggregate, Event, replay

__all__ = [
    "Conflict",
    "EventStore",
    "Fenced",
    "NotWritable",
    "Notification",
    "StoreThread",
    "backup_sqlite",
    "postgres_connection",
    "store_env",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


def _nested(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise TypeError(f"cannot store a {type(obj).__name__}")


class OrjsonTranscoder(Transcoder):
    def encode(self, obj: Any) -> bytes:
        return orjson.dumps(obj, default=_nested)

    def decode(self, data: bytes) -> Any:
        return orjson.loads(data)


class PydanticMapper(Mapper[str]):
    """Stores an event's fields as JSON and rebuilds it through its own pydantic model, so
    datetimes, enums and nested values come back typed rather than as strings."""

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        # The event's own fields, without pydantic's model_dump: orjson writes datetimes, enums
        # and tuples itself and calls back only for nested models (see the transcoder).
        state = dict(domain_event.__dict__)
        del state["originator_id"], state["originator_version"]
        return StoredEvent(
            originator_id=domain_event.originator_id,
            originator_version=domain_event.originator_version,
            topic=_topic(domain_event.__class__),
            state=self.transcoder.encode(state),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        return decode_event(stored_event)


# Stored topics name an event by its module inside the package (`domain.deployment:...`), so
# the store does not depend on the name the code is installed under.
_PACKAGE = "wingsmith."


@functools.cache
def _topic(cls: Any) -> str:
    return get_topic(cls).removeprefix(_PACKAGE)


@functools.cache
def _event_class(topic: str) -> type[Event]:
    cls: type[Event] = resolve_topic(_PACKAGE + topic)
    return cls


def decode_event(stored: StoredEvent) -> Event:
    cls = _event_class(stored.topic)
    state = orjson.loads(stored.state)
    state["originator_id"] = stored.originator_id
    state["originator_version"] = stored.originator_version
    return cls.model_validate(state)


def store_env(url: str | None, data_dir: Path) -> dict[str, str]:
    """eventsourcing's settings for a store URL (None: a SQLite file in the data directory)."""
    env = {
        "ORIGINATOR_ID_TYPE": "text",
        "TRANSCODER_TOPIC": get_topic(OrjsonTranscoder),
        "MAPPER_TOPIC": get_topic(PydanticMapper),
    }
    if url is None or url.startswith("sqlite:"):
        path = urlparse(url).path if url else str(data_dir / "events.sqlite")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return env | {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "APPLICATION_RECORDER_TOPIC": get_topic(_FencedSQLiteRecorder),
            "SQLITE_DBNAME": path,
        }
    parts = urlparse(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"WINGSMITH_STORE: unsupported scheme {parts.scheme!r}")
    query = parse_qs(parts.query)
    env |= {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "APPLICATION_RECORDER_TOPIC": get_topic(_FencedPostgresRecorder),
        "POSTGRES_DBNAME": parts.path.lstrip("/") or "postgres",
        "POSTGRES_HOST": parts.hostname or "127.0.0.1",
        "POSTGRES_PORT": str(parts.port or 5432),
        "POSTGRES_USER": unquote(parts.username or os.environ.get("USER", "postgres")),
        "POSTGRES_PASSWORD": unquote(parts.password or ""),
    }
    if "schema" in query:
        env["POSTGRES_SCHEMA"] = query["schema"][0]
    return env


def postgres_connection(env: dict[str, str], *, in_schema: bool = True) -> psycopg.Connection[Any]:
    """An autocommit connection to the PostgreSQL store `store_env` describes; in its schema
    (when the URL names one) unless `in_schema` is false."""
    schema = env.get("POSTGRES_SCHEMA") if in_schema else None
    return psycopg.connect(
        dbname=env["POSTGRES_DBNAME"],
        host=env["POSTGRES_HOST"],
        port=env["POSTGRES_PORT"],
        user=env["POSTGRES_USER"],
        password=env["POSTGRES_PASSWORD"],
        autocommit=True,
        options=f"-c search_path={schema}" if schema else None,
    )


def backup_sqlite(env: dict[str, str], dest: Path) -> int:
    """Copy the SQLite store `env` names to `dest` with SQLite's online backup: one read
    transaction, so the copy is the store as it stood at one commit, however busy its writers
    (a copy of the file could miss what is still in its write-ahead log, or catch half a
    transaction). The last position in the copy."""
    source = Path(env["SQLITE_DBNAME"])
    if not source.is_file():
        raise FileNotFoundError(f"no event store at {source}")
    with (
        contextlib.closing(sqlite3.connect(source)) as db,
        contextlib.closing(sqlite3.connect(dest)) as copy,
    ):
        db.backup(copy)
        # eventsourcing's SQLite recorder numbers the notifications by rowid
        (last,) = copy.execute("SELECT MAX(rowid) FROM stored_events").fetchone()
    return int(last or 0)


class Conflict(Exception):
    """Another writer stored one of these aggregate versions first; nothing was saved."""


class Fenced(Exception):
    """A save under a fencing token the store has moved past: a newer lease holder fenced
    the store; nothing was saved."""


# The store's fence: the fencing token of the hub that holds the lease
# (services/hub/lease.py), in a table of its own beside the events. A save made under a token
# checks it in the transaction that inserts the events, so once a newer holder has raised it,
# no save of an older one can commit, however late it arrives.
FENCE_TABLE = "wingsmith_fence"
PROBE_LOCKED_FOR = 30.0  # seconds a probe write retries a SQLite database other writers lock


def _fence_check(cursor: Any, table: str, token: int | None, lock: str = "") -> None:
    if token is None:
        return
    try:
        cursor.execute(f"SELECT token FROM {table} WHERE id = 1{lock}")
        row = cursor.fetchone()
    except psycopg.errors.UndefinedTable:  # never fenced
        row = None
    except sqlite3.OperationalError as e:
        if "no such table" not in str(e):  # a locked or failing database is not a fence
            raise
        row = None
    stored = None if row is None else (row["token"] if isinstance(row, dict) else row[0])
    if stored != token:
        raise Fenced(f"the store is fenced at token {stored}, not {token}")


class _FencedSQLiteRecorder(SQLiteApplicationRecorder):
    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        ids = super()._insert_events(c, stored_events, **kwargs)
        # after the inserts: the transaction holds the database's write lock by then, so no
        # other writer (a new holder raising the fence) can commit before it ends
        _fence_check(c, FENCE_TABLE, kwargs.get("fence"))
        return ids


class _FencedPostgresRecorder(PostgresApplicationRecorder):
    def _insert_events(
        self, curs: Any, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> None:
        super()._insert_events(curs, stored_events, **kwargs)
        # a share lock on the fence's row until commit: raising it waits for this transaction
        table = f'"{self.datastore.schema}".{FENCE_TABLE}'
        _fence_check(curs, table, kwargs.get("fence"), " FOR SHARE")


class NotWritable(RuntimeError):
    """The store refuses writes: a read-only file or directory, a read-only database user or
    server, a full disk."""


class _Wingsmith(Application[str]):
    name = "Wingsmith"
    is_snapshotting_enabled = True  # a table for `Snapshots` beside the events


class EventStore:
    """Saves and reads events. Synchronous: call it from one thread (see `StoreThread`)."""

    def __init__(
        self,
        env: dict[str, str],
        *,
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_format: str = SNAPSHOT_FORMAT,
    ) -> None:
        self._app = _Wingsmith(env=env)  # keep the reference: dropping it closes the pool
        self._recorder = self._app.recorder
        assert self._app.snapshots is not None
        self.snapshots = Snapshots(self._app.snapshots, snapshot_every, snapshot_format)

    def save(self, events: Sequence[Event], fence: int | None = None) -> list[Notification]:
        """Append events in one transaction; `Conflict` when a version is taken. With a
        `fence`, only if the store's fence is at that token (`Fenced` if not)."""
        if not events:
            return []
        try:
            return [r.notification for r in self._app.events.put(events, fence=fence)]
        except IntegrityError as e:
            raise Conflict(str(e)) from e

    def fence(self, token: int) -> int:
        """Raise the store's fence to `token` (never lower it); the fence as it then stands.
        Waits for saves under the fence as it stood to commit or roll back."""
        datastore: Any = self._recorder.datastore  # type: ignore[attr-defined]
        table = self._table(FENCE_TABLE)
        with datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, token BIGINT)"
            )
        with datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"INSERT INTO {table} VALUES (1, {int(token)}) ON CONFLICT (id) DO UPDATE "
                f"SET token = excluded.token WHERE {table}.token < excluded.token"
            )
            cursor.execute(f"SELECT token FROM {table} WHERE id = 1")
            row = cursor.fetchone()
        return int(row["token"] if isinstance(row, dict) else row[0])

    def _table(self, name: str) -> str:
        """A table of ours, in the PostgreSQL store's schema."""
        datastore: Any = self._recorder.datastore  # type: ignore[attr-defined]
        schema = getattr(datastore, "schema", None)
        return f'"{schema}".{name}' if schema else name

    def history(self, aggregate_id: str) -> list[Event]:
        return list(self._app.events.get(aggregate_id))  # type: ignore[arg-type]

    def load(self, aggregate_id: str) -> Aggregate | None:
        """Rebuild an aggregate from its latest snapshot and the events after it, or from its
        whole history. Only a history of `snapshots.every` events or more can have a
        snapshot, so a shorter one (most, and every aggregate not yet created) costs one read."""
        every = self.snapshots.every
        head = self._recorder.select_events(aggregate_id, limit=every)
        if len(head) < every:
            return replay(list(map(decode_event, head)))
        snapshot = self.snapshots.latest(aggregate_id)
        if snapshot is not None:
            # from the snapshot's own version on: that event must be stored for it to serve
            tail = self._recorder.select_events(aggregate_id, gt=snapshot.version - 1)
            if tail and tail[0].originator_version == snapshot.version:
                return replay(list(map(decode_event, tail[1:])), snapshot)
            log.warning("passing over the snapshot of %s: it is ahead of the store", aggregate_id)
            self.snapshots.forget(aggregate_id)
        rest = self._recorder.select_events(aggregate_id, gt=head[-1].originator_version)
        return replay(list(map(decode_event, [*head, *rest])))

    def take_snapshots(self, aggregates: Iterable[Aggregate]) -> None:
        """Snapshot each aggregate whose history has grown `snapshots.every` events past its
        last snapshot: called with a commit's aggregates once they are saved."""
        for aggregate in aggregates:
            if self.snapshots.due(aggregate):
                self.snapshots.save(aggregate)

    def version(self, aggregate_id: str) -> int:
        """The aggregate's latest stored version (0 when it has none)."""
        last = self._recorder.select_events(aggregate_id, desc=True, limit=1)
        return last[0].originator_version if last else 0

    def read(
        self,
        after: int,
        limit: int,
        stop: int | None = None,
        types: Sequence[type[Event]] = (),
    ) -> list[Notification]:
        """Notifications with positions in (after, stop], in store order; only events of
        `types` when some are given."""
        topics = [_topic(t) for t in types]
        return list(
            self._recorder.select_notifications(
                after, limit, stop=stop, topics=topics, inclusive_of_start=False
            )
        )

    def last_position(self) -> int:
        return self._recorder.max_notification_id() or 0

    def probe_write(self) -> None:
        """Write and commit one row of a table of its own (`wingsmith_probe`), the way every
        command's events are written; `NotWritable` says why not. Opening a SQLite file that
        cannot be written succeeds, and so do reads: only a write tells."""
        datastore: Any = self._recorder.datastore  # type: ignore[attr-defined]
        table = self._table("wingsmith_probe")
        deadline = time.monotonic() + PROBE_LOCKED_FOR
        while True:
            try:
                # two transactions, as `fence` writes: one that read the schema before writing
                # would be answered "locked" at once, not waited for, whenever another
                # connection wrote in between (SQLite in WAL mode)
                with datastore.transaction(commit=True) as cursor:
                    cursor.execute(
                        f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, at TEXT)"
                    )
                with datastore.transaction(commit=True) as cursor:
                    cursor.execute(
                        f"INSERT INTO {table} VALUES (1, CAST(CURRENT_TIMESTAMP AS TEXT)) "
                        "ON CONFLICT (id) DO UPDATE SET at = excluded.at"
                    )
                return
            except Exception as e:
                # a lock another hub holds past SQLite's busy timeout: not a store that cannot
                # be written
                if "database is locked" in str(e) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise NotWritable(str(e) or type(e).__name__) from e

    def close(self) -> None:
        self._app.close()


class StoreThread:
    """One thread for all store work: SQLite connections are bound to their thread."""

    def __init__(self, store: EventStore, executor: ThreadPoolExecutor) -> None:
        self.store = store
        self._executor = executor

    @classmethod
    async def open(cls, env: dict[str, str]) -> StoreThread:
        """Open the store on its own thread, where every later call will run."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wingsmith-store")
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(executor, EventStore, env)
        return cls(store, executor)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def close(self) -> None:
        await self.run(self.store.close)
        self._executor.shutdown(wait=True)
