"""Logs and traces, for real: one trace follows a command from the client that sends it over
NATS, through the hub's command span, group commit, relay batch and scheduler decisions, to the
cluster's operator and back with its report (a real hub, projector and simulated operator over a
real nats-server, spans kept by OpenTelemetry's in-memory exporter); and `wingsmith` writes
every log line as a JSON object when told to."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from nats.aio.client import Client
from nats.errors import Error as NatsError
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wingsmith.adapters import nats_bus, tracing
from wingsmith.adapters.nats_server import EmbeddedNatsServer
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub, running_projector
from wingsmith.services.operator.backends.simulated import SimNode, simulated_operators

from .conftest import LLAMA, send_until_answered, wait_for


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    try:
        yield exporter
    finally:
        tracing.configure(None)
        provider.shutdown()


def in_trace(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    finished = exporter.get_finished_spans()
    return [s for s in finished if s.context and s.context.trace_id == trace_id]


async def test_one_trace_follows_a_command_to_the_cluster_and_back(
    nats_server: EmbeddedNatsServer,
    client: Client,
    tmp_path: Path,
    spans: InMemorySpanExporter,
) -> None:
    settings = Settings(
        nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub", projector=False
    )
    east = {"east": [SimNode("east-n1", "H100", 8)]}
    async with (
        running_hub(settings),
        running_projector(settings),
        simulated_operators(client, east, ready_after=0.1),
    ):
        first: list[tuple[str, dict[str, Any]]] = [
            ("project.set_quota", {"project": "p", "device_class": "H100", "devices": 8}),
            ("cluster.register", {"cluster_id": "east"}),
        ]
        for verb, body in first:
            reply = await send_until_answered(client, verb, {"command_id": verb} | body)
            assert reply["ok"], reply
        workload = {
            "command_id": "traced-create",
            "workload_id": "chat",
            "project": "p",
            "device_class": "H100",
            "serving": LLAMA,
            "replicas": 1,
            "cluster": "east",
        }
        # sent the way the CLI and the API send commands
        raw = await nats_bus.request(
            client, "wingsmith.cmd.workload.create", orjson.dumps(workload), 30
        )
        assert orjson.loads(raw)["ok"], raw
        [sent] = [s for s in spans.get_finished_spans() if s.name.startswith("send ")]
        assert sent.context is not None and sent.parent is None  # the trace starts here
        trace_id = sent.context.trace_id

        def names() -> set[str]:
            return {s.name for s in in_trace(spans, trace_id)}

        wanted = {
            "send wingsmith.cmd.workload.create",  # the client's publish
            "command workload.create",  # the hub's handling of it
            "group commit",
            "relay batch",
            "scheduler deployment.decide_admission",  # the decision it led to
            "command deployment.decide_admission",
            "operator apply",  # the operator acting on the render object
            "command deployment.sync",  # its report, handled by the hub
        }

        async def complete() -> bool:
            return wanted <= names()

        await wait_for(complete, 60, "the trace to reach the cluster and come back")

    traced = {s.context.span_id: s for s in in_trace(spans, trace_id) if s.context}

    def ancestors(span: ReadableSpan) -> list[str]:
        chain = []
        while span.parent is not None and span.parent.span_id in traced:
            span = traced[span.parent.span_id]
            chain.append(span.name)
        return chain

    # the report is a descendant of the operator's action, which descends from the admission
    # decision, which descends from the client's command
    [report] = [s for s in traced.values() if s.name == "command deployment.sync"]
    path = ancestors(report)
    assert path[0] == "operator apply", path
    assert "command deployment.decide_admission" in path, path
    assert "scheduler deployment.decide_admission" in path, path
    assert path[-2:] == ["command workload.create", "send wingsmith.cmd.workload.create"], path
    [command] = [s for s in traced.values() if s.name == "command workload.create"]
    attributes: dict[str, Any] = dict(command.attributes or {})
    assert attributes["wingsmith.command_id"] == "traced-create"
    assert attributes["wingsmith.ok"] is True


async def test_nothing_is_traced_when_tracing_is_off(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    assert not tracing.enabled()
    settings = Settings(nats_url=nats_server.url, store_url=None, data_dir=tmp_path / "hub")
    async with running_hub(settings):
        body = {"command_id": "untraced", "project": "p", "device_class": "H100", "devices": 1}
        raw = await nats_bus.request(
            client, "wingsmith.cmd.project.set_quota", orjson.dumps(body), 30
        )
        assert orjson.loads(raw)["ok"], raw
        events = nats_bus.read_stream(
            client, "WINGSMITH_EVENTS", "wingsmith.evt.project.>", follow=False
        )
        headers = [m.headers async for m in events]
    assert headers and not any("traceparent" in h for h in headers)


async def test_json_logs_carry_the_context_of_what_they_are_about(
    nats_server: EmbeddedNatsServer, client: Client, tmp_path: Path
) -> None:
    """`wingsmith up` with WINGSMITH_LOG_FORMAT=json writes every line on stderr as a JSON
    object: the time, level, logger and message, and what the line is about (here, the cluster
    whose operator refused a render object, and the deployment it named)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WINGSMITH_", "OTEL_"))}
    env |= {
        "WINGSMITH_DATA_DIR": str(tmp_path / "hub"),
        "WINGSMITH_NATS_URL": nats_server.url,
        "WINGSMITH_API_LISTEN": "127.0.0.1:0",
        "WINGSMITH_LOG_FORMAT": "json",
    }
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "wingsmith", "-v", "up", "--simulated", "east=1x8:H100"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
    try:

        async def refused() -> bool:
            # a render object naming another cluster, on east's subject (until east listens)
            foreign = {"cluster_id": "west", "deployment_id": "chat--west"}
            with contextlib.suppress(NatsError):
                await client.jetstream().publish(
                    "wingsmith.render.east.chat--west", orjson.dumps(foreign), timeout=1
                )
            return b"not for cluster east" in log.read_bytes()

        await wait_for(refused, 60, "the operator to refuse a foreign render object")
    finally:
        up.terminate()
        up.wait(30)
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines()]  # every one JSON
    for line in lines:
        assert {"time", "level", "logger", "message"} <= line.keys(), line
    [said] = [line for line in lines if "not for cluster east" in line["message"]][:1]
    assert said["level"] == "ERROR"
    assert said["cluster_id"] == "east"
    assert said["aggregate"] == "deployment" and said["aggregate_id"] == "chat--west"
