"""Every NATS role against one table of actions, on a real nats-server running the configuration
`adapters.nats_auth.server_config` generates: publish, subscribe, stream, consumer and KV
operations, and the two hijacks a probe once found (a read-only role narrowing the hub's
observation consumer; anyone but the hub re-filtering an operator's consumer onto another
cluster's subjects). Each (role, action) pair is one test.

A row passes only if the server decides as the table says: an allowed action is answered and
its effect is visible to the hub; a forbidden one is reported as a permissions violation and
its effect is absent. The hub is allowed everything, so the hub's row shows that each forbidden
request would have worked (all but one, which JetStream itself declines for anyone). One
allowed action, a reader's durable consumer under a name of its own, is undone by the hub's
consumer sweep: its row checks that the sweep deletes it."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import KeyValueConfig
from nats.js.errors import NotFoundError

from wingsmith.adapters import nats_auth, nats_bus
from wingsmith.adapters.nats_auth import Credentials
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.domain.names import DEAD_STREAM, HUB_CONSUMER
from wingsmith.services.hub.janitor import hub_janitor
from wingsmith.services.tasks import cancel_and_wait

from .conftest import PASSWORDS, roles_config

ROLES = tuple(PASSWORDS)
OPERATORS = {"operator-east": "east", "operator-west": "west"}
HUB = frozenset({"hub"})
READERS = frozenset({"hub", "cli", "api", "viewer"})
COMMANDERS = frozenset({"hub", "cli", "api"})

EVENTS, RENDER, OBS, PROJ = (
    names.EVENTS_STREAM,
    names.RENDER_STREAM,
    names.OBS_STREAM,
    names.VIEWS_STREAM,
)
EAST_FILTER, WEST_FILTER = "wingsmith.render.east.>", "wingsmith.render.west.>"
NARROW = "wingsmith.obs.nothing"  # what a hijacker narrows the hub's observation consumer to
BUCKET = names.PROGRESS_BUCKET
JS = "$JS.API"


class Outcome(enum.Enum):
    DONE = "done"  # let through and carried out
    DECLINED = "declined"  # let through, and JetStream itself answered with an error
    REFUSED = "refused"  # the server's permissions refused it


@dataclass
class World:
    """A server with the generated configuration, in the state the control plane keeps: the
    streams, the hub's and both operators' durable consumers, a message on every stream, the
    projector's KV bucket, and a hub answering commands."""

    server: EmbeddedNatsServer
    hub: Client
    caplog: pytest.LogCaptureFixture
    commands: list[str] = field(default_factory=list)

    async def login(self, role: str) -> Client:
        if role in OPERATORS:
            return await nats_bus.connect_operator(
                self.server.url, OPERATORS[role], user=role, password=PASSWORDS[role]
            )
        return await nats_bus.connect(
            self.server.url, f"table-{role}", user=role, password=PASSWORDS[role]
        )

    def violated(self, action: str, subject: str) -> bool:
        expected = f'permissions violation for {action} to "{subject}"'.lower()
        return any(expected in r.getMessage().lower() for r in self.caplog.records)

    async def request(self, nc: Client, subject: str, body: Any = b"") -> Outcome:
        """One request, answered or refused; the server reports a refusal at once (a refused
        request itself would only time out). The answer is awaited on an inbox of its own: a
        message pulled from a consumer comes under its own subject, which nats-py's request
        would not recognise as the answer."""
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        answered: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

        async def answer(msg: Msg) -> None:
            if not answered.done():
                answered.set_result(msg)

        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=answer)
        try:
            await nc.publish(subject, data, reply=inbox)
            if await self._refused_before(answered, "publish", subject):
                return Outcome.REFUSED
            return _judge(answered.result())
        finally:
            await sub.unsubscribe()

    async def _refused_before(self, done: asyncio.Future[Any], action: str, subject: str) -> bool:
        """Whether the server reports a permissions violation before `done` completes."""
        async with asyncio.timeout(10):
            while not done.done():
                if self.violated(action, subject):
                    return True
                await asyncio.sleep(0.01)
        return False

    async def subscribe(self, nc: Client, subject: str, probe: str) -> Outcome:
        """Subscribe to `subject`, then have the hub publish on `probe`, which it matches."""
        got: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def arrived(msg: Msg) -> None:
            if not got.done():
                got.set_result(None)

        async def probing() -> None:  # core NATS delivers at most once: say it until heard
            while True:
                await self.hub.publish(probe, b"probe")
                await self.hub.flush()
                await asyncio.sleep(0.5)

        sub = await nc.subscribe(subject, cb=arrived)
        await nc.flush()
        prober = asyncio.create_task(probing(), name="role-table-probe")
        try:
            refused = await self._refused_before(got, "subscription", subject)
            return Outcome.REFUSED if refused else Outcome.DONE
        finally:
            await cancel_and_wait(prober)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # What the hub sees: the effect of an action, or its absence.

    async def count(self, stream: str, subject: str) -> int:
        info = await self.hub.jetstream().stream_info(stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())

    async def consumer(self, stream: str, name: str) -> Any:
        try:
            return await self.hub.jetstream().consumer_info(stream, name)
        except NotFoundError:
            return None

    async def stream(self, name: str) -> Any:
        try:
            return await self.hub.jetstream().stream_info(name)
        except NotFoundError:
            return None


