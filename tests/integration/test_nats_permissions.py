"""The server, configured by adapters.nats_auth, keeps each cluster operator to its own subjects:
what an operator is refused here, the hub (or the other operator, on its own subjects) is shown
to be able to do first, so every refusal is the permissions' doing."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import nats.errors
import orjson
import pytest
import yaml
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from wingsmith.adapters import nats_auth, nats_bus
from wingsmith.adapters.nats_auth import Credentials
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.domain import names
from wingsmith.services.operator.runtime import (
    OperatorCounts,
    OperatorOptions,
    Report,
    run_operator,
)
from wingsmith.services.tasks import cancel_and_wait

HUB_PASSWORD_VARIABLE = "WINGSMITH_TEST_HUB_PASSWORD"  # the hub's password comes by reference
HUB_PASSWORD = "hub-secret"
EAST_PASSWORD = "east-secret"  # east's is plain text in the configuration
WEST_PASSWORD = "west-secret"  # west's is stored as this bcrypt hash of it (cost 4):
WEST_BCRYPT = "$2b$04$1ezzV30eflgbqcBnM3N/Rub6g9sUYq/QM/gzx1CKtU/QKO8IAPyWS"
CLIENT = Credentials("wingsmith-cli", "cli-secret")
VIEWER = Credentials("wingsmith-viewer", "viewer-secret")

# Desired state on the render stream: east has two deployments (the first rendered twice),
# west has one.
RENDERS = [
    ("east", "llama--east", {"generation": 1, "replicas": 1}),
    ("east", "qwen--east", {"generation": 1, "replicas": 2}),
    ("west", "llama--west", {"generation": 1, "replicas": 3}),
    ("east", "llama--east", {"generation": 2, "replicas": 4}),
]
EAST_LATEST = {
    "wingsmith.render.east.llama--east": {"generation": 2, "replicas": 4},
    "wingsmith.render.east.qwen--east": {"generation": 1, "replicas": 2},
}
WEST_SUBJECT = "wingsmith.render.west.llama--west"
OPERATOR_TIMEOUT = 0.5  # an API request that is refused never gets an answer: don't wait long


@pytest.fixture
async def server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[EmbeddedNatsServer]:
    monkeypatch.setenv(HUB_PASSWORD_VARIABLE, HUB_PASSWORD)  # the server inherits it
    config = nats_auth.server_config(
        Credentials("hub", f"${HUB_PASSWORD_VARIABLE}"),
        {"east": EAST_PASSWORD, "west": WEST_BCRYPT},
        client=CLIENT,
        viewer=VIEWER,
    )
    async with EmbeddedNatsServer(tmp_path / "nats", config=config) as running:
        yield running


@pytest.fixture
async def hub(server: EmbeddedNatsServer) -> AsyncIterator[Client]:
    """The hub's connection, after it created the streams and rendered every deployment."""
    nc = await nats_bus.connect(server.url, "test-hub", user="hub", password=HUB_PASSWORD)
    await nats_bus.ensure_streams(nc)
    for position, (cluster_id, deployment_id, body) in enumerate(RENDERS, 1):
        await publish_render(nc, cluster_id, deployment_id, body, position)
    yield nc
    await nc.close()


async def publish_render(
    nc: Client, cluster_id: str, deployment_id: str, body: dict[str, Any], position: int
) -> None:
    await nc.jetstream().publish(
        f"wingsmith.render.{cluster_id}.{deployment_id}",
        orjson.dumps(body),
        headers={"Nats-Msg-Id": f"render:{deployment_id}:{position}"},
    )


@pytest.fixture
async def east(server: EmbeddedNatsServer, hub: Client) -> AsyncIterator[Client]:
    nc = await nats_bus.connect_operator(
        server.url, "east", user="operator-east", password=EAST_PASSWORD
    )
    yield nc
    await nc.close()


@pytest.fixture
async def west(server: EmbeddedNatsServer, hub: Client) -> AsyncIterator[Client]:
    nc = await nats_bus.connect_operator(
        server.url, "west", user="operator-west", password=WEST_PASSWORD
    )
    yield nc
    await nc.close()


