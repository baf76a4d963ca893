"""Projection checkpoints, beside the events in the same database.

A checkpoint is a projection's whole state at one store position, with the stream sequence and
the event time of that position. The latest one lets a projector resume exactly where its state
left off; older ones are kept, with their event times, as starting points for answering a view
as of a past time. Checkpoints of all projections are written in one transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg

_COLUMNS = "projection, position, stream_seq, event_time, state"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    projection: str
    position: int
    stream_seq: int
    event_time: datetime
    state: dict[str, Any]


class CheckpointStore:
    """Synchronous, like the event store: use it from the store's thread."""

    def __init__(self, env: dict[str, str]) -> None:
        self._sqlite = env["PERSISTENCE_MODULE"].endswith("sqlite")
        if self._sqlite:
            self._db: Any = sqlite3.connect(
                env["SQLITE_DBNAME"], isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._param = "?"
            blob, timestamp = "BLOB", "TEXT"
        else:
            self._db = psycopg.connect(
                dbname=env["POSTGRES_DBNAME"],
                host=env["POSTGRES_HOST"],
                port=env["POSTGRES_PORT"],
                user=env["POSTGRES_USER"],
                password=env["POSTGRES_PASSWORD"],
                autocommit=True,
                options=f"-c search_path={env['POSTGRES_SCHEMA']}"
                if "POSTGRES_SCHEMA" in env
                else None,
            )
            self._param = "%s"
            blob, timestamp = "BYTEA", "TIMESTAMPTZ"
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS wingsmith_checkpoints ("
            f"projection TEXT, position BIGINT, stream_seq BIGINT, event_time {timestamp}, "
            f"state {blob}, PRIMARY KEY (projection, position))"
        )

    def save(self, checkpoints: list[Checkpoint]) -> None:
        p = self._param
        rows = [
            (
                c.projection,
                c.position,
                c.stream_seq,
                _time(c.event_time, self._sqlite),
                orjson.dumps(c.state),
            )
            for c in checkpoints
        ]
        sql = (
            f"INSERT INTO wingsmith_checkpoints ({_COLUMNS}) VALUES ({p}, {p}, {p}, {p}, {p}) "
            "ON CONFLICT (projection, position) DO NOTHING"
        )
        if self._sqlite:
            with self._db:  # one transaction
                self._db.execute("BEGIN")
                self._db.executemany(sql, rows)
        else:
            with self._db.transaction(), self._db.cursor() as cur:
                cur.executemany(sql, rows)

    def latest(self, projection: str) -> Checkpoint | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM wingsmith_checkpoints WHERE projection = {self._param} "
            "ORDER BY position DESC LIMIT 1",
            [projection],
        ).fetchone()
        if row is None:
            return None
        event_time = datetime.fromisoformat(row[3]) if self._sqlite else row[3]
        return Checkpoint(row[0], row[1], row[2], event_time, orjson.loads(bytes(row[4])))

    def close(self) -> None:
        self._db.close()


def _time(t: datetime, as_text: bool) -> Any:
    # ISO strings in UTC sort as times do, which is all SQLite needs
    return t.astimezone(UTC).isoformat() if as_text else t