def _judge(reply: Msg) -> Outcome:
    with contextlib.suppress(orjson.JSONDecodeError):
        answer = orjson.loads(reply.data)
        if isinstance(answer, dict) and "error" in answer:
            return Outcome.DECLINED
    return Outcome.DONE


def _create(config: dict[str, Any], stream: str) -> dict[str, Any]:
    return {"stream_name": stream, "config": {"ack_policy": "explicit"} | config}


def _hub_consumer(**changes: Any) -> dict[str, Any]:
    """The hub's observation consumer as the hub creates it, with `changes`."""
    return _create(nats_bus.observation_consumer_config().as_dict() | changes, OBS)


def _east_consumer(**changes: Any) -> dict[str, Any]:
    """Operator east's render consumer as east creates it, with `changes`."""
    return _create(nats_bus.render_consumer_config("east").as_dict() | changes, RENDER)


def _ordered(nc: Client, name: str | None, filter_subject: str) -> dict[str, Any]:
    """A consumer configured as nats-py configures an ordered one."""
    config: dict[str, Any] = {
        "deliver_subject": nc.new_inbox(),
        "ack_policy": "none",
        "max_deliver": 1,
        "flow_control": True,
        "idle_heartbeat": 2_000_000_000,
        "mem_storage": True,
        "num_replicas": 1,
        "filter_subject": filter_subject,
    }
    return _create(config | ({"name": name} if name else {}), EVENTS)


Run = Callable[[World, Client], Awaitable[Outcome]]
Effect = Callable[[World], Awaitable[bool]]


@dataclass(frozen=True)
class Action:
    allowed: frozenset[str]
    run: Run
    effect: Effect | None = None  # whether it took effect, as the hub sees it afterwards
    when_allowed: Outcome = Outcome.DONE


def send(subject: str, body: Any = b"") -> Run:
    async def run(w: World, nc: Client) -> Outcome:
        return await w.request(nc, subject, body)

    return run


def listen(subject: str, probe: str) -> Run:
    async def run(w: World, nc: Client) -> Outcome:
        return await w.subscribe(nc, subject, probe)

    return run


def stored(stream: str, subject: str, before: int = 0) -> Effect:
    async def effect(w: World) -> bool:
        return await w.count(stream, subject) > before

    return effect


async def hub_consumer_narrowed(w: World) -> bool:
    info = await w.consumer(OBS, HUB_CONSUMER)
    return info is None or info.config.filter_subject == NARROW


async def east_consumer_on_west(w: World) -> bool:
    info = await w.consumer(RENDER, "operator-east")
    return info is None or info.config.filter_subject == WEST_FILTER


def consumer_exists(stream: str, name: str) -> Effect:
    async def effect(w: World) -> bool:
        return await w.consumer(stream, name) is not None

    return effect


def consumer_gone(stream: str, name: str) -> Effect:
    async def effect(w: World) -> bool:
        return await w.consumer(stream, name) is None

    return effect


def swept_away(stream: str, name: str) -> Effect:
    """Whether the consumer was made, and the hub's consumer sweep (services/hub/janitor.py) then
    deleted it and left the control plane's own consumers in place."""

    async def effect(w: World) -> bool:
        if await w.consumer(stream, name) is None:
            return False
        janitor = hub_janitor(w.hub, every=1.0)
        for _ in range(2):  # a stranger goes on its second sighting
            await janitor.sweep()
        kept = [(OBS, HUB_CONSUMER), (RENDER, "operator-east"), (RENDER, "operator-west")]
        survivors = [await w.consumer(*consumer) for consumer in kept]
        return await w.consumer(stream, name) is None and None not in survivors

    return effect


