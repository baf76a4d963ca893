"""The one place that wires the hub together: nats-server, store, command service, relay,
scheduler, the supervised projector process and the health monitor."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, Histogram

from wingsmith.adapters import nats_bus
from wingsmith.adapters.checkpoints import CheckpointStore
from wingsmith.adapters.dead_letters import DeadLetters
from wingsmith.adapters.dead_letters import stored as dead_letters_stored
from wingsmith.adapters.lease import NatsLease
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
from wingsmith.services.hub.lease import Leadership, LeaseLost, LeaseTiming, holder_name
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
FIRST_TAKE = 5.0  # seconds a starting hub gives the lease (to take it, or see who holds it)


@dataclass
class Roles:
    """The roles one hub per store runs, while it holds the lease (services/hub/lease.py)."""

    relay: Relay
    backpressure: Backpressure
    projector: Supervisor | None = None
    scheduler: Scheduler | None = None
    liveness: Liveness | None = None
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # until they stop


@dataclass
class Hub:
    nats_url: str
    nc: nats_bus.Connection
    store: StoreThread
    commands: CommandService
    health: HealthMonitor
    tasks: list[asyncio.Task[None]]  # run until shutdown; one ending early is a failure
    # what the hub's stages (scheduler, observation intake) set aside; the projector, in its
    # own process, keeps its own (both are on WINGSMITH_DEAD: `dead_letters.stored`)
    dead_letters: DeadLetters
    registry: CollectorRegistry  # its metrics (services/hub/metrics.py)
    leadership: Leadership
    one_per_store: OnePerStore

    @property
    def roles(self) -> Roles | None:
        """What this hub runs of the one-per-store roles (None: another hub holds the lease)."""
        return self.one_per_store.running

    @property
    def relay(self) -> Relay | None:
        return self.roles.relay if self.roles else None

    @property
    def projector(self) -> Supervisor | None:
        return self.roles.projector if self.roles else None

    @property
    def scheduler(self) -> Scheduler | None:  # its `position`: folded and decided up to there
        return self.roles.scheduler if self.roles else None


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
    """Serve commands until the block ends, and run the one-per-store roles whenever this hub
    holds the lease; then stop intake, answer what was queued, let the relay publish what was
    committed, release the lease and close. Its metrics go in `registry` (by default one of
    its own: `Hub.registry`)."""
    registry = registry if registry is not None else new_registry()
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(owning(settings.data_dir))  # before anything there is touched
        store = await open_writable_store(settings)  # nothing else starts without it
        stack.push_async_callback(store.close)
        url = await stack.enter_async_context(embedded_or_given_nats(settings))
        nc = await connect(settings, "wingsmith-hub", url)
        stack.push_async_callback(nc.close)
        await _ensure_streams(nc, settings)
        lease = await NatsLease.open(nc, settings.stream_replicas)

        dead_letters = DeadLetters(nc)
        commands = CommandService(
            store,
            nats_bus.NatsPublisher(nc),
            _ignore,
            settings.max_command_bytes,
            metrics=CommandMetrics(registry),
        )
        stages = Stages(
            store,
            dead_letters_stored=lambda: dead_letters_stored(nc),
            dead_letters=dead_letters,  # for the latest one this hub set aside
        )
        one_per_store = OnePerStore(
            settings, url, nc, store, commands, dead_letters, stages, admission_wait(registry)
        )
        leadership = Leadership(
            lease,
            holder_name(settings.data_dir),
            one_per_store.run,
            LeaseTiming(settings.lease_seconds),
            prefer=settings.relay,
        )
        stages.lease = leadership.check
        health = HealthMonitor(stages, settings.health)
        collector = HubCollector(
            health.store_positions, one_per_store.silences, lambda: leadership.token
        )
        registry.register(collector)
        stack.callback(registry.unregister, collector)
        tasks = {
            "commands": asyncio.create_task(commands.run(), name="wingsmith-commands"),
            "health": asyncio.create_task(health.run(), name="wingsmith-health"),
        }
        leading = asyncio.create_task(leadership.run(), name="wingsmith-lease")
        with contextlib.suppress(TimeoutError):  # start with the roles if it takes them at once
            async with asyncio.timeout(FIRST_TAKE):
                await leadership.settled.wait()
        subscription = await nats_bus.subscribe_commands(
            nc, _answering_health(health, nats_bus.NatsPublisher(nc), commands.submit)
        )
        try:
            yield Hub(
                url,
                nc,
                store,
                commands,
                health,
                [*tasks.values(), leading],
                dead_letters,
                registry,
                leadership,
                one_per_store,
            )
        finally:
            await _shut_down(subscription, commands, one_per_store, leadership, leading, tasks)


@dataclass
class OnePerStore:
    """Starts and stops the roles one hub per store runs: the relay, the projector, the
    scheduler, liveness, report intake and the consumer sweep (`WINGSMITH_PROJECTOR` and
    `WINGSMITH_ADMISSION` leave some out)."""

    settings: Settings
    url: str
    nc: nats_bus.Connection
    store: StoreThread
    commands: CommandService
    dead_letters: DeadLetters
    stages: Stages
    waits: Histogram  # admission wait, made once: a registry takes a family once
    running: Roles | None = None

    def silences(self) -> dict[str, float]:
        liveness = self.running.liveness if self.running else None
        return liveness.silences() if liveness else {}

    @contextlib.asynccontextmanager
    async def run(self, token: int) -> AsyncIterator[dict[str, asyncio.Task[None]]]:
        """Run the roles under fencing token `token` while the block runs; stop them when it
        ends (at once, without waiting for the relay to drain, when it ends with LeaseLost)."""
        fence = await self.store.run(self.store.store.fence, token)
        if fence != token:
            raise LeaseLost(f"the store is fenced at token {fence}, past this hub's {token}")
        async with contextlib.AsyncExitStack() as stack:
            roles = await self._start(stack, token)
            self.running = roles
            graceful = True
            try:
                yield roles.tasks
            except LeaseLost:
                graceful = False
                raise
            finally:
                await self._stop(roles, graceful=graceful)
                self.running = None

    async def _start(self, stack: contextlib.AsyncExitStack, token: int) -> Roles:
        settings, store, commands = self.settings, self.store, self.commands
        publisher = nats_bus.EventPublisher(self.nc)
        await publisher.start()
        stack.push_async_callback(publisher.close)
        relay = Relay(store, publisher)
        roles = Roles(relay, Backpressure(Backlog(), max_lag=settings.intake_max_lag))
        backlog = roles.backpressure.backlog
        # the follower clients wait for: the scheduler when it runs (set below), else the relay
        backlog.handled = lambda: relay.position
        if settings.projector:
            roles.projector = await stack.enter_async_context(
                supervised_projector(self.url, settings)
            )
            assert roles.projector.task is not None
            roles.tasks["projector"] = roles.projector.task
        roles.tasks["relay"] = asyncio.create_task(relay.run(), name="wingsmith-relay")
        execute = functools.partial(commands.execute, fence=token)
        if settings.admission:
            env = store_env(settings.store_url, settings.data_dir)
            ledgers = LedgerCheckpoints(store, await store.run(CheckpointStore, env))
            stack.push_async_callback(store.run, ledgers.checkpoints.close)
            execute_all = functools.partial(commands.execute_all, fence=token)
            scheduler = scheduler_process(
                store, relay, execute_all, self.dead_letters, settings, ledgers, self.waits
            )
            roles.scheduler = scheduler
            relay.on_published = scheduler.published
            backlog.handled = lambda: scheduler.position  # it follows the relay: its lag counts
            roles.tasks["scheduler"] = asyncio.create_task(
                scheduler.run(), name="wingsmith-scheduler"
            )
            roles.liveness = liveness = Liveness(
                execute, lambda: scheduler.ledger.reachability(), settings.cluster_silence
            )
            roles.tasks["liveness"] = asyncio.create_task(liveness.run(), name="wingsmith-liveness")
        # observations are handled in one place, in publication order
        observations = ingest(
            lambda: nats_bus.observation_batches(self.nc),
            execute,
            roles.liveness.heard if roles.liveness else lambda cluster_id: None,
            self.dead_letters,
            Buckets(RateLimit(settings.observation_rate, settings.observation_burst)),
        )
        roles.tasks["ingest"] = asyncio.create_task(observations, name="wingsmith-ingest")
        if settings.consumer_sweep:  # deletes readers' lasting consumers
            janitor = hub_janitor(self.nc, settings.consumer_sweep)
            roles.tasks["consumer-sweep"] = await stack.enter_async_context(janitor.running())
        commands.on_committed = _both(relay.feed, backlog.committed)
        commands.backpressure = roles.backpressure
        self._watch(roles)
        return roles

    def _watch(self, roles: Roles | None) -> None:
        """Point the health monitor at the roles (None: at none)."""
        stages = self.stages
        stages.relay = roles.relay if roles else None
        stages.projector = roles.projector if roles else None
        scheduler = roles.scheduler if roles else None
        stages.scheduler_position = (lambda: scheduler.position) if scheduler else None
        stages.projector_progress = (
            (lambda: nats_bus.projector_progress(self.nc)) if roles and roles.projector else None
        )

    async def stop_senders(self) -> None:
        """Stop the roles that send commands (before the command service closes)."""
        if self.running is not None:
            for name in SENDERS:
                if name in self.running.tasks:
                    await cancel_and_wait(self.running.tasks[name])

    async def _stop(self, roles: Roles, *, graceful: bool) -> None:
        """Stop the roles. Gracefully, the relay first publishes what was committed; at once
        (the lease lost), nothing waits and the projector is killed."""
        self._watch(None)
        self.commands.on_committed, self.commands.backpressure = _ignore, None
        for name in (*SENDERS, "consumer-sweep"):
            if name in roles.tasks:
                await cancel_and_wait(roles.tasks[name])
        if graceful and roles.scheduler is not None:  # so that the next start folds nothing
            await roles.scheduler.save_on_stop()
        relay = roles.tasks["relay"]
        if graceful and not relay.done():
            with contextlib.suppress(TimeoutError):  # an unreachable server: others catch up
                async with asyncio.timeout(RELAY_DRAIN):
                    await roles.relay.idle()
        await cancel_and_wait(relay)
        if roles.projector is not None and not graceful:
            await roles.projector.stop(grace=0)


SENDERS = ("ingest", "scheduler", "liveness")  # roles that send commands


def scheduler_process(
    store: StoreThread,
    relay: Relay,
    execute_all: Callable[..., Awaitable[list[dict[str, Any]]]],
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
        execute_all,
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
    one_per_store: OnePerStore,
    leadership: Leadership,
    leading: asyncio.Task[None],
    tasks: dict[str, asyncio.Task[None]],
) -> None:
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()
    await cancel_and_wait(tasks["health"])  # it reads the store, which closes next
    await one_per_store.stop_senders()  # they send commands: stop them before they close
    commands.close()
    async with asyncio.timeout(COMMANDS_DRAIN):
        await asyncio.gather(tasks["commands"], return_exceptions=True)  # failures were logged
    leadership.leave()  # the relay publishes what was committed; the lease is released
    await asyncio.gather(leading, return_exceptions=True)  # a role's failure was logged


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