async def eventually(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(what) from None


async def refused(caplog: pytest.LogCaptureFixture, action: str, subject: str) -> None:
    """Wait for the server's report that a publish or subscription on `subject` was refused
    (nats-py hands it to the connection's error callback, which logs it)."""
    expected = f'permissions violation for {action} to "{subject}"'.lower()  # as nats-py has it

    def reported() -> bool:
        return any(expected in r.getMessage().lower() for r in caplog.records)

    await eventually(reported, f"no permissions violation for {action} to {subject}")


async def read_renders(nc: Client, cluster_id: str, count: int) -> dict[str, Any]:
    """The render messages `render_batches` hands out until there are `count` subjects, each
    acknowledged; the latest body per subject."""
    got: dict[str, Any] = {}
    batches = nats_bus.render_batches(nc, cluster_id, idle=0.3)
    try:
        async with asyncio.timeout(15):
            async for batch in batches:
                for delivery in batch:
                    got[delivery.subject] = orjson.loads(delivery.data)
                    await delivery.ack()
                if len(got) >= count:
                    break
    finally:
        assert isinstance(batches, AsyncGenerator)
        await batches.aclose()
    return got


async def observations_on(hub: Client, subject: str) -> tuple[int, bytes | None]:
    """How many messages WINGSMITH_OBS holds on one subject, and the last one, as the hub
    reads them."""
    js = hub.jetstream()
    info = await js.stream_info(names.OBS_STREAM, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    if not count:
        return 0, None
    return count, (await js.get_msg(names.OBS_STREAM, subject=subject)).data


def test_the_configuration_names_the_streams_of_the_contract() -> None:
    streams = {config.name: config.subjects for config in nats_bus.STREAMS}
    permissions = nats_auth.operator_permissions("east")
    assert streams[names.RENDER_STREAM] == [names.every(names.RENDER)]
    assert streams[names.OBS_STREAM] == [names.every(names.OBSERVATIONS)]
    assert f".{names.RENDER_STREAM}.operator-east" in permissions.publish[2]
    assert permissions.publish[0] == f"{names.OBSERVATIONS}.east.>"
    assert nats_auth.render_filter("east") == f"{names.RENDER}.east.>"


@pytest.mark.parametrize("cluster_id", ["east.west", "east*", ">", "East", "", "a" * 64])
def test_a_cluster_id_that_would_bend_a_subject_is_rejected(cluster_id: str) -> None:
    with pytest.raises(ValueError, match="cluster id"):
        nats_auth.server_config(Credentials("hub", "x"), {cluster_id: "pw"})


def test_a_password_that_would_end_its_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="quotes"):
        nats_auth.server_config(Credentials("hub", 'x", permissions: {}'), {})


def test_credentials_come_from_two_environment_variables() -> None:
    env = {"WINGSMITH_NATS_USER": "operator-east", "WINGSMITH_NATS_PASSWORD": EAST_PASSWORD}
    assert nats_auth.credentials_from_env(env) == Credentials("operator-east", EAST_PASSWORD)
    assert nats_auth.credentials_from_env({}) is None
    with pytest.raises(ValueError, match="WINGSMITH_NATS_PASSWORD"):
        nats_auth.credentials_from_env({"WINGSMITH_NATS_USER": "operator-east"})


async def test_credentials_in_a_url_log_in_but_never_reach_the_log(
    server: EmbeddedNatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    host = server.url.removeprefix("nats://")
    url = f"nats://operator-east:{EAST_PASSWORD}@{host}"
    nc = await nats_bus.connect(url, "test-url", inbox_prefix="_INBOX_east")
    try:
        await server.stop()  # the connection logs that it lost the server
        await eventually(
            lambda: any("disconnected from" in r.getMessage() for r in caplog.records),
            "the disconnection to be logged",
        )
    finally:
        await nc.close()
    assert f"nats://{host}" in caplog.text
    assert EAST_PASSWORD not in caplog.text


async def test_an_unknown_user_or_wrong_password_is_turned_away(
    server: EmbeddedNatsServer,
) -> None:
    for user, password in [("operator-east", "wrong"), ("nobody", EAST_PASSWORD), (None, None)]:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(server.url, user=user, password=password, allow_reconnect=False)


async def test_each_operator_reads_only_its_own_latest_render_messages(
    hub: Client, east: Client, west: Client
) -> None:
    assert await read_renders(east, "east", 2) == EAST_LATEST
    assert await read_renders(west, "west", 1) == {WEST_SUBJECT: {"generation": 1, "replicas": 3}}
    # East may look at its own consumer, and its acknowledgements (sent on `$JS.ACK...`, not
    # waited for) reach the server: nothing is left pending.
    js = east.jetstream()
    info = await js.consumer_info(names.RENDER_STREAM, "operator-east")
    assert info.config.filter_subject == "wingsmith.render.east.>"
    assert info.config.deliver_policy == DeliverPolicy.LAST_PER_SUBJECT
    async with asyncio.timeout(10):
        while info.num_ack_pending or info.delivered.stream_seq < 4:
            await asyncio.sleep(0.05)
            info = await js.consumer_info(names.RENDER_STREAM, "operator-east")
    assert info.num_redelivered == 0


async def test_a_restarted_operator_gets_every_latest_message_again(
    server: EmbeddedNatsServer, hub: Client, east: Client
) -> None:
    assert await read_renders(east, "east", 2) == EAST_LATEST
    await east.close()

    again = await nats_bus.connect_operator(
        server.url, "east", user="operator-east", password=EAST_PASSWORD
    )
    try:
        assert await read_renders(again, "east", 2) == EAST_LATEST
    finally:
        await again.close()


async def test_an_operator_whose_consumer_vanished_recreates_it_and_catches_up(
    hub: Client, east: Client
) -> None:
    got: list[tuple[str, Any]] = []
    batches = nats_bus.render_batches(east, "east", idle=0.2)
    try:
        async with asyncio.timeout(15):
            async for batch in batches:
                for delivery in batch:
                    got.append((delivery.subject, orjson.loads(delivery.data)))
                    await delivery.ack()
                if len(got) == 2:  # everything read: now the consumer disappears
                    await hub.jetstream().delete_consumer(names.RENDER_STREAM, "operator-east")
                    await publish_render(hub, "east", "mistral--east", {"generation": 1}, 5)
                if len(got) == 5:
                    break
    finally:
        assert isinstance(batches, AsyncGenerator)
        await batches.aclose()
    assert dict(got[:2]) == EAST_LATEST
    assert dict(got[2:]) == EAST_LATEST | {"wingsmith.render.east.mistral--east": {"generation": 1}}


async def test_an_operator_reports_only_for_its_own_cluster(
    hub: Client, east: Client, west: Client, caplog: pytest.LogCaptureFixture
) -> None:
    await nats_bus.publish_observation(east, "east", "replica", {"cluster_id": "east"}, "e-1")
    assert await observations_on(hub, "wingsmith.obs.east.replica") == (1, b'{"cluster_id":"east"}')

    forged = {"cluster_id": "west", "forged": True}
    with pytest.raises(TimeoutError):  # no acknowledgement: the server dropped it
        async with asyncio.timeout(OPERATOR_TIMEOUT * 2):
            await nats_bus.publish_observation(east, "west", "replica", forged, "e-2")
    await refused(caplog, "publish", "wingsmith.obs.west.replica")
    assert await observations_on(hub, "wingsmith.obs.west.replica") == (0, None)

    # The same subject takes west's own report, so the check above could have seen one.
    await nats_bus.publish_observation(west, "west", "replica", {"cluster_id": "west"}, "w-1")
    assert await observations_on(hub, "wingsmith.obs.west.replica") == (1, b'{"cluster_id":"west"}')


def _create(subject_tail: str, config: dict[str, Any]) -> tuple[str, bytes]:
    subject = f"$JS.API.CONSUMER.{subject_tail}"
    return subject, orjson.dumps({"stream_name": names.RENDER_STREAM, "config": config})


WEST_FILTER = "wingsmith.render.west.>"
OWN_CREATE = "CREATE.WINGSMITH_RENDER.operator-east.wingsmith.render.east.>"
EXPLICIT: dict[str, Any] = {"ack_policy": "explicit"}

# Consumer creations that would let east read west's render messages, refused by the server's
# permissions before JetStream sees them.
REFUSED_CREATIONS = {
    "filtered on west, east's name": _create(
        f"CREATE.WINGSMITH_RENDER.operator-east.{WEST_FILTER}",
        {"name": "operator-east", "durable_name": "operator-east", "filter_subject": WEST_FILTER}
        | EXPLICIT,
    ),
    "filtered on west, west's name": _create(
        f"CREATE.WINGSMITH_RENDER.operator-west.{WEST_FILTER}",
        {"name": "operator-west", "durable_name": "operator-west", "filter_subject": WEST_FILTER}
        | EXPLICIT,
    ),
    "unfiltered, east's name": _create(
        "CREATE.WINGSMITH_RENDER.operator-east",
        {"name": "operator-east", "durable_name": "operator-east"} | EXPLICIT,
    ),
    "unfiltered, unnamed": _create("CREATE.WINGSMITH_RENDER", EXPLICIT),
    "unfiltered, the older durable form": _create(
        "DURABLE.CREATE.WINGSMITH_RENDER.operator-east",
        {"durable_name": "operator-east"} | EXPLICIT,
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_CREATIONS))
async def test_an_operator_cannot_create_a_consumer_beyond_its_own_subjects(
    case: str, hub: Client, east: Client, caplog: pytest.LogCaptureFixture
) -> None:
    subject, request = REFUSED_CREATIONS[case]
    answer = orjson.loads((await hub.request(subject, request, timeout=5)).data)
    assert "error" not in answer, answer  # the hub may: the request itself is a valid one
    await hub.jetstream().delete_consumer(names.RENDER_STREAM, answer["name"])

    with pytest.raises(nats.errors.TimeoutError):
        await east.request(subject, request, timeout=OPERATOR_TIMEOUT)
    await refused(caplog, "publish", subject)
    consumers = [c.name for c in await hub.jetstream().consumers_info(names.RENDER_STREAM)]
    assert consumers == []


async def test_the_filter_in_a_request_must_be_the_one_its_subject_names(
    hub: Client, east: Client
) -> None:
    """East may publish to its own create subject, whatever the body says: JetStream itself
    refuses a body whose filter is not the subject's."""
    own_filter = {"name": "operator-east", "durable_name": "operator-east"} | EXPLICIT
    subject, request = _create(
        OWN_CREATE, own_filter | {"filter_subject": "wingsmith.render.east.>"}
    )
    answer = orjson.loads((await east.request(subject, request, timeout=5)).data)
    assert answer["config"]["filter_subject"] == "wingsmith.render.east.>"
    await east.jetstream().delete_consumer(names.RENDER_STREAM, "operator-east")

    mismatch, several = 10131, 10137  # the filter is not the subject's; several filters
    cases: list[tuple[dict[str, Any], set[int]]] = [
        ({"filter_subject": WEST_FILTER}, {mismatch}),
        ({"filter_subject": ">"}, {mismatch}),
        ({}, {mismatch}),
        # Servers before 2.10 know no `filter_subjects`: they see no filter, hence a mismatch.
        ({"filter_subjects": [WEST_FILTER]}, {several, mismatch}),
        ({"filter_subjects": ["wingsmith.render.east.>", WEST_FILTER]}, {several, mismatch}),
    ]
    for body, codes in cases:
        subject, request = _create(OWN_CREATE, own_filter | body)
        answer = orjson.loads((await east.request(subject, request, timeout=5)).data)
        assert answer["error"]["err_code"] in codes, (body, answer)
    assert await hub.jetstream().consumers_info(names.RENDER_STREAM) == []


async def test_an_operator_cannot_get_another_clusters_message_directly(
    hub: Client, east: Client, caplog: pytest.LogCaptureFixture
) -> None:
    # Direct get answers only on streams that allow it: allow it, to show the permission holds.
    js = hub.jetstream()
    render = next(s for s in nats_bus.STREAMS if s.name == names.RENDER_STREAM)
    await js.update_stream(dataclasses.replace(render, allow_direct=True))
    last_of_west = orjson.dumps({"last_by_subj": WEST_SUBJECT})
    attempts = [
        (f"$JS.API.STREAM.MSG.GET.{names.RENDER_STREAM}", last_of_west),
        (f"$JS.API.DIRECT.GET.{names.RENDER_STREAM}", last_of_west),
        (f"$JS.API.DIRECT.GET.{names.RENDER_STREAM}.{WEST_SUBJECT}", b""),
        (f"$JS.API.STREAM.INFO.{names.RENDER_STREAM}", b'{"subjects_filter": ">"}'),
    ]
    for subject, request in attempts:
        answer = await hub.request(subject, request, timeout=5)  # the hub gets west's message
        named = (answer.headers or {}).get("Nats-Subject", "") + answer.data.decode()
        assert WEST_SUBJECT in named, answer

        with pytest.raises(nats.errors.TimeoutError):
            await east.request(subject, request, timeout=OPERATOR_TIMEOUT)
        await refused(caplog, "publish", subject)

    with pytest.raises(nats.errors.TimeoutError):  # nats-py's own message get, likewise
        await east.jetstream(timeout=OPERATOR_TIMEOUT).get_msg(
            names.RENDER_STREAM, subject=WEST_SUBJECT
        )


async def test_an_operator_cannot_subscribe_outside_its_own_inbox(
    hub: Client, east: Client, west: Client, caplog: pytest.LogCaptureFixture
) -> None:
    east_got: list[Msg] = []
    hub_got: list[Msg] = []

    async def east_cb(msg: Msg) -> None:
        east_got.append(msg)

    async def hub_cb(msg: Msg) -> None:
        hub_got.append(msg)

    for subject in ["wingsmith.render.west.>", "_INBOX_west.>", "_INBOX.>", ">"]:
        await east.subscribe(subject, cb=east_cb)
        await refused(caplog, "subscription", subject)
    await hub.subscribe("wingsmith.render.west.>", cb=hub_cb)
    await hub.flush()

    # A new render for west, and a west request whose answer comes to west's inbox.
    await publish_render(hub, "west", "llama--west", {"generation": 2}, 6)
    await nats_bus.publish_observation(west, "west", "replica", {"cluster_id": "west"}, "w-2")
    await eventually(lambda: len(hub_got) == 1, "the hub to see west's render message")
    await east.flush()
    await asyncio.sleep(0.2)  # anything routed to east would have arrived by now
    assert east_got == []

    # East's connection still works, for what is its own.
    await nats_bus.publish_observation(east, "east", "replica", {"cluster_id": "east"}, "e-3")


async def test_operators_cannot_send_commands_or_write_anything_else(
    server: EmbeddedNatsServer, hub: Client, east: Client, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[str] = []

    async def answer(msg: Msg) -> None:
        received.append(msg.subject)
        await msg.respond(b'{"ok": true}')

    await hub.subscribe("wingsmith.cmd.>", cb=answer)
    await hub.flush()
    client = await nats_bus.connect(
        server.url, "test-cli", user=CLIENT.user, password=CLIENT.password
    )
    try:
        reply = await client.request("wingsmith.cmd.workload.create", b"{}", timeout=5)
        assert orjson.loads(reply.data) == {"ok": True}
        assert received == ["wingsmith.cmd.workload.create"]
    finally:
        await client.close()

    with pytest.raises(nats.errors.TimeoutError):
        await east.request("wingsmith.cmd.workload.create", b"{}", timeout=OPERATOR_TIMEOUT)
    await refused(caplog, "publish", "wingsmith.cmd.workload.create")
    assert received == ["wingsmith.cmd.workload.create"]

    # Nor may it write events, its own desired state, or the hub's views.
    js = east.jetstream(timeout=OPERATOR_TIMEOUT)
    for subject in [
        "wingsmith.evt.deployment.llama--east.DeploymentScaled",
        "wingsmith.render.east.llama--east",
        "wingsmith.proj.fleet.east",
    ]:
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish(subject, b"{}")
        await refused(caplog, "publish", subject)
    for stream in [names.EVENTS_STREAM, names.VIEWS_STREAM]:
        assert (await hub.jetstream().stream_info(stream)).state.messages == 0
    latest = await hub.jetstream().get_msg(
        names.RENDER_STREAM, subject="wingsmith.render.east.llama--east"
    )
    assert orjson.loads(latest.data or b"") == EAST_LATEST["wingsmith.render.east.llama--east"]


async def test_a_viewer_reads_streams_but_sends_no_command(
    server: EmbeddedNatsServer, hub: Client, caplog: pytest.LogCaptureFixture
) -> None:
    viewer = await nats_bus.connect(
        server.url, "test-viewer", user=VIEWER.user, password=VIEWER.password
    )
    try:
        read = nats_bus.read_stream(
            viewer, names.RENDER_STREAM, "wingsmith.render.>", follow=False, start="last"
        )
        subjects = {m.subject: orjson.loads(m.data) async for m in read}
        assert subjects == EAST_LATEST | {WEST_SUBJECT: {"generation": 1, "replicas": 3}}

        views = nats_bus.ViewPublisher(hub)  # what the projector keeps, as the CLI reads it
        await views.start(["fleet"])
        await views.latest("fleet", "east", b'{"devices": 8}', 7)
        await views.progress({"position": 7})
        await views.flush()
        assert await nats_bus.latest_views(viewer, "fleet") == {"east": (7, b'{"devices": 8}')}
        assert await nats_bus.projector_progress(viewer) == {"position": 7}

        with pytest.raises(nats.errors.TimeoutError):
            await viewer.request("wingsmith.cmd.workload.create", b"{}", timeout=OPERATOR_TIMEOUT)
        await refused(caplog, "publish", "wingsmith.cmd.workload.create")

        # It cannot take the hub's observations from the hub's durable consumer, nor remove it.
        js = hub.jetstream()
        await js.add_consumer(names.OBS_STREAM, ConsumerConfig(durable_name="wingsmith-hub"))
        pull = f"$JS.API.CONSUMER.MSG.NEXT.{names.OBS_STREAM}.wingsmith-hub"
        no_wait = b'{"batch": 1, "no_wait": true}'
        answer = await hub.request(pull, no_wait, timeout=5)
        assert (answer.headers or {}).get("Status") == "404"  # served to the hub: nothing yet
        with pytest.raises(nats.errors.TimeoutError):
            await viewer.request(pull, no_wait, timeout=OPERATOR_TIMEOUT)
        await refused(caplog, "publish", pull)
        with pytest.raises(nats.errors.TimeoutError):
            await viewer.jetstream(timeout=OPERATOR_TIMEOUT).delete_consumer(
                names.OBS_STREAM, "wingsmith-hub"
            )
        await refused(caplog, "publish", "$JS.API.CONSUMER.DELETE.WINGSMITH_OBS.wingsmith-hub")
        assert await js.delete_consumer(names.OBS_STREAM, "wingsmith-hub")  # still there
    finally:
        await viewer.close()


async def test_an_operator_may_remove_only_its_own_consumer(
    hub: Client, east: Client, west: Client, caplog: pytest.LogCaptureFixture
) -> None:
    assert await read_renders(west, "west", 1)
    js = east.jetstream(timeout=OPERATOR_TIMEOUT)
    with pytest.raises(nats.errors.TimeoutError):
        await js.delete_consumer(names.RENDER_STREAM, "operator-west")
    await refused(caplog, "publish", "$JS.API.CONSUMER.DELETE.WINGSMITH_RENDER.operator-west")
    with pytest.raises(nats.errors.TimeoutError):
        await js.consumer_info(names.RENDER_STREAM, "operator-west")
    await refused(caplog, "publish", "$JS.API.CONSUMER.INFO.WINGSMITH_RENDER.operator-west")
    assert await hub.jetstream().consumer_info(names.RENDER_STREAM, "operator-west")
    with pytest.raises(NotFoundError):  # its own is within reach (and absent until it reads)
        await js.consumer_info(names.RENDER_STREAM, "operator-east")


class RecordingBackend:
    """A cluster that records what it is asked to run (the operator's seam to a cluster)."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, Any]] = []

    async def apply(self, deployment_id: str, desired: Mapping[str, Any] | None) -> None:
        self.applied.append((deployment_id, desired))

    async def observe(self, report: Report) -> None:
        await asyncio.Future()  # reports nothing, until cancelled

    def snapshot(self, only: str | None = None) -> None:
        return None  # never able to tell the whole truth: no sync

    def readiness(self) -> dict[str, bool]:
        return {"listed": False}


async def test_an_operator_never_acts_on_another_clusters_render_message(
    hub: Client, east: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Even when the permissions are bypassed (here the hub itself re-filters east's consumer
    onto west's subjects, and renders an object for west on east's subject), east refuses
    what names another cluster: logged, counted, never handed to its cluster."""
    for position, deployment_id in enumerate(["llama--east", "qwen--east"], 5):
        await publish_render(hub, "east", deployment_id, {"cluster_id": "east"}, position)
    backend, counts = RecordingBackend(), OperatorCounts()
    options = OperatorOptions(cluster_id="east", heartbeat_every=60)
    operator = asyncio.create_task(run_operator(east, backend, options, counts))
    try:
        await eventually(lambda: len(backend.applied) == 2, "east's two deployments applied")
        assert {d for d, _ in backend.applied} == {"llama--east", "qwen--east"}

        sneaky = {"deployment_id": "llama--west", "cluster_id": "west", "replicas": 9}
        await publish_render(hub, "east", "sneaky--east", sneaky, 10)
        await publish_render(hub, "east", "mistral--east", {"cluster_id": "east"}, 11)
        await eventually(lambda: len(backend.applied) == 3, "east's next deployment applied")
        assert backend.applied[-1][0] == "mistral--east"
        assert counts.foreign_renders == 1

        js = hub.jetstream()
        config = nats_bus.render_consumer_config("east")
        config.filter_subject = WEST_FILTER  # the hijack: east's consumer on west's subjects
        await js.add_consumer(names.RENDER_STREAM, config)
        await publish_render(hub, "west", "llama--west", {"cluster_id": "west", "replicas": 5}, 12)
        await eventually(lambda: counts.foreign_renders >= 2, "west's render message refused")
    finally:
        await cancel_and_wait(operator)
    assert sorted(d for d, _ in backend.applied) == ["llama--east", "mistral--east", "qwen--east"]
    assert "not for cluster east" in caplog.text


def test_the_compose_file_holds_the_generated_configuration() -> None:
    """docker-compose.yml carries its NATS configuration inline; it must be what the generator
    writes for its users (the passwords are references to the servers' environment)."""
    compose = yaml.safe_load((Path(__file__).parents[2] / "docker-compose.yml").read_text())
    content = compose["configs"]["nats-auth"]["content"].replace("$$", "$")
    assert content == nats_auth.server_config(
        Credentials("hub", "$WINGSMITH_HUB_PASSWORD"),
        {"east": "$WINGSMITH_EAST_PASSWORD", "west": "$WINGSMITH_WEST_PASSWORD"},
        client=Credentials("cli", "$WINGSMITH_CLI_PASSWORD"),
        api=Credentials("api", "$WINGSMITH_API_NATS_PASSWORD"),
    )


async def test_an_installation_reads_each_password_from_the_servers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wingsmith nats-config` (deploy/kubernetes/control-plane): every password is a reference
    to a variable named after its user, which the server resolves from its environment."""
    config = nats_auth.installed_config(["gpu-prod-1"])
    assert config == nats_auth.server_config(
        Credentials("hub", "$NATS_PASSWORD_HUB"),
        {"gpu-prod-1": "$NATS_PASSWORD_OPERATOR_GPU_PROD_1"},
        client=Credentials("cli", "$NATS_PASSWORD_CLI"),
        api=Credentials("api", "$NATS_PASSWORD_API"),
    )
    users = ["hub", "api", "cli", "operator-gpu-prod-1"]
    for user in users:
        monkeypatch.setenv(nats_auth.password_variable(user), f"{user}-pw")
    async with EmbeddedNatsServer(tmp_path / "nats", config=config) as server:
        for user in users:
            async with asyncio.timeout(10):  # a refused login is retried, not raised
                nc = await nats_bus.connect(server.url, user, user=user, password=f"{user}-pw")
            try:
                await nc.flush(timeout=5)
            finally:
                await nc.close()
