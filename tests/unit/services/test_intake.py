"""Observation intake: how each delivery is settled — handled, set aside for good with its
reason, or offered again later — and the per-cluster rate that slows a runaway operator
without holding back the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from wingsmith.adapters.nats_bus import Delivery
from wingsmith.domain import commands as c
from wingsmith.services.config import Settings
from wingsmith.services.hub.ingest import Buckets, Intake, RateLimit, command_id_of

HEARTBEAT = {"operator": {"instance": "i1", "version": "1.0", "read_only": False}}


@dataclass
class Settled:
    """Stands in for a JetStream message: records how it was settled."""

    how: list[tuple[str, float]] = field(default_factory=list)
    headers: dict[str, str] | None = None

    async def ack(self) -> None:
        self.how.append(("ack", 0.0))

    async def nak(self, delay: float = 0.0) -> None:
        self.how.append(("nak", delay))

    async def term(self) -> None:
        self.how.append(("term", 0.0))


def delivery(cluster: str, kind: str, body: dict[str, Any], n: int, log: Settled) -> Delivery:
    data = orjson.dumps({"cluster_id": cluster} | body)
    return Delivery(f"wingsmith.obs.{cluster}.{kind}", data, f"{cluster}:{n}", 0, log)  # type: ignore[arg-type]


@dataclass
class DeadLetters:
    kept: list[tuple[str, str, str]] = field(default_factory=list)

    async def set_aside(
        self,
        component: str,
        reason: str,
        subject: str,
        data: bytes,
        headers: Any = None,
        msg_id: str | None = None,
    ) -> None:
        self.kept.append((component, reason, subject))


class Hub:
    """Runs nothing: answers each command as told, and remembers what it was asked."""

    def __init__(self, reply: dict[str, Any] | None = None) -> None:
        self.reply = reply or {"ok": True, "result": {}}
        self.ran: list[c.Command] = []

    async def execute(self, command: c.Command) -> dict[str, Any]:
        self.ran.append(command)
        return self.reply


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def intake(hub: Hub, dead: DeadLetters, buckets: Buckets | None = None) -> Intake:
    return Intake(hub.execute, lambda cluster_id: None, dead, buckets or Buckets())


async def test_a_report_that_does_not_parse_is_set_aside_for_good_and_the_rest_flow() -> None:
    hub, dead, log = Hub(), DeadLetters(), Settled()
    bad = delivery("east", "heartbeat", {"operator": {"instance": "a b"}}, 1, log)
    good = delivery("east", "heartbeat", HEARTBEAT, 2, log)
    await intake(hub, dead).handle([bad, good])
    assert log.how == [("term", 0.0), ("ack", 0.0)]
    assert [command.command_id for command in hub.ran] == ["obs:east:2"]
    [(component, reason, subject)] = dead.kept
    assert (component, subject) == ("ingest", "wingsmith.obs.east.heartbeat")
    assert "operator.instance: 'a b' is not one word" in reason


async def test_a_report_the_hub_refuses_is_set_aside_with_the_field_and_acknowledged() -> None:
    error = {"code": "invalid_value", "message": "no node n9", "details": {"field": "node_id"}}
    hub, dead, log = Hub({"ok": False, "error": error}), DeadLetters(), Settled()
    await intake(hub, dead).handle([delivery("east", "heartbeat", HEARTBEAT, 1, log)])
    assert log.how == [("ack", 0.0)]
    subject = "wingsmith.obs.east.heartbeat"
    assert dead.kept == [("ingest", f"{subject}: node_id: no node n9", subject)]


async def test_a_node_agents_report_is_the_operators_and_passes_the_hub_by() -> None:
    """`wingsmith.obs.<cluster>.devices.<node>` is stored for audit, and read by the cluster's
    operator; the hub acknowledges it and neither runs nor sets aside anything for it."""
    hub, dead, log = Hub(), DeadLetters(), Settled()
    agent = delivery("east", "devices.gpu-1", {"node_id": "gpu-1"}, 1, log)
    await intake(hub, dead).handle([agent, delivery("east", "heartbeat", HEARTBEAT, 2, log)])
    assert log.how == [("ack", 0.0), ("ack", 0.0)]
    assert [command.command_id for command in hub.ran] == ["obs:east:2"]
    assert dead.kept == []


async def test_a_report_the_hub_cannot_handle_now_is_offered_again_not_set_aside() -> None:
    hub, dead, log = Hub({"ok": False, "error": {"code": "unavailable"}}), DeadLetters(), Settled()
    await intake(hub, dead).handle([delivery("east", "heartbeat", HEARTBEAT, 1, log)])
    assert log.how == [("nak", 1.0)] and dead.kept == []


def test_a_bucket_lets_a_burst_through_then_the_rate() -> None:
    clock = Clock()
    buckets = Buckets(RateLimit(rate=10, burst=3), clock)
    assert [buckets.take("east", f"e{n}") for n in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("east", "e3") == 0.1  # its turn: when a token is due
    assert buckets.take("west", "w0") == 0.0  # another cluster has its own bucket
    clock.now = 0.1
    assert buckets.take("east", "e3") == 0.0  # back on its turn, with its token kept
    assert buckets.take("east", "e4") == 0.1  # the next one counts from there


def test_waiting_reports_keep_their_order_and_come_back_on_their_turns() -> None:
    clock = Clock()
    buckets = Buckets(RateLimit(rate=10, burst=1, max_delay=0.35), clock)
    assert buckets.take("east", "e0") == 0.0
    delays = [round(buckets.take("east", f"e{n}"), 3) for n in range(1, 6)]
    assert delays == [0.1, 0.2, 0.3, 0.35, 0.35]  # a turn each, never offered later than 0.35 s
    clock.now = 0.35  # e4 and e5 come back early (their delay was capped): not their turn yet
    assert round(buckets.take("east", "e5"), 3) == 0.15
    assert round(buckets.take("east", "e4"), 3) == 0.05
    assert buckets.take("east", "new") > 0.15  # a new report waits behind all of them
    assert [buckets.take("east", f"e{n}") for n in (1, 2, 3)] == [0.0, 0.0, 0.0]
    clock.now = 10.0  # the backlog has drained and the bucket refilled
    assert buckets.take("east", "later") == 0.0


async def test_a_runaway_cluster_waits_in_order_while_another_goes_through() -> None:
    hub, dead, east, west = Hub(), DeadLetters(), Settled(), Settled()
    buckets = Buckets(RateLimit(rate=100, burst=2), Clock())
    batch = [delivery("east", "heartbeat", HEARTBEAT, n, east) for n in range(5)]
    batch.insert(3, delivery("west", "heartbeat", HEARTBEAT, 9, west))
    await intake(hub, dead, buckets).handle(batch)
    assert [command.command_id for command in hub.ran] == ["obs:east:0", "obs:east:1", "obs:west:9"]
    assert west.how == [("ack", 0.0)]
    naks = [delay for how, delay in east.how if how == "nak"]
    assert naks == sorted(naks) and len(naks) == 3 and naks[0] > 0  # later ones wait longer
    assert dead.kept == []


def test_the_hubs_observation_ids_carry_a_reserved_prefix() -> None:
    assert c.reserved_prefix(command_id_of("east:replica:uid-1")) == "obs:"


def test_rates_and_stream_sizes_are_configurable() -> None:
    env = {
        "WINGSMITH_OBS_RATE": "50",
        "WINGSMITH_OBS_BURST": "500",
        "WINGSMITH_STREAM_MAX_BYTES": "WINGSMITH_EVENTS=16G, WINGSMITH_OBS=512M",
    }
    settings = Settings.from_env(env)
    assert (settings.observation_rate, settings.observation_burst) == (50.0, 500.0)
    assert settings.stream_max_bytes == {
        "WINGSMITH_EVENTS": 16 * 1024**3,
        "WINGSMITH_OBS": 512 * 1024**2,
    }


def test_bad_rates_and_sizes_are_refused_naming_the_variable() -> None:
    for env, variable in [
        ({"WINGSMITH_OBS_RATE": "fast"}, "WINGSMITH_OBS_RATE"),
        ({"WINGSMITH_OBS_BURST": "0"}, "WINGSMITH_OBS_BURST"),
        ({"WINGSMITH_STREAM_MAX_BYTES": "EVENTS=1G"}, "WINGSMITH_STREAM_MAX_BYTES"),
        ({"WINGSMITH_STREAM_MAX_BYTES": "WINGSMITH_EVENTS=0"}, "WINGSMITH_STREAM_MAX_BYTES"),
    ]:
        try:
            Settings.from_env(env)
        except ValueError as e:
            assert variable in str(e)
        else:
            raise AssertionError(f"{env} was accepted")


def test_an_api_token_may_not_take_the_name_of_the_observations_prefix() -> None:
    try:
        Settings.from_env({"WINGSMITH_API_TOKENS": "obs:0123456789abcdef0123"})
    except ValueError as e:
        assert "'obs' is reserved" in str(e)
    else:
        raise AssertionError("a token named obs was accepted")


async def test_only_the_hubs_own_failures_count_toward_setting_a_report_aside() -> None:
    """An outage or a wait for the cluster's rate redelivers a report too; only `internal`
    failures of its handling count, and a success clears them."""
    hub, dead, log = Hub(), DeadLetters(), Settled()
    taking = intake(hub, dead)
    report = delivery("east", "heartbeat", HEARTBEAT, 1, log)
    replies = ["internal"] * 4 + ["unavailable", "ok"] + ["internal"] * 4
    for code in replies:
        hub.reply = {"ok": True} if code == "ok" else {"ok": False, "error": {"code": code}}
        await taking.handle([report])
    assert dead.kept == []  # never five failures in a row
    hub.reply = {"ok": False, "error": {"code": "internal", "message": "a bug"}}
    await taking.handle([report])
    [(component, reason, _)] = dead.kept
    assert component == "ingest" and "failed 5 times: a bug" in reason
    assert log.how[-1] == ("ack", 0.0)  # set aside, so the next ones flow
