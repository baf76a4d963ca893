"""A restarted hub resumes admission from the scheduler's saved ledger, over a real store and
nats-server, and folds only what the store holds after it: the ledger it reaches is the one
the whole history folds to. A saved ledger it cannot use is passed over, and admission goes on
from the whole history."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from nats.aio.client import Client

from wingsmith.adapters.checkpoints import CheckpointStore
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain.admission import Ledger
from wingsmith.domain.base import split_id
from wingsmith.services.config import Settings
from wingsmith.services.hub import scheduler
from wingsmith.services.hub.relay import event_type
from wingsmith.services.hub.wiring import Hub, running_hub

from .conftest import seed_deployment, send_until_answered, wait_for
from .test_admission import decisions, inventory, workload_body

# what the ledger holds that decides who gets devices (its caches and indexes aside)
DECIDING = (
    "position",
    "quota",
    "total",
    "held_in_cluster",
    "held_by_project",
    "deployments",
    "replicas",
    "claimed",
    "workloads",
    "reachable",
    "operated",
)


def whole_history(settings: Settings) -> Ledger:
    """The ledger folded from every stored event, as a first start folds it."""
    store = EventStore(store_env(settings.store_url, settings.data_dir))
    ledger = Ledger()
    try:
        for note in store.read(0, 1_000_000):
            kind = event_type(note.topic)
            if ledger.folds(kind):
                _, aggregate_id = split_id(str(note.originator_id))
                ledger.apply(note.id, kind, aggregate_id, orjson.loads(note.state))
            ledger.position = max(ledger.position, note.id)
    finally:
        store.close()
    return ledger


def deciding(ledger: Ledger) -> dict[str, Any]:
    return {name: getattr(ledger, name) for name in DECIDING}


async def caught_up(hub: Hub) -> None:
    async def there() -> bool:
        assert hub.scheduler is not None
        last = await hub.store.run(hub.store.store.last_position)
        return hub.scheduler.position >= last

    await wait_for(there, 20, "the scheduler at the store's last position")


async def admitted(client: Client, deployment: str, devices: int) -> bool:
    decided = await decisions(client, deployment)
    return bool(decided) and (decided[-1]["phase"], decided[-1]["devices"]) == (
        "admitted",
        devices,
    )


async def first_life(settings: Settings, client: Client) -> int:
    """A hub's first run: a deployment admitted, its ledger saved; the position saved at."""
    async with running_hub(settings) as hub:
        deployment = await seed_deployment(client)
        await inventory(client, 8, "inv-8")
        await wait_for(lambda: admitted(client, deployment, 2), 20, "the first admission")
        await caught_up(hub)
        assert hub.scheduler is not None and hub.scheduler.resumed_from == 0  # nothing saved
        return hub.scheduler.position


async def admit_six_more(hub: Hub, client: Client) -> None:
    """A new workload of 6 replicas on east, which the quota left room for, admitted."""
    body = workload_body(1, replicas=6, cluster="east")
    assert (await send_until_answered(client, "workload.create", body))["ok"]
    await wait_for(lambda: admitted(client, "w1--east", 6), 20, "the new workload admitted")


@pytest.fixture
def save_after_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(scheduler, "SAVE_SHARE", 0)


@pytest.mark.usefixtures("save_after_every_pass")
async def test_a_restarted_hub_resumes_from_the_saved_ledger_and_reaches_the_same_one(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path, store_url: str
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=store_url, data_dir=tmp_path / "hub")
    await first_life(settings, client)
    saved = saved_at(settings)  # the last pass's save, or the stop's (a stop mid-pass keeps it)
    assert saved

    async with running_hub(settings) as hub:
        assert hub.scheduler is not None
        await caught_up(hub)
        assert hub.scheduler.resumed_from == saved  # not position 0: the history is not folded
        # the resumed ledger decides as the whole history would: 6 more fit, then no more
        await admit_six_more(hub, client)
        body = workload_body(2, replicas=1, cluster="east", command_id="w2")
        assert (await send_until_answered(client, "workload.create", body))["ok"]

        async def refused() -> bool:
            decided = await decisions(client, "w2--east")
            return bool(decided) and decided[-1]["phase"] == "pending"

        await wait_for(refused, 20, "the workload past the quota waiting")
        await caught_up(hub)
        assert deciding(hub.scheduler.ledger) == deciding(whole_history(settings))


