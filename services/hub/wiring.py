"""The one place that wires the hub together: nats-server, store, command service, relay,
scheduler, the supervised projector process and the health monitor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, Histogram

from wingsmith.adapters import nats_bus
from wingsmith.adapters.checkpoints import CheckpointStore
from wingsmith.adapters.dead_letters import DeadLetters
from wingsmith.adapters.dead_letters import stored as dead_letters_stored
from wingsmith.adapters.nats_auth import PASSWORD_VARIABLE, USER_VARIABLE
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.adapters.store import Notification, NotWritable, StoreThread, store_env
from wingsmith.domain.moves import MoveRules
from wingsmith.domain.names import HEALTH_SUBJECT
from wingsmith.projections.fleet import PROJECTIONS
from wingsmith.services.config import Settings, connect
from wingsmith.services.hub.backpressure import Backlog, Backpressure
from wingsmith.services.hub.ingest import Buckets, RateLimit, ingest
from wingsmith.services.hub.janitor import hub_janitor
from wingsmith.services.hub.liveness import Liveness
from wingsmith.services.hub.metrics import (
    CommandMetrics,
    DeviceSeconds,
    HubCollector,
    ViewsCollector,
    admission_wait,
    allocated,
)
from wingsmith.services.hub.monitor import HealthMonitor, Stages
from wingsmith.services.hub.owner import owning
from wingsmith.services.hub.projector import Projector
from wingsmith.services.hub.relay import Relay
from wingsmith.services.hub.scheduler import Scheduler
from wingsmith.services.hub.service import CommandService
from wingsmith.services.hub.supervisor import Supervisor, python_module
from wingsmith.services.metrics import new_registry, serving_metrics
from wingsmith.services.tasks import cancel_and_wait

log = logging.getLogger(__name__)

DEVICE_SECONDS_EVERY = 1.0  # seconds between samples of the devices held, for device-seconds
COMMANDS_DRAIN = 30.0  # seconds the command service gets to answer what it holds, at shutdown
RELAY_DRAIN = 10.0  # seconds the relay gets to publish what was stored, at shutdown


@dataclass
class Hub:
    nats_url: str
    nc: nats_bus.Connection
    store: StoreThread
    commands: CommandService
    relay: Relay | None
    projector: Supervisor | None
    health: HealthMonitor
    tasks: list[asyncio.Task[None]]  # run until shutdown; one ending early is a failure
    # what the hub's stages (scheduler, observation intake) set aside; the projector, in its
    # own process, keeps its own (both are on WINGSMITH_DEAD: `dead_letters.stored`)
    dead_letters: DeadLetters
    registry: CollectorRegistry  # its metrics (services/hub/metrics.py)
    scheduler: Scheduler | None = None  # its `position`: folded and decided up to there


@contextlib.asynccontextmanager
async def embedded_or_given_nats(settings: Settings) -> AsyncIterator[str]:
    """The configured NATS URL, or an embedded nats-server for as long as the block runs."""
    if settings.nats_url:
        yield settings.nats_url
        return
    async with EmbeddedNatsServer(settings.data_dir / "nats") as server:
        settings.url_file.write_text(server.url)
        try:
            yield server.url
        finally:
            settings.url_file.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def running_hub(
    settings: Settings, registry: CollectorRegistry | None = None
) -> AsyncIterator[Hub]:
    """Serve commands until the block ends; then stop intake, answer what was queued, let the
    relay publish what was committed, and close. Its metrics go in `registry` (by default
    one of its own: `Hub.registry`)."""
    registry = registry if registry is not None else new_registry()
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(owning(settings.data_dir))  # before anything there is touched
        store = await open_writable_store(settings)  # nothing else starts without it
        stack.push_async_callback(store.close)
        url = await stack.enter_async_context(embedded_or_given_nats(settings))
        nc = await connect(settings, "wingsmith-hub", url)
        stack.push_async_callback(nc.close)
        await _ensure_streams(nc, settings)

        dead_letters = DeadLetters(nc)
        relay: Relay | None = None
        backpressure: Backpressure | None = None
        projector: Supervisor | None = None
        on_committed: Callable[[list[Notification]], None] = _ignore
        if settings.relay:  # one hub per store runs the relay and the projector
            publisher = nats_bus.EventPublisher(nc)
            await publisher.start()
            stack.push_async_callback(publisher.close)
            relay = Relay(store, publisher)
            backpressure = Backpressure(Backlog(), max_lag=settings.intake_max_lag)
            on_committed = _both(relay.feed, backpressure.backlog.committed)
            # the follower clients wait for: the scheduler when it runs (set below), else the relay
            backpressure.backlog.handled = lambda: relay.position if relay else 0
            if settings.projector:
                projector = await stack.enter_async_context(supervised_projector(url, settings))
        commands = CommandService(
            store,
            nats_bus.NatsPublisher(nc),
            on_committed,
            settings.max_command_bytes,
            backpressure,
            CommandMetrics(registry),
        )
        tasks = {"commands": asyncio.create_task(commands.run(), name="wingsmith-commands")}
        stages = Stages(
            store,
            relay,
            projector=projector,
            dead_letters_stored=lambda: dead_letters_stored(nc),
            dead_letters=dead_letters,  # for the latest one this hub set aside
        )
        if projector is not None:
            stages.projector_progress = lambda: nats_bus.projector_progress(nc)
            assert projector.task is not None
            tasks["projector"] = projector.task
        if relay is not None:
            tasks["relay"] = asyncio.create_task(relay.run(), name="wingsmith-relay")
        liveness: Liveness | None = None
        scheduler: Scheduler | None = None
        if relay is not None and settings.admission:
            env = store_env(settings.store_url, settings.data_dir)
            ledgers = LedgerCheckpoints(store, await store.run(CheckpointStore, env))
            stack.push_async_callback(store.run, ledgers.checkpoints.close)
            scheduler = scheduler_process(
                store, relay, commands, dead_letters, settings, ledgers, admission_wait(registry)
            )
            stages.scheduler_position = lambda: scheduler.position if scheduler else 0
            relay.on_published = scheduler.published
            if backpressure is not None:  # the scheduler follows the relay: its lag is the hub's
                backpressure.backlog.handled = lambda: scheduler.position if scheduler else 0
            tasks["scheduler"] = asyncio.create_task(scheduler.run(), name="wingsmith-scheduler")
            liveness = Liveness(
                commands.execute,
                lambda: scheduler.ledger.reachability(),
                settings.cluster_silence,
            )
            tasks["liveness"] = asyncio.create_task(liveness.run(), name="wingsmith-liveness")
        if relay is not None:  # observations are handled in one place, in publication order
            observations = ingest(
                lambda: nats_bus.observation_batches(nc),
                commands.execute,
                liveness.heard if liveness else lambda cluster_id: None,
                dead_letters,
                Buckets(RateLimit(settings.observation_rate, settings.observation_burst)),
            )
            tasks["ingest"] = asyncio.create_task(observations, name="wingsmith-ingest")
        if relay is not None and settings.consumer_sweep:  # deletes readers' lasting consumers
            janitor = hub_janitor(nc, settings.consumer_sweep)
            tasks["consumer-sweep"] = await stack.enter_async_context(janitor.running())
        health = HealthMonitor(stages, settings.health)
        collector = HubCollector(health.store_positions, liveness.silences if liveness else None)
        registry.register(collector)
        stack.callback(registry.unregister, collector)
        tasks["health"] = asyncio.create_task(health.run(), name="wingsmith-health")
        subscription = await nats_bus.subscribe_commands(
            nc, _answering_health(health, nats_bus.NatsPublisher(nc), commands.submit)
        )
        try:
            yield Hub(
                url,
                nc,
                store,
                commands,
                relay,
                projector,
                health,
                list(tasks.values()),
                dead_letters,
                registry,
                scheduler,
            )
        finally:
            await _shut_down(subscription, commands, relay, tasks)


def scheduler_process(
    store: StoreThread,
    relay: Relay,
    commands: CommandService,
    dead_letters: DeadLetters,
    settings: Settings,
    checkpoints: LedgerCheckpoints | None = None,
    waits: Histogram | None = None,
) -> Scheduler:
    """The scheduler beside the relay, reading what it publishes."""

    async def read(after: int, limit: int, stop: int) -> list[Notification]:
        return await store.run(store.store.read, after, limit, stop)

    async def published_upto() -> int:
        await relay.synced.wait()
        return relay.position

    rules = MoveRules(
        move_after=timedelta(seconds=settings.placement_move_after),
        lost_after=timedelta(seconds=settings.cluster_lost_after),
        max_fraction=settings.rebalance_max_fraction,
    )
    return Scheduler(
        read,
        commands.execute_all,
        published_upto,
        dead_letters,
        move_rules=rules,
        admission_wait=waits,
        checkpoints=checkpoints,
    )


@dataclass
class LedgerCheckpoints:
    """The scheduler's saved ledger, in the checkpoints' tables, from the store's thread."""

    store: StoreThread
    checkpoints: CheckpointStore

    async def save(self, position: int, format: str, state: bytes) -> None:
        await self.store.run(self.checkpoints.save_ledger, position, format, state)

    async def latest(self, format: str) -> tuple[int, bytes] | None:
        return await self.store.run(self.checkpoints.ledger, format)


