"""Aggregates with long histories load from snapshots, against SQLite and PostgreSQL alike:
equal to their full replay, written as histories grow, passed over when another version of the
code wrote them or they cannot be read; commands after a restart and rollbacks decide on the
same state as before."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wingsmith.adapters.snapshots import SNAPSHOT_EVERY, SNAPSHOT_FORMAT
from wingsmith.adapters.store import EventStore, postgres_connection, store_env
from wingsmith.domain.base import Cause, replay
from wingsmith.domain.project import Project
from wingsmith.services.hub.service import LRU, Executor, UnitOfWork

from .test_executor import command, replies

CAUSE = Cause(command_id="c", correlation_id="c", at=datetime(2026, 12, 5, tzinfo=UTC))
PROJECT = "project:research"


@pytest.fixture
def env(store_url: str, tmp_path: Path) -> dict[str, str]:
    return store_env(store_url, tmp_path)


@contextlib.contextmanager
def opened(env: dict[str, str], **options: Any) -> Iterator[EventStore]:
    store = EventStore(env, **options)
    try:
        yield store
    finally:
        store.close()


def grow(store: EventStore, project: Project, events: int) -> None:
    """Record `events` quota changes on the project and save them, a hundred at a time."""
    for n in range(events):
        project.set_quota(CAUSE, f"class-{n % 3}", n + 1)
        if len(project.pending) == 100 or n == events - 1:
            store.save(project.collect_events())


def long_project(store: EventStore, events: int) -> Project:
    project = Project.register(CAUSE, "research")
    store.save(project.collect_events())
    grow(store, project, events - 1)
    return project


def plant(env: dict[str, str], version: int, topic: str, state: bytes) -> None:
    """A row in the snapshot table under this code's key for the project, as a bug or a
    damaged disk might leave it."""
    row = (f"{SNAPSHOT_FORMAT}:{PROJECT}", version, topic, state)
    if "SQLITE_DBNAME" in env:
        with contextlib.closing(sqlite3.connect(env["SQLITE_DBNAME"])) as db, db:
            db.execute("INSERT INTO stored_snapshots VALUES (?, ?, ?, ?)", row)
        return
    with postgres_connection(env) as conn:
        conn.execute("INSERT INTO wingsmith_snapshots VALUES (%s, %s, %s, %s)", row)


def test_a_long_history_loads_from_its_snapshot_equal_to_its_full_replay(
    env: dict[str, str],
) -> None:
    with opened(env) as store:
        project = long_project(store, 1_250)
        store.take_snapshots([project])
        grow(store, project, 30)
    with opened(env) as restarted:
        assert restarted.snapshots.latest(PROJECT).version == 1_250  # type: ignore[union-attr]
        loaded = restarted.load(PROJECT)
        assert loaded == project == replay(restarted.history(PROJECT))
        assert loaded is not None and loaded.version == 1_280 and not loaded.pending


def test_loading_reads_the_snapshot_not_the_events_before_it(env: dict[str, str]) -> None:
    with opened(env) as store:
        project = long_project(store, SNAPSHOT_EVERY)
        doctored = store.load(PROJECT)
        assert isinstance(doctored, Project)
        doctored.quota = {"doctored": 1}  # what no event says
        assert store.snapshots.save(doctored)
    with opened(env) as restarted:
        assert restarted.load(PROJECT).quota == {"doctored": 1}  # type: ignore[union-attr]
        assert restarted.load(PROJECT) != project


def test_snapshots_are_written_as_the_history_grows(env: dict[str, str]) -> None:
    executor = Executor(EventStore(env))
    try:
        for n in range(1, 1_101, 50):  # 50 commands a batch on one project
            batch = [
                command(
                    "project.set_quota",
                    command_id=f"q-{k}",
                    project="research",
                    device_class="H100",
                    devices=k,
                )
                for k in range(n, n + 50)
            ]
            assert all(r["ok"] for r in replies(executor, *batch))
            latest = executor.store.snapshots.latest(PROJECT)
            if n + 49 < SNAPSHOT_EVERY:
                assert latest is None
            else:  # the first commit that took it 500 events past the last snapshot took one
                assert latest is not None
                assert latest.version == 1 + (n + 49) // SNAPSHOT_EVERY * SNAPSHOT_EVERY
    finally:
        executor.store.close()


def test_a_snapshot_of_other_code_is_never_read(env: dict[str, str]) -> None:
    with opened(env, snapshot_format="0123456789abcdef") as other_code:
        project = long_project(other_code, SNAPSHOT_EVERY + 10)
        doctored = other_code.load(PROJECT)
        assert isinstance(doctored, Project)
        doctored.quota = {"doctored": 1}
        assert other_code.snapshots.save(doctored)
    with opened(env) as store:
        assert store.snapshots.latest(PROJECT) is None
        assert store.load(PROJECT) == project
        store.take_snapshots([project])  # this code's own, at the next commit
        assert store.snapshots.latest(PROJECT) == project


@pytest.mark.parametrize(
    ("topic", "state"),
    [
        ("adapters.snapshots:AggregateSnapshot", b"\x00not json"),
        ("adapters.snapshots:Gone", b"{}"),
        (
            "adapters.snapshots:AggregateSnapshot",
            orjson.dumps({"aggregate": "domain.project:Project", "state": {"quota": "x"}}),
        ),
        (
            "adapters.snapshots:AggregateSnapshot",
            orjson.dumps({"aggregate": "domain.base:Cause", "state": {}}),
        ),
    ],
    ids=["not-json", "unknown-topic", "wrong-state", "not-an-aggregate"],
)
def test_a_snapshot_that_cannot_be_read_is_passed_over_with_a_warning(
    env: dict[str, str], topic: str, state: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with opened(env) as store:
        project = long_project(store, 1_200)
    plant(env, 1_000, topic, state)
    with opened(env) as restarted, caplog.at_level(logging.WARNING):
        assert restarted.load(PROJECT) == project
        assert f"passing over the snapshot of {PROJECT}" in caplog.text
        restarted.take_snapshots([project])  # replaced at the next commit
        assert restarted.snapshots.latest(PROJECT) == project


def test_a_snapshot_ahead_of_the_store_is_passed_over(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with opened(env) as store:
        project = long_project(store, SNAPSHOT_EVERY + 10)
        ahead = store.load(PROJECT)
        assert isinstance(ahead, Project)
        ahead.version += 5  # as if its events were lost in a partial restore
        assert store.snapshots.save(ahead)
    with opened(env) as restarted, caplog.at_level(logging.WARNING):
        assert restarted.load(PROJECT) == project
        assert "ahead of the store" in caplog.text


def test_commands_after_a_restart_decide_on_the_same_state(env: dict[str, str]) -> None:
    with opened(env) as store:
        project = long_project(store, 1_100)
        store.take_snapshots([project])
    executor = Executor(EventStore(env))
    try:
        current = project.quota["class-0"]
        out = replies(
            executor,
            command(  # already so: nothing to record
                "project.set_quota",
                command_id="same",
                project="research",
                device_class="class-0",
                devices=current,
            ),
            command(
                "project.set_quota",
                command_id="more",
                project="research",
                device_class="class-0",
                devices=current + 1,
            ),
        )
        assert [r["result"]["events"] for r in out] == [
            [],
            [{"aggregate": "project", "id": "research", "version": 1_101, "type": "QuotaSet"}],
        ]
        assert executor.cache.get(PROJECT) == replay(executor.store.history(PROJECT))
    finally:
        executor.store.close()


def test_a_rollback_rebuilds_from_the_snapshot_and_the_batch_s_earlier_events(
    env: dict[str, str],
) -> None:
    with opened(env) as store:
        project = long_project(store, 1_100)
        store.take_snapshots([project])
    with opened(env) as store:
        uow = UnitOfWork(store, LRU(10))
        uow.begin()  # an earlier command of the batch
        loaded = uow.get(Project, "research")
        assert loaded is not None
        loaded.set_quota(CAUSE, "H100", 1)
        uow.begin()  # the command that is refused
        assert uow.get(Project, "research") is loaded
        loaded.set_quota(CAUSE, "H100", 2)
        uow.rollback()
        rebuilt = uow.touched[PROJECT]
        assert rebuilt is not loaded
        assert rebuilt == replay([*store.history(PROJECT), *rebuilt.pending])
        assert isinstance(rebuilt, Project) and rebuilt.quota["H100"] == 1
        assert [e.originator_version for e in rebuilt.pending] == [1_101]


@settings(max_examples=40, deadline=None)
@given(
    every=st.integers(1, 12),
    commits=st.lists(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3))), max_size=12),
)
def test_snapshots_and_the_events_after_them_load_as_the_whole_history(
    every: int, commits: list[list[tuple[str, int]]]
) -> None:
    """Random quota changes saved in random commits, a snapshot whenever one is due: a store
    opened afterwards loads the project equal to its whole history replayed."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        opened(store_env(None, Path(tmp)), snapshot_every=every) as store,
    ):
        project = Project.register(CAUSE, "research")
        store.save(project.collect_events())
        for changes in commits:
            for device_class, devices in changes:
                project.set_quota(CAUSE, device_class, devices)
            store.save(project.collect_events())
            store.take_snapshots([project])
        with opened(store_env(None, Path(tmp)), snapshot_every=every) as restarted:
            assert restarted.load(PROJECT) == project == replay(restarted.history(PROJECT))