def _other_format(db: Any) -> None:
    db.execute("UPDATE wingsmith_ledger SET format = 'saved-by-other-code'")


def _unreadable(db: Any) -> None:
    db.execute("UPDATE wingsmith_ledger SET state = ?", [b"not a ledger"])


def _past_the_store(db: Any) -> None:
    db.execute("UPDATE wingsmith_ledger SET position = position + 1000")


@pytest.mark.usefixtures("save_after_every_pass")
@pytest.mark.parametrize("spoil", [_other_format, _unreadable, _past_the_store])
async def test_a_saved_ledger_it_cannot_use_is_passed_over_for_the_whole_history(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path, spoil: Any
) -> None:
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    await first_life(settings, client)
    with sqlite3.connect(settings.data_dir / "events.sqlite") as db:
        spoil(db)
    async with running_hub(settings) as hub:
        assert hub.scheduler is not None
        await caught_up(hub)
        assert hub.scheduler.resumed_from == 0
        await admit_six_more(hub, client)
        await caught_up(hub)
        assert deciding(hub.scheduler.ledger) == deciding(whole_history(settings))


def saved_at(settings: Settings) -> int | None:
    """The position of the ledger saved in the store, if any."""
    checkpoints = CheckpointStore(store_env(settings.store_url, settings.data_dir))
    try:
        saved = checkpoints.ledger(scheduler.LEDGER_FORMAT)
    finally:
        checkpoints.close()
    return saved[0] if saved is not None else None


async def test_a_hub_stopped_cleanly_saves_its_ledger_and_the_next_start_folds_nothing_again(
    nats_server: EmbeddedNatsServer,
    client: Client,
    tmp_path: Path,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler, "QUIET_SAVE", 3600.0)  # only the stop saves it
    settings = Settings(nats_url=nats_server.url, store_url=store_url, data_dir=tmp_path / "hub")
    await first_life(settings, client)
    stopped_at = saved_at(settings)
    assert stopped_at is not None

    async with running_hub(settings) as hub:
        assert hub.scheduler is not None
        await caught_up(hub)
        assert hub.scheduler.resumed_from == stopped_at
        assert hub.scheduler.position == stopped_at  # nothing new: nothing folded again
        await admit_six_more(hub, client)
        await caught_up(hub)
        assert deciding(hub.scheduler.ledger) == deciding(whole_history(settings))


async def test_a_quiet_scheduler_saves_its_ledger_so_even_a_kill_folds_little(
    nats_server: EmbeddedNatsServer,
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler, "QUIET_SAVE", 0.5)
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    async with running_hub(settings) as hub:
        assert hub.scheduler is not None
        deployment = await seed_deployment(client)
        await inventory(client, 8, "inv-8")
        await wait_for(lambda: admitted(client, deployment, 2), 20, "the first admission")
        await caught_up(hub)

        async def saved() -> bool:
            assert hub.scheduler is not None
            return saved_at(settings) == hub.scheduler.position

        # far below the 50,000 records and 60 s after which a busy scheduler saves it
        await wait_for(saved, 20, "the ledger saved once the scheduler was quiet")


async def test_a_quiet_save_the_loop_share_holds_back_waits_for_it_without_spinning(
    nats_server: EmbeddedNatsServer,
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler, "QUIET_SAVE", 0.2)
    monkeypatch.setattr(scheduler, "SAVE_SHARE", 10**9)  # after one save, none for ages
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    async with running_hub(settings) as hub:
        assert hub.scheduler is not None
        deployment = await seed_deployment(client)
        await caught_up(hub)

        async def saved() -> bool:
            return saved_at(settings) is not None

        await wait_for(saved, 20, "the first quiet save")
        first = saved_at(settings)
        await inventory(client, 8, "inv-8")  # something new to save, which must wait
        await wait_for(lambda: admitted(client, deployment, 2), 20, "the admission")
        await caught_up(hub)
        passes = hub.scheduler.passes
        await asyncio.sleep(1.0)
        # quiet: a pass per look for moves at most, not one per turn of the event loop
        assert hub.scheduler.passes - passes < 20
        assert saved_at(settings) == first