def pending(stream: str, name: str) -> Effect:
    """Whether someone took a message from the consumer (it now waits for its ack)."""

    async def effect(w: World) -> bool:
        info = await w.consumer(stream, name)
        return bool(info and info.num_ack_pending)

    return effect


def stream_gone(name: str) -> Effect:
    async def effect(w: World) -> bool:
        return await w.stream(name) is None

    return effect


async def obs_limited(w: World) -> bool:
    return bool((await w.stream(OBS)).config.max_msgs == 5)


def update_obs() -> Run:
    async def run(w: World, nc: Client) -> Outcome:
        config = (await w.stream(OBS)).config.as_dict() | {"max_msgs": 5}
        return await w.request(nc, f"{JS}.STREAM.UPDATE.{OBS}", config)

    return run


async def events_purged(w: World) -> bool:
    return bool((await w.stream(EVENTS)).state.messages == 0)


async def render_message_deleted(w: World) -> bool:
    return bool((await w.stream(RENDER)).state.messages < 2)


async def command_received(w: World) -> bool:
    return bool(w.commands)


async def progress_overwritten(w: World) -> bool:
    entry = await (await w.hub.jetstream().key_value(BUCKET)).get("position")
    return entry.value == b'{"position":0}'


def ordered_consumer(named: bool) -> Run:
    async def run(w: World, nc: Client) -> Outcome:
        name = "reader-table" if named else None
        tail = f".reader-table.{'wingsmith.evt.>'}" if named else ""
        return await w.request(
            nc, f"{JS}.CONSUMER.CREATE.{EVENTS}{tail}", _ordered(nc, name, "wingsmith.evt.>")
        )

    return run


async def reader_consumer_exists(w: World) -> bool:
    return bool(await w.hub.jetstream().consumers_info(EVENTS))


