"""The consumer sweep's decision: which lasting consumers are strangers, and that a stranger is
deleted only when a second sweep still sees it; and the sweep loop around it, on a fake admin."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wingsmith.adapters.nats_auth import durable_consumers
from wingsmith.adapters.nats_consumers import ConsumerSeen, is_wingsmith_stream
from wingsmith.domain.names import HUB_CONSUMER, OBS_STREAM, RENDER_STREAM
from wingsmith.services.config import Settings
from wingsmith.services.hub.janitor import (
    ConsumerJanitor,
    kept_durables,
    lasting,
    sweep_verdict,
)

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
EVENTS = "WINGSMITH_EVENTS"


def consumer(
    name: str,
    stream: str = EVENTS,
    *,
    durable: bool = True,
    idle: float | None = None,
    created: datetime = T0,
    push: bool = False,
) -> ConsumerSeen:
    return ConsumerSeen(stream, name, durable, idle, "wingsmith.evt.>", created, push)


HUBS = consumer(HUB_CONSUMER, OBS_STREAM)
EAST = consumer("operator-east", RENDER_STREAM)
ORDERED = consumer("reader-abc", durable=False, idle=5.0)
ROGUE = consumer("own-durable")


def test_the_kept_names_are_those_the_readers_permissions_deny() -> None:
    kept = kept_durables(["east", "west"])
    assert sorted(name for _, name in kept) == sorted(durable_consumers(["east", "west"]))


def test_a_stranger_is_suspected_first_and_deleted_by_the_next_sweep() -> None:
    first = sweep_verdict([HUBS, EAST, ORDERED, ROGUE], {"east"})
    assert first.delete == []
    second = sweep_verdict([HUBS, EAST, ORDERED, ROGUE], {"east"}, first.suspects)
    assert second.delete == [ROGUE]


def test_the_control_planes_consumers_and_ordered_ones_are_never_deleted() -> None:
    consumers = [HUBS, EAST, ORDERED]
    verdict = sweep_verdict(consumers, {"east"})
    again = sweep_verdict(consumers, {"east"}, verdict.suspects)
    assert (verdict.delete, again.delete, again.suspects) == ([], [], frozenset())


def test_an_operators_consumer_whose_cluster_starts_reporting_in_time_is_kept() -> None:
    """A new operator creates its consumer while its first heartbeat is on the way."""
    before = sweep_verdict([HUBS, EAST], set())
    assert before.delete == [] and before.suspects
    assert sweep_verdict([HUBS, EAST], {"east"}, before.suspects).delete == []


def test_an_operator_name_without_a_reporting_operator_is_a_stranger() -> None:
    """A reader may use the name of a cluster that has no operator user: nothing denies it."""
    ghost = consumer("operator-ghost", RENDER_STREAM)
    first = sweep_verdict([ghost], {"east"})
    assert sweep_verdict([ghost], {"east"}, first.suspects).delete == [ghost]


@pytest.mark.parametrize(
    "misplaced",
    [consumer(HUB_CONSUMER, EVENTS), consumer("operator-east", OBS_STREAM)],
    ids=["hubs-name-elsewhere", "operators-name-elsewhere"],
)
def test_a_kept_name_on_another_stream_is_a_stranger(misplaced: ConsumerSeen) -> None:
    first = sweep_verdict([misplaced], {"east"})
    assert sweep_verdict([misplaced], {"east"}, first.suspects).delete == [misplaced]


def test_an_operators_consumer_recreated_as_a_push_consumer_is_a_stranger() -> None:
    """An operator may recreate its own consumer to deliver its messages to another subject."""
    pushed = consumer("operator-east", RENDER_STREAM, push=True)
    first = sweep_verdict([pushed], {"east"})
    assert sweep_verdict([pushed], {"east"}, first.suspects).delete == [pushed]


def test_a_consumer_recreated_between_sweeps_is_suspected_anew() -> None:
    first = sweep_verdict([ROGUE], set())
    recreated = consumer("own-durable", created=T0 + timedelta(seconds=3))
    second = sweep_verdict([recreated], set(), first.suspects)
    assert second.delete == []
    assert sweep_verdict([recreated], set(), second.suspects).delete == [recreated]


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (consumer("d", durable=True, idle=None), True),
        (consumer("d", durable=True, idle=2.0), True),  # durable: still decided by its name
        (consumer("e", durable=False, idle=5.0), False),
        (consumer("e", durable=False, idle=300.0), False),
        (consumer("e", durable=False, idle=300.5), True),
        (consumer("e", durable=False, idle=None), True),
    ],
)
def test_what_lasts(seen: ConsumerSeen, expected: bool) -> None:
    assert lasting(seen) is expected


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("WINGSMITH_EVENTS", True),
        ("WINGSMITH_DEAD", True),
        ("KV_wingsmith_projector", True),
        ("KV_wingsmith_fleet", True),
        ("KV_other", False),
        ("ORDERS", False),
    ],
)
def test_only_wingsmiths_streams_are_swept(name: str, ours: bool) -> None:
    assert is_wingsmith_stream(name) is ours


names = st.sampled_from(
    [HUB_CONSUMER, "operator-east", "operator-west", "operator-x", "reader-1", "own"]
)
streams = st.sampled_from([OBS_STREAM, RENDER_STREAM, EVENTS])
consumers = st.builds(
    consumer,
    names,
    streams,
    durable=st.booleans(),
    idle=st.none() | st.floats(0.1, 1000),
    created=st.sampled_from([T0, T0 + timedelta(seconds=1)]),
    push=st.booleans(),
)


@given(st.lists(consumers, max_size=8), st.sets(st.sampled_from(["east", "west", "x"])))
def test_the_sweep_deletes_only_lasting_strangers_seen_twice(
    seen: list[ConsumerSeen], clusters: set[str]
) -> None:
    first = sweep_verdict(seen, clusters)
    second = sweep_verdict(seen, clusters, first.suspects)
    kept = kept_durables(clusters)
    assert first.delete == []
    for c in second.delete:  # never the control plane's, never one that lapses on its own
        assert (c.stream, c.name) not in kept or c.push
        assert c.durable or c.inactive_threshold is None or c.inactive_threshold > 300
    strangers = [c for c in seen if lasting(c) and ((c.stream, c.name) not in kept or c.push)]
    assert second.delete == strangers


class FakeAdmin:
    """A server's consumers in memory; `fail` makes the next sweep's listing fail."""

    def __init__(self, consumers: list[ConsumerSeen], clusters: set[str]) -> None:
        self.present, self.clusters, self.fail = list(consumers), clusters, False

    async def consumers(self) -> list[ConsumerSeen]:
        if self.fail:
            self.fail = False
            raise TimeoutError("no answer")
        return list(self.present)

    async def reporting_clusters(self) -> set[str]:
        return set(self.clusters) | {"not a cluster id"}

    async def delete(self, consumer: ConsumerSeen) -> bool:
        if consumer not in self.present:
            return False
        self.present.remove(consumer)
        return True


async def test_the_sweep_deletes_counts_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    admin = FakeAdmin([HUBS, EAST, ORDERED, ROGUE], {"east"})
    janitor = ConsumerJanitor(admin)
    assert await janitor.sweep() == []
    with caplog.at_level(logging.WARNING, logger="wingsmith.services.hub.janitor"):
        assert await janitor.sweep() == [ROGUE]
    assert admin.present == [HUBS, EAST, ORDERED]
    assert janitor.removed == 1 and janitor.sweeps == 2
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "'own-durable'" in message and EVENTS in message and "wingsmith.evt.>" in message
    assert await janitor.sweep() == [] and janitor.suspects == frozenset()


async def test_the_sweep_goes_on_after_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    admin = FakeAdmin([ROGUE], set())
    admin.fail = True
    janitor = ConsumerJanitor(admin, every=0.01)
    async with janitor.running() as task:
        async with asyncio.timeout(10):
            while janitor.removed == 0:
                await asyncio.sleep(0.01)
        assert not task.done()
    assert admin.present == []
    assert "consumer sweep failed: TimeoutError: no answer" in caplog.text


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 5.0), ("0", 0.0), ("0.5", 0.5), ("60", 60.0)]
)
def test_the_sweep_interval_setting(value: str | None, seconds: float) -> None:
    env = {} if value is None else {"WINGSMITH_CONSUMER_SWEEP": value}
    assert Settings.from_env(env).consumer_sweep == seconds


@pytest.mark.parametrize("value", ["0.01", "-1", "soon", "7200"])
def test_a_bad_sweep_interval_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match="WINGSMITH_CONSUMER_SWEEP"):
        Settings.from_env({"WINGSMITH_CONSUMER_SWEEP": value})
