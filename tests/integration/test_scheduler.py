"""The scheduler under load, in a running hub over a real nats-server: a pass's decisions land
in one group commit, a backlog of changes to one deployment gets one decision, an event it
cannot fold is set aside while admission goes on, and a hub that is behind answers `busy`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from wingsmith.adapters.dead_letters import DeadLetters, stored
from wingsmith.adapters.store import Notification, StoreThread, store_env
from wingsmith.domain.base import Cause
from wingsmith.domain.cluster import Node
from wingsmith.domain.commands import (
    Command,
    CreateWorkload,
    DecideAdmission,
    RegisterCluster,
    ReportInventory,
    ScaleWorkload,
    SetQuota,
)
from wingsmith.domain.values import ServingConfig
from wingsmith.domain.workload import Workload
from wingsmith.services.hub.scheduler import Scheduler
from wingsmith.services.hub.service import Chain, CommandService
from wingsmith.services.hub.wiring import Hub
from wingsmith.services.tasks import cancel_and_wait

from .conftest import LLAMA, seed_deployment, send, send_until_answered, wait_for
from .test_admission import decisions, events, inventory, workload_body


async def admitted(nc: Client, deployment: str, devices: int) -> bool:
    decided = await decisions(nc, deployment)
    return bool(decided) and (decided[-1]["phase"], decided[-1]["devices"]) == (
        "admitted",
        devices,
    )


async def test_a_pass_of_decisions_lands_in_one_group_commit(hub: Hub, client: Client) -> None:
    quota = {"command_id": "q", "project": "research", "device_class": "H100", "devices": 100}
    assert (await send_until_answered(client, "project.set_quota", quota))["ok"]
    register = {"command_id": "c", "cluster_id": "east"}
    assert (await send_until_answered(client, "cluster.register", register))["ok"]
    for i in range(40):  # east has no devices yet: all wait for capacity
        body = workload_body(i, replicas=1, cluster="east")
        assert (await send_until_answered(client, "workload.create", body))["ok"]
    deployments = [f"w{i}--east" for i in range(40)]

    async def all_decided(phase: str) -> bool:
        last = {
            e["aggregate_id"]: e["event"]["phase"]
            for e in await events(client)
            if e["type"] == "AdmissionDecided"
        }
        return all(last.get(k) == phase for k in deployments)

    await wait_for(lambda: all_decided("pending"), 30, "every deployment pending")
    assert hub.scheduler is not None
    commits = hub.commands.commits
    await inventory(client, 64, "inv-64")  # one event: the 40 are decided in one pass
    await wait_for(lambda: all_decided("admitted"), 30, "every deployment admitted")
    assert hub.commands.commits - commits == 2  # the report, then all 40 decisions


async def test_a_backlog_of_changes_to_a_deployment_gets_one_decision(
    hub: Hub, client: Client
) -> None:
    deployment = await seed_deployment(client)  # 2 replicas, quota 8
    await inventory(client, 8, "inv-8")
    await wait_for(lambda: admitted(client, deployment, 2), 20, "the first admission")
    before = len(await decisions(client, deployment))
    scales: list[Command] = [
        ScaleWorkload(command_id=f"scale-{n}", workload_id="llama", replicas=1 + n % 5)
        for n in range(30)  # one commit: the scheduler folds them in one pass
    ]
    assert all(r["ok"] for r in await hub.commands.execute_all(scales))
    await wait_for(lambda: admitted(client, deployment, 5), 20, "the grant for the last scale")
    assert len(await decisions(client, deployment)) == before + 1


async def test_an_event_the_scheduler_cannot_fold_is_set_aside_and_admission_goes_on(
    hub: Hub, client: Client
) -> None:
    """A stored workload scaled that was never created (as another writer's bug would leave
    it): the ledger cannot fold it; the deployment after it is decided all the same."""
    plane = Cause(command_id="other", correlation_id="other", at=datetime.now(UTC))
    stray = Workload.create(
        plane,
        "stray",
        project="research",
        device_class="H100",
        serving=ServingConfig.model_validate(LLAMA),
        replicas=1,
        cluster_pin="east",
    )
    stray.scale(plane, 3)
    scaled = stray.collect_events()[-1]
    await hub.store.run(hub.store.store.save, [scaled])
    assert hub.scheduler is not None
    await wait_for(lambda: _true(hub.scheduler and hub.scheduler.set_aside == 1), 20, "set aside")

    deployment = await seed_deployment(client)
    await inventory(client, 8, "inv-8")
    await wait_for(lambda: admitted(client, deployment, 2), 20, "the admission after it")
    assert await stored(client) == {"scheduler": 1}  # on WINGSMITH_DEAD, with the reason


async def _true(value: Any) -> bool:
    return bool(value)


async def test_a_refused_decision_stops_the_rest_of_its_chain(
    plain_hub: Hub, client: Client
) -> None:
    deployment = await seed_deployment(client)

    def decide(n: int, devices: int, reason: str | None) -> DecideAdmission:
        return DecideAdmission(
            command_id=f"d{n}",
            deployment_id=deployment,
            admitted=reason is None,
            devices=devices,
            reason=reason,
            evidence={},
        )

    gone = DecideAdmission(
        command_id="gone",
        deployment_id="nobody--east",
        admitted=True,
        devices=1,
        reason=None,
        evidence={},
    )
    tolerant = Chain(frozenset({"not_found"}))
    replies = await plain_hub.commands.execute_all([gone, decide(1, 2, None)], tolerant)
    assert [r["ok"] for r in replies] == [False, True]  # a deleted one does not break it
    bad = decide(2, 3, "insufficient_capacity")  # pending yet holding devices: refused
    replies = await plain_hub.commands.execute_all([bad, decide(3, 1, None)], Chain())
    assert [r.get("error", {}).get("code") for r in replies] == ["invalid_value", "chain_broken"]
    assert [d["devices"] for d in await decisions(client, deployment)] == [2]


async def test_a_client_finding_the_hub_behind_is_answered_busy_with_a_retry_hint(
    hub: Hub, client: Client
) -> None:
    assert hub.commands.backpressure is not None
    hub.commands.backpressure.max_waiting = 0  # as if the queue were full
    body = {"command_id": "q", "project": "research", "device_class": "H100", "devices": 8}
    reply = await send(client, "project.set_quota", body)
    assert reply["error"]["code"] == "busy"
    assert reply["error"]["details"]["retry_after_ms"] > 0
    hub.commands.backpressure.max_waiting = 4096
    assert (await send(client, "project.set_quota", body))["ok"]


class Replies:
    """Where the command service answers clients: nobody here is one."""

    async def publish(self, subject: str, payload: bytes) -> None:
        raise AssertionError(f"no client to answer on {subject}")


async def test_what_the_relay_hands_over_while_the_scheduler_reads_the_store_is_not_lost(
    tmp_path: Path,
) -> None:
    """The scheduler catches up from the store; the relay hands over new records while that
    read is under way. They must be folded all the same (read again), not dropped."""
    store = await StoreThread.open(store_env(None, tmp_path))
    handed: list[Notification] = []
    commands = CommandService(store, Replies(), handed.extend)
    running = asyncio.create_task(commands.run())
    scheduler: Scheduler | None = None
    seeded = False

    async def read(after: int, limit: int, stop: int) -> list[Notification]:
        nonlocal seeded
        found = await store.run(store.store.read, after, limit, stop)
        if not seeded:  # the commands commit and the relay hands them over during this read
            seeded = True
            await commands.execute_all(seed_commands())
            assert scheduler is not None
            scheduler.published(list(handed))
        return found

    async def upto() -> int:
        return 0

    scheduler = Scheduler(read, commands.execute_all, upto, DeadLetters(None))
    following = asyncio.create_task(scheduler.run())
    try:

        async def decided() -> bool:
            return scheduler is not None and scheduler.decisions == 1

        await wait_for(decided, 10, "the deployment admitted")
        slot = scheduler.ledger.deployments["llama--east"]
        assert (slot.phase, slot.granted) == ("admitted", 2)
    finally:
        for task in (following, running):
            await cancel_and_wait(task)
        await store.close()


def seed_commands() -> list[Command]:
    return [
        SetQuota(command_id="q", project="research", device_class="H100", devices=8),
        RegisterCluster(command_id="c", cluster_id="east"),
        ReportInventory(
            command_id="i",
            cluster_id="east",
            nodes=[Node(node_id="n1", device_class="H100", devices=8)],
        ),
        CreateWorkload.model_validate(
            {
                "command_id": "w",
                "workload_id": "llama",
                "project": "research",
                "device_class": "H100",
                "serving": LLAMA,
                "replicas": 2,
                "cluster": "east",
            }
        ),
    ]


async def test_a_deployment_whose_decision_the_hub_refuses_waits_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    """The hub refuses every decision for one deployment (as it would if the ledger misread
    it): that one is set aside and left undecided until it changes; the others are decided."""
    store = await StoreThread.open(store_env(None, tmp_path))
    commands = CommandService(store, Replies(), lambda notes: None)
    running = asyncio.create_task(commands.run())
    await commands.execute_all([*seed_commands(), create("other")])
    refusing = True

    async def execute(batch: list[Command], chain: Chain | None) -> list[dict[str, Any]]:
        """The hub, except that it refuses decisions for llama while `refusing`."""
        ids = [getattr(c, "deployment_id", None) for c in batch]
        if refusing and "llama--east" in ids:
            error = {"code": "invalid_value", "message": "refused here", "details": {}}
            return [{"ok": False, "error": error} for _ in batch]
        return await commands.execute_all(batch, chain)

    async def read(after: int, limit: int, stop: int) -> list[Notification]:
        return await store.run(store.store.read, after, limit, None)

    async def upto() -> int:
        return int(await store.run(store.store.last_position))

    letters = DeadLetters(None)
    scheduler = Scheduler(read, execute, upto, letters)
    following = asyncio.create_task(scheduler.run())
    try:

        async def decided(deployment: str) -> bool:
            slot = scheduler.ledger.deployments.get(deployment)
            return slot is not None and slot.phase == "admitted"

        async def the_other_admitted() -> bool:  # by the hub, after starting over
            return scheduler.decisions == 1 and await decided("other--east")

        await wait_for(the_other_admitted, 10, "the other deployment admitted")
        assert "llama--east" in scheduler.refused and letters.counts["scheduler"] >= 1
        assert scheduler.ledger.deployments["llama--east"].phase == "pending"

        refusing = False  # the next change to llama is decided again
        scale = ScaleWorkload(command_id="s", workload_id="llama", replicas=3)
        notes = await store.run(store.store.read, 0, 1000, None)
        await commands.execute_all([scale])
        scheduler.published(await store.run(store.store.read, notes[-1].id, 1000, None))
        await wait_for(lambda: decided("llama--east"), 10, "llama admitted once it changed")
        assert scheduler.ledger.deployments["llama--east"].granted == 3
    finally:
        for task in (following, running):
            await cancel_and_wait(task)
        await store.close()


async def test_a_decision_the_hub_cannot_make_now_is_made_again_without_a_change(
    tmp_path: Path,
) -> None:
    """`unavailable` (the store failed) is no refusal: the scheduler starts over and decides
    the deployment again, with no event about it, and sets nothing aside."""
    store = await StoreThread.open(store_env(None, tmp_path))
    commands = CommandService(store, Replies(), lambda notes: None)
    running = asyncio.create_task(commands.run())
    await commands.execute_all(seed_commands())
    failures = [2]  # the store fails for the first two batches of decisions

    async def execute(batch: list[Command], chain: Chain | None) -> list[dict[str, Any]]:
        if failures[0] and any(getattr(c, "deployment_id", None) for c in batch):
            failures[0] -= 1
            error = {"code": "unavailable", "message": "the event store failed", "details": {}}
            return [{"ok": False, "error": error} for _ in batch]
        return await commands.execute_all(batch, chain)

    async def read(after: int, limit: int, stop: int) -> list[Notification]:
        return await store.run(store.store.read, after, limit, None)

    async def upto() -> int:
        return int(await store.run(store.store.last_position))

    letters = DeadLetters(None)
    scheduler = Scheduler(read, execute, upto, letters)
    following = asyncio.create_task(scheduler.run())
    try:

        async def stored() -> bool:  # the hub's record, not the ledger's own count
            notes = await store.run(store.store.read, 0, 1000, None)
            return any(n.topic.endswith("AdmissionDecided") for n in notes)

        await wait_for(stored, 10, "llama's decision stored once the store works again")
        assert failures == [0] and not scheduler.refused and not letters.counts
        assert scheduler.ledger.deployments["llama--east"].phase == "admitted"
    finally:
        for task in (following, running):
            await cancel_and_wait(task)
        await store.close()


def create(workload: str) -> Command:
    return CreateWorkload.model_validate(
        {
            "command_id": f"w-{workload}",
            "workload_id": workload,
            "project": "research",
            "device_class": "H100",
            "serving": LLAMA,
            "replicas": 2,
            "cluster": "east",
        }
    )


async def test_more_than_the_buffer_holds_is_read_from_the_store(tmp_path: Path) -> None:
    store = await StoreThread.open(store_env(None, tmp_path))
    handed: list[Notification] = []
    commands = CommandService(store, Replies(), handed.extend)
    running = asyncio.create_task(commands.run())

    async def read(after: int, limit: int, stop: int) -> list[Notification]:
        return await store.run(store.store.read, after, limit, stop)

    async def upto() -> int:
        return 0

    scheduler = Scheduler(read, commands.execute_all, upto, DeadLetters(None), buffer_limit=3)
    following = asyncio.create_task(scheduler.run())
    try:
        await wait_for(lambda: _true(scheduler.passes), 10, "the first pass")
        await commands.execute_all(seed_commands())
        scheduler.published(handed)  # more records than the buffer takes: dropped
        await wait_for(lambda: _true(scheduler.decisions == 1), 10, "the admission")
        assert scheduler.overflows == 1
        assert scheduler.ledger.deployments["llama--east"].granted == 2
    finally:
        for task in (following, running):
            await cancel_and_wait(task)
        await store.close()