ACTIONS: dict[str, Action] = {
    # Publishing
    "send-a-command": Action(COMMANDERS, send("wingsmith.cmd.ping", b"{}"), command_received),
    "publish-an-event": Action(
        HUB, send("wingsmith.evt.workload.w.WorkloadCreated", b"{}"), stored(EVENTS, ">", 1)
    ),
    "publish-a-view": Action(
        HUB, send("wingsmith.proj.fleet.rogue", b"{}"), stored(PROJ, "wingsmith.proj.fleet.rogue")
    ),
    "publish-a-render-message": Action(
        HUB,
        send("wingsmith.render.east.rogue--east", b"{}"),
        stored(RENDER, "wingsmith.render.east.rogue--east"),
    ),
    "publish-a-dead-letter": Action(
        HUB,
        send(names.dead_subject("relay"), b"{}"),
        stored(DEAD_STREAM, names.dead_subject("relay")),
    ),
    "report-for-east": Action(
        HUB | {"operator-east"},
        send("wingsmith.obs.east.heartbeat", b"{}"),
        stored(OBS, "wingsmith.obs.east.heartbeat", 1),
    ),
    "report-for-west": Action(
        HUB | {"operator-west"},
        send("wingsmith.obs.west.heartbeat", b"{}"),
        stored(OBS, "wingsmith.obs.west.heartbeat", 1),
    ),
    # Subscribing (core NATS: it would see messages as they are published)
    "subscribe-to-commands": Action(HUB, listen("wingsmith.cmd.>", "wingsmith.cmd.probe")),
    "subscribe-to-render-messages": Action(
        HUB, listen("wingsmith.render.>", "wingsmith.render.west.probe--west")
    ),
    "subscribe-to-observations": Action(HUB, listen("wingsmith.obs.>", "wingsmith.obs.west.p")),
    # an operator hears its own cluster's node agents, and no other cluster's
    "subscribe-to-easts-node-agents": Action(
        HUB | {"operator-east"},
        listen("wingsmith.obs.east.devices.*", "wingsmith.obs.east.devices.gpu-1"),
    ),
    "subscribe-to-easts-reports": Action(
        HUB, listen("wingsmith.obs.east.>", "wingsmith.obs.east.devices.gpu-1")
    ),
    # Each user has an inbox prefix of its own: nobody reads another's replies, nor learns the
    # names of its consumers from them.
    "subscribe-to-the-default-inbox": Action(HUB, listen("_INBOX.>", "_INBOX.probe")),
    "subscribe-to-the-apis-inbox": Action(HUB | {"api"}, listen("_INBOX_api.>", "_INBOX_api.p")),
    "subscribe-to-easts-inbox": Action(
        HUB | {"operator-east"}, listen("_INBOX_east.>", "_INBOX_east.probe")
    ),
    "subscribe-to-everything": Action(HUB, listen(">", "anything.at.all")),
    # Streams
    "create-a-stream": Action(
        HUB,
        send(f"{JS}.STREAM.CREATE.ROGUE", {"name": "ROGUE", "subjects": ["rogue.>"]}),
        lambda w: _is(w.stream("ROGUE")),
    ),
    "update-a-stream": Action(HUB, update_obs(), obs_limited),
    "delete-a-stream": Action(HUB, send(f"{JS}.STREAM.DELETE.{OBS}"), stream_gone(OBS)),
    "purge-a-stream": Action(HUB, send(f"{JS}.STREAM.PURGE.{EVENTS}"), events_purged),
    "delete-a-message": Action(
        HUB, send(f"{JS}.STREAM.MSG.DELETE.{RENDER}", {"seq": 1}), render_message_deleted
    ),
    "stream-info": Action(READERS, send(f"{JS}.STREAM.INFO.{EVENTS}")),
    "get-a-message": Action(
        READERS,
        send(
            f"{JS}.STREAM.MSG.GET.{RENDER}", {"last_by_subj": "wingsmith.render.west.llama--west"}
        ),
    ),
    "list-streams": Action(HUB, send(f"{JS}.STREAM.LIST")),
    # Consumers: what readers need
    "create-an-ordered-consumer": Action(READERS, ordered_consumer(True), reader_consumer_exists),
    "create-an-unnamed-consumer": Action(HUB, ordered_consumer(False), reader_consumer_exists),
    "consumer-info-of-the-hubs": Action(READERS, send(f"{JS}.CONSUMER.INFO.{OBS}.{HUB_CONSUMER}")),
    "consumer-info-of-easts": Action(
        READERS | {"operator-east"}, send(f"{JS}.CONSUMER.INFO.{RENDER}.operator-east")
    ),
    "list-consumers": Action(HUB, send(f"{JS}.CONSUMER.NAMES.{RENDER}")),
    # Consumers: durable ones
    "create-a-durable-legacy-form": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.DURABLE.CREATE.{EVENTS}.rogue",
            _create({"durable_name": "rogue"}, EVENTS),
        ),
        consumer_exists(EVENTS, "rogue"),
    ),
    # Permissions see subjects, not bodies: a reader may name a consumer of its own durable.
    # It cannot reach any other consumer (the rows below), and the hub's sweep deletes it.
    "create-a-durable-of-its-own-name": Action(
        READERS,
        send(
            f"{JS}.CONSUMER.CREATE.{EVENTS}.own-durable.wingsmith.evt.>",
            _create({"durable_name": "own-durable", "filter_subject": "wingsmith.evt.>"}, EVENTS),
        ),
        swept_away(EVENTS, "own-durable"),
    ),
    "operator-creates-its-own-consumer": Action(
        HUB | {"operator-east"},
        send(f"{JS}.CONSUMER.CREATE.{RENDER}.operator-east.{EAST_FILTER}", _east_consumer()),
    ),
    "delete-the-hubs-consumer": Action(
        HUB, send(f"{JS}.CONSUMER.DELETE.{OBS}.{HUB_CONSUMER}"), consumer_gone(OBS, HUB_CONSUMER)
    ),
    "delete-easts-consumer": Action(
        HUB | {"operator-east"},
        send(f"{JS}.CONSUMER.DELETE.{RENDER}.operator-east"),
        consumer_gone(RENDER, "operator-east"),
    ),
    "pull-from-the-hubs-consumer": Action(
        HUB,
        send(f"{JS}.CONSUMER.MSG.NEXT.{OBS}.{HUB_CONSUMER}", {"batch": 1, "no_wait": True}),
        pending(OBS, HUB_CONSUMER),
    ),
    "pull-from-easts-consumer": Action(
        HUB | {"operator-east"},
        send(f"{JS}.CONSUMER.MSG.NEXT.{RENDER}.operator-east", {"batch": 1, "no_wait": True}),
        pending(RENDER, "operator-east"),
    ),
    # Hijack 1: narrowing the hub's observation consumer stops all observation intake.
    "narrow-the-hubs-consumer-name-in-body": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.CREATE.{OBS}", _hub_consumer(durable_name=None, filter_subject=NARROW)
        ),
        hub_consumer_narrowed,
    ),
    "narrow-the-hubs-consumer-name-in-subject": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.CREATE.{OBS}.{HUB_CONSUMER}.{NARROW}",
            _hub_consumer(filter_subject=NARROW),
        ),
        hub_consumer_narrowed,
    ),
    "narrow-the-hubs-consumer-name-in-subject-filter-in-body": Action(
        HUB,
        send(f"{JS}.CONSUMER.CREATE.{OBS}.{HUB_CONSUMER}", _hub_consumer(filter_subject=NARROW)),
        hub_consumer_narrowed,
    ),
    "narrow-the-hubs-consumer-legacy-form": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.DURABLE.CREATE.{OBS}.{HUB_CONSUMER}",
            _hub_consumer(name=None, filter_subject=NARROW),
        ),
        hub_consumer_narrowed,
    ),
    # Hijack 2: re-filtering east's consumer onto west's subjects makes east run west's work.
    "refilter-east-onto-west-name-in-subject": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.CREATE.{RENDER}.operator-east.{WEST_FILTER}",
            _east_consumer(filter_subject=WEST_FILTER),
        ),
        east_consumer_on_west,
    ),
    # East's own create subject, west's filter in the body: JetStream refuses it even for the
    # hub (the body's filter must be the subject's).
    "refilter-east-onto-west-own-subject": Action(
        HUB | {"operator-east"},
        send(
            f"{JS}.CONSUMER.CREATE.{RENDER}.operator-east.{EAST_FILTER}",
            _east_consumer(filter_subject=WEST_FILTER),
        ),
        east_consumer_on_west,
        when_allowed=Outcome.DECLINED,
    ),
    "refilter-east-onto-west-name-in-subject-filter-in-body": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.CREATE.{RENDER}.operator-east",
            _east_consumer(filter_subject=WEST_FILTER),
        ),
        east_consumer_on_west,
    ),
    "refilter-east-onto-west-name-in-body": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.CREATE.{RENDER}",
            _east_consumer(durable_name=None, filter_subject=WEST_FILTER),
        ),
        east_consumer_on_west,
    ),
    "refilter-east-onto-west-legacy-form": Action(
        HUB,
        send(
            f"{JS}.CONSUMER.DURABLE.CREATE.{RENDER}.operator-east",
            _east_consumer(name=None, filter_subject=WEST_FILTER),
        ),
        east_consumer_on_west,
    ),
    # KV (the projector's progress bucket; every projection's bucket is alike)
    "kv-get": Action(
        READERS,
        send(f"{JS}.STREAM.MSG.GET.KV_{BUCKET}", {"last_by_subj": f"$KV.{BUCKET}.position"}),
    ),
    "kv-put": Action(HUB, send(f"$KV.{BUCKET}.position", b'{"position":0}'), progress_overwritten),
    "kv-create-a-bucket": Action(
        HUB,
        send(f"{JS}.STREAM.CREATE.KV_rogue", {"name": "KV_rogue", "subjects": ["$KV.rogue.>"]}),
        lambda w: _is(w.stream("KV_rogue")),
    ),
    "kv-delete-a-bucket": Action(
        HUB, send(f"{JS}.STREAM.DELETE.KV_{BUCKET}"), stream_gone(f"KV_{BUCKET}")
    ),
}


