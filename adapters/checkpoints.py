"""Projection checkpoints, beside the events in the same database.

A checkpoint is a projection's whole state at one store position, with the stream sequence and
the event time of that position, and the identity of the NATS streams its views were published
to (a store restored beside new, empty streams holds checkpoints of streams that are gone). The
latest one lets a projector resume exactly where its state left off; older ones are kept, with
their event times, as starting points for answering a view as of a past time. Checkpoints of
all projections are written in one transaction.

The scheduler's ledger (`domain/admission.py`) is kept here too, the latest one only, so that
a restarted hub folds the events since it rather than the whole history.

Retention: the latest two, one per hour of event time for the last two days, and one per day
before that; an as-of answer then folds at most an hour (a day, further back) of events.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from wingsmith.adapters.store import postgres_connection

_COLUMNS = "projection, position, stream_seq, event_time, state, streams"
KEEP_LATEST = 2
HOURLY_FOR = timedelta(days=2)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    projection: str
    position: int
    stream_seq: int
    event_time: datetime
    state: dict[str, Any]
    streams: str = ""  # the view streams' identity (ViewSink.streams); "": not recorded


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
            self._db = postgres_connection(env)
            self._param = "%s"
            blob, timestamp = "BYTEA", "TIMESTAMPTZ"
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS wingsmith_checkpoints ("
            f"projection TEXT, position BIGINT, stream_seq BIGINT, event_time {timestamp}, "
            f"state {blob}, streams TEXT, PRIMARY KEY (projection, position))"
        )
        self._add_streams_column()
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS wingsmith_ledger ("
            f"id INTEGER PRIMARY KEY, position BIGINT, format TEXT, state {blob})"
        )

    def _add_streams_column(self) -> None:
        """Checkpoints written before streams were recorded have no such column: add it (their
        rows read as "", not recorded)."""
        if not self._sqlite:
            self._db.execute(
                "ALTER TABLE wingsmith_checkpoints ADD COLUMN IF NOT EXISTS streams TEXT"
            )
            return
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(wingsmith_checkpoints)")}
        if "streams" not in columns:
            with contextlib.suppress(sqlite3.OperationalError):  # another process added it
                self._db.execute("ALTER TABLE wingsmith_checkpoints ADD COLUMN streams TEXT")

    def save(self, checkpoints: list[Checkpoint]) -> None:
        p = self._param
        rows = [
            (
                c.projection,
                c.position,
                c.stream_seq,
                _time(c.event_time, self._sqlite),
                orjson.dumps(c.state),
                c.streams,
            )
            for c in checkpoints
        ]
        sql = (  # one at the same position replaces it: a new version of the projection saved it
            f"INSERT INTO wingsmith_checkpoints ({_COLUMNS}) VALUES ({p}, {p}, {p}, {p}, {p}, {p}) "
            "ON CONFLICT (projection, position) DO UPDATE SET stream_seq = excluded.stream_seq, "
            "event_time = excluded.event_time, state = excluded.state, streams = excluded.streams"
        )
        stale = [(c.projection, position) for c in checkpoints for position in self._stale(c)]
        delete = f"DELETE FROM wingsmith_checkpoints WHERE projection = {p} AND position = {p}"
        if self._sqlite:
            with self._db:  # one transaction
                self._db.execute("BEGIN")
                self._db.executemany(sql, rows)
                self._db.executemany(delete, stale)
        else:
            with self._db.transaction(), self._db.cursor() as cur:
                cur.executemany(sql, rows)
                cur.executemany(delete, stale)

    def _stale(self, newest: Checkpoint) -> list[int]:
        """Positions of this projection's checkpoints that retention drops once `newest` is in:
        all but the first of each period, sparing the latest ones."""
        rows = self._db.execute(
            "SELECT position, event_time FROM wingsmith_checkpoints "
            f"WHERE projection = {self._param} ORDER BY position",
            [newest.projection],
        ).fetchall()
        spared = {position for position, _ in rows[len(rows) - (KEEP_LATEST - 1) :]}
        seen: set[datetime] = set()
        stale = []
        for position, event_time in rows:
            at = self._read_time(event_time)
            period = at.replace(minute=0, second=0, microsecond=0)
            if newest.event_time - at >= HOURLY_FOR:
                period = period.replace(hour=0)
            if period in seen and position not in spared:
                stale.append(position)
            seen.add(period)
        return stale

    def latest(self, projection: str) -> Checkpoint | None:
        return self._one(projection, "", [])

    def before(self, projection: str, when: datetime) -> Checkpoint | None:
        """The latest checkpoint whose event time is not after `when`."""
        return self._one(
            projection, f"AND event_time <= {self._param}", [_time(when, self._sqlite)]
        )

    def _one(self, projection: str, where: str, params: list[Any]) -> Checkpoint | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM wingsmith_checkpoints WHERE projection = {self._param} "
            f"{where} ORDER BY position DESC LIMIT 1",
            [projection, *params],
        ).fetchone()
        if row is None:
            return None
        return Checkpoint(
            row[0],
            row[1],
            row[2],
            self._read_time(row[3]),
            orjson.loads(bytes(row[4])),
            row[5] or "",
        )

    def save_ledger(self, position: int, format: str, state: bytes) -> None:
        """The scheduler's ledger as of `position`, replacing the one before (one is kept:
        the ledger is never asked for as of a past time)."""
        p = self._param
        self._db.execute(
            f"INSERT INTO wingsmith_ledger VALUES (1, {p}, {p}, {p}) ON CONFLICT (id) DO UPDATE "
            "SET position = excluded.position, format = excluded.format, state = excluded.state",
            [position, format, state],
        )

    def ledger(self, format: str) -> tuple[int, bytes] | None:
        """The scheduler's latest ledger and its position, if it was saved in `format`."""
        row = self._db.execute(
            f"SELECT position, state FROM wingsmith_ledger WHERE id = 1 AND format = {self._param}",
            [format],
        ).fetchone()
        return (row[0], bytes(row[1])) if row is not None else None

    def _read_time(self, value: Any) -> datetime:
        return datetime.fromisoformat(value) if self._sqlite else value

    def close(self) -> None:
        self._db.close()


def _time(t: datetime, as_text: bool) -> Any:
    # ISO strings in UTC sort as times do, which is all SQLite needs
    return t.astimezone(UTC).isoformat() if as_text else t