async def open_writable_store(settings: Settings) -> StoreThread:
    """The event store, once a write to it has succeeded: a hub on a store it cannot write
    would answer every command with a refusal, so it refuses to start instead."""
    where = _shown_store(settings)
    try:
        store = await StoreThread.open(store_env(settings.store_url, settings.data_dir))
    except Exception as e:
        raise NotWritable(f"cannot open the event store {where} ({e}); {_STORE_HINT}") from e
    try:
        await store.run(store.store.probe_write)
    except NotWritable as e:
        await store.close()
        raise NotWritable(
            f"the event store {where} cannot be written ({e}); the hub records every command "
            f"there. {_STORE_HINT}"
        ) from e
    return store


_STORE_HINT = (
    "SQLite: the file and its directory must be writable by this user. PostgreSQL: the "
    "server must be reachable and not read-only, and the user allowed to create tables and "
    "insert rows."
)


def _shown_store(settings: Settings) -> str:
    if settings.store_url is None:
        return str(settings.data_dir / "events.sqlite")
    parts = urlparse(settings.store_url)
    if parts.password:  # never print a password
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    return parts.geturl()


async def _ensure_streams(nc: nats_bus.Connection, settings: Settings) -> None:
    await nats_bus.ensure_streams(
        nc,
        settings.stream_replicas,
        max_bytes=settings.stream_max_bytes,
        views_duplicate_window=settings.views_duplicate_window,
    )