async def _is(found: Awaitable[Any]) -> bool:
    return await found is not None


@pytest.fixture
async def world(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[World]:
    config = roles_config()
    async with EmbeddedNatsServer(tmp_path / "nats", config=config) as server:
        hub = await nats_bus.connect(server.url, "table-hub", user="hub", password=PASSWORDS["hub"])
        try:
            w = World(server, hub, caplog)
            await _furnish(w)
            yield w
        finally:
            await hub.close()


async def _furnish(w: World) -> None:
    js = w.hub.jetstream()
    await nats_bus.ensure_streams(w.hub)
    await js.add_consumer(OBS, nats_bus.observation_consumer_config())
    for cluster_id in ("east", "west"):
        await js.add_consumer(RENDER, nats_bus.render_consumer_config(cluster_id))
    for subject in [
        "wingsmith.evt.workload.chat.WorkloadCreated",
        "wingsmith.render.east.llama--east",
        "wingsmith.render.west.llama--west",
        "wingsmith.obs.east.replica",
        "wingsmith.obs.east.heartbeat",  # both operators report: the hub keeps their consumers
        "wingsmith.obs.west.heartbeat",
        "wingsmith.proj.fleet.east",
    ]:
        await js.publish(subject, b'{"seq": 1}')
    kv = await js.create_key_value(KeyValueConfig(bucket=BUCKET, history=1))
    await kv.put("position", b'{"position":7}')

    async def answer(msg: Msg) -> None:
        w.commands.append(msg.subject)
        await msg.respond(b'{"ok": true}')

    await w.hub.subscribe("wingsmith.cmd.>", cb=answer)
    await w.hub.flush()


ROWS = [(role, action) for action in ACTIONS for role in ROLES]


@pytest.mark.parametrize(("role", "action"), ROWS, ids=[f"{r}:{a}" for r, a in ROWS])
async def test_the_role_table(world: World, role: str, action: str) -> None:
    row = ACTIONS[action]
    nc = await world.login(role)
    try:
        outcome = await row.run(world, nc)
    finally:
        await nc.close()
    expected = row.when_allowed if role in row.allowed else Outcome.REFUSED
    assert outcome == expected, f"{role} {action}: {outcome.value}, expected {expected.value}"
    if row.effect is not None:
        took_effect = await row.effect(world)
        assert took_effect == (outcome == Outcome.DONE), f"{role} {action}: effect {took_effect}"


def test_every_role_has_a_row_for_every_action() -> None:
    assert len(ROWS) == len(ROLES) * len(ACTIONS)
    for action in ACTIONS.values():
        assert action.allowed <= set(ROLES)


@pytest.mark.parametrize("role", ["cli", "api", "viewer"])
async def test_each_reader_reads_events_views_and_progress(world: World, role: str) -> None:
    """What `wingsmith events`, `wingsmith views` and the REST API read, through named ordered
    consumers and message gets, with nothing refused."""
    nc = await world.login(role)
    try:
        events = nats_bus.read_stream(nc, EVENTS, "wingsmith.evt.>", follow=False)
        assert [m.subject async for m in events] == ["wingsmith.evt.workload.chat.WorkloadCreated"]
        assert await nats_bus.projector_progress(nc) == {"position": 7}
        views = nats_bus.read_stream(nc, PROJ, "wingsmith.proj.>", follow=False, start="last")
        assert [m.subject async for m in views] == ["wingsmith.proj.fleet.east"]
    finally:
        await nc.close()
    assert "permissions violation" not in world.caplog.text


async def test_a_reader_whose_consumer_vanished_goes_on_under_a_new_name(world: World) -> None:
    """nats-py recreates an ordered consumer that stopped sending heartbeats; a named one is
    recreated under a new name (reusing the name would be refused as an update), and the
    reader goes on from where it was."""
    nc = await world.login("viewer")
    js = world.hub.jetstream()
    stream = nats_bus.read_stream(nc, EVENTS, "wingsmith.evt.>", follow=True)
    try:
        async with asyncio.timeout(30):
            first = await anext(stream)
            (before,) = [c.name for c in await js.consumers_info(EVENTS)]
            await js.delete_consumer(EVENTS, before)
            await js.publish("wingsmith.evt.workload.chat.WorkloadScaled", b"{}")
            second = await anext(stream)
    finally:
        await stream.aclose()
        await nc.close()
    assert (first.seq, second.seq) == (1, 2)
    assert second.subject == "wingsmith.evt.workload.chat.WorkloadScaled"
    after = [c.name for c in await js.consumers_info(EVENTS)]
    assert before.startswith("reader-") and before not in after
    assert "permissions violation" not in world.caplog.text


async def test_a_reader_logged_in_through_its_url_gets_its_own_inbox(world: World) -> None:
    """Credentials in the URL rather than in `user=`: the connection still takes the user's own
    inbox prefix, the only one the server lets it subscribe to."""
    host = world.server.url.removeprefix("nats://")
    nc = await nats_bus.connect(f"nats://viewer:{PASSWORDS['viewer']}@{host}", "url-viewer")
    try:
        events = nats_bus.read_stream(nc, EVENTS, "wingsmith.evt.>", follow=False)
        assert [m.seq async for m in events] == [1]
    finally:
        await nc.close()
    assert "permissions violation" not in world.caplog.text


@pytest.mark.parametrize("user", ["a.b", "a*", ">", "a b", ""])
def test_a_user_name_that_would_bend_its_inbox_subject_is_refused(user: str) -> None:
    with pytest.raises(ValueError, match="may name a user"):
        nats_auth.server_config(Credentials("hub", "x"), {}, viewer=Credentials(user, "pw"))