def _answering_health(
    health: HealthMonitor,
    publisher: nats_bus.NatsPublisher,
    submit: Callable[[str, bytes, str | None], Awaitable[None]],
) -> Callable[[str, bytes, str | None], Awaitable[None]]:
    """The command intake, with the health question answered at once (not queued behind the
    commands: a hub busy with a backlog still says how it is)."""

    async def handle(subject: str, data: bytes, reply_to: str | None) -> None:
        if subject != HEALTH_SUBJECT:
            await submit(subject, data, reply_to)
        elif reply_to:
            await publisher.publish(reply_to, health.report().model_dump_json().encode())

    return handle


@contextlib.asynccontextmanager
async def supervised_projector(nats_url: str, settings: Settings) -> AsyncIterator[Supervisor]:
    """The projector in a process of its own (folding every event is CPU work that would
    otherwise share the hub's interpreter lock with command handling), started again whenever
    it ends, until the block ends."""
    env = os.environ | {
        "WINGSMITH_NATS_URL": nats_url,
        "WINGSMITH_DATA_DIR": str(settings.data_dir),
        "WINGSMITH_CHECKPOINT_SECONDS": str(settings.checkpoint_seconds),
        "WINGSMITH_VIEWS_DUPLICATE_WINDOW": str(settings.views_duplicate_window),
        "WINGSMITH_STREAM_REPLICAS": str(settings.stream_replicas),
    }
    env.pop("WINGSMITH_METRICS_LISTEN", None)  # the hub's: the projector has its own
    if settings.projector_metrics_listen is not None:
        host, port = settings.projector_metrics_listen
        env["WINGSMITH_METRICS_LISTEN"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if settings.store_url:
        env["WINGSMITH_STORE"] = settings.store_url
    if settings.nats_credentials:
        env[USER_VARIABLE] = settings.nats_credentials.user
        env[PASSWORD_VARIABLE] = settings.nats_credentials.password
    supervisor = Supervisor("projector", python_module("wingsmith", "projector"), env)
    supervisor.start()
    try:
        yield supervisor
    finally:
        await supervisor.stop()


@contextlib.asynccontextmanager
async def running_projector(settings: Settings) -> AsyncIterator[Projector]:
    """Follow WINGSMITH_EVENTS into every projection until the block ends, then checkpoint."""
    async with contextlib.AsyncExitStack() as stack:
        nc = await connect(settings, "wingsmith-projector")
        stack.push_async_callback(nc.close)
        await _ensure_streams(nc, settings)
        env = store_env(settings.store_url, settings.data_dir)
        store = await StoreThread.open(env)
        stack.push_async_callback(store.close)
        checkpoints = await store.run(CheckpointStore, env)
        stack.push_async_callback(store.run, checkpoints.close)
        views = nats_bus.ViewPublisher(nc)
        await views.start([kind.name for kind in PROJECTIONS], settings.stream_replicas)
        projector = Projector(
            store,
            checkpoints,
            lambda seq: nats_bus.event_batches(nc, seq),
            views,
            dead_letters=DeadLetters(nc),
            checkpoint_every=settings.checkpoint_seconds,
        )
        device_seconds = DeviceSeconds(lambda: allocated(projector.fold))
        registry = new_registry()
        registry.register(ViewsCollector(lambda: projector.fold, device_seconds))
        url = await stack.enter_async_context(
            serving_metrics(registry, settings.metrics_listen, "the projector")
        )
        if url is not None:
            log.info("projector metrics: %s", url)
        task = asyncio.create_task(projector.run(), name="wingsmith-projector")
        sampling = asyncio.create_task(
            _sample_every(device_seconds, DEVICE_SECONDS_EVERY), name="wingsmith-device-seconds"
        )
        try:
            yield projector
        finally:
            await cancel_and_wait(sampling)
            await cancel_and_wait(task)
            with contextlib.suppress(Exception):  # without it, the next start replays a little more
                await projector.close()


async def _shut_down(
    subscription: nats_bus.Subscription,
    commands: CommandService,
    relay: Relay | None,
    tasks: dict[str, asyncio.Task[None]],
) -> None:
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()
    await cancel_and_wait(tasks["health"])  # it reads the store, which closes next
    for sender in (
        "ingest",
        "scheduler",
        "liveness",
    ):  # they send commands: stop them before they close
        if sender in tasks:
            await cancel_and_wait(tasks[sender])
    commands.close()
    async with asyncio.timeout(COMMANDS_DRAIN):
        await asyncio.gather(tasks["commands"], return_exceptions=True)  # failures were logged
    if relay is not None and not tasks["relay"].done():
        with contextlib.suppress(TimeoutError):  # an unreachable server: a restart catches up
            async with asyncio.timeout(RELAY_DRAIN):
                await relay.idle()
    if "relay" in tasks:
        await cancel_and_wait(tasks["relay"])


async def _sample_every(device_seconds: DeviceSeconds, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        device_seconds.sample()


def _ignore(_: object) -> None:
    return None


def _both(
    first: Callable[[list[Notification]], None], second: Callable[[list[Notification]], None]
) -> Callable[[list[Notification]], None]:
    def both(notifications: list[Notification]) -> None:
        first(notifications)
        second(notifications)

    return both
