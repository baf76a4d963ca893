"""`wingsmith`: run the hub, send commands, read the event stream, print command schemas."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from adapters import nats_bus
from services.bootstrap import running_hub, running_projector
from services.commands import json_schemas
from services.config import Settings


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(asyncio.run(args.run(args)) or 0)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"wingsmith: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wingsmith", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the hub until SIGINT/SIGTERM")
    up.set_defaults(run=_up)

    projector = sub.add_parser("projector", help="run the projector (`up` starts one itself)")
    projector.set_defaults(run=_projector)

    cmd = sub.add_parser("cmd", help="send one command and print the reply")
    cmd.add_argument("subject", help="e.g. project.set_quota or wingsmith.cmd.project.set_quota")
    cmd.add_argument("payload", help="the command as JSON; command_id is added when missing")
    cmd.add_argument("--timeout", type=float, default=10.0)
    cmd.set_defaults(run=_cmd)

    schema = sub.add_parser("schema", help="print the JSON Schema of every command")
    schema.set_defaults(run=_schema)

    events = sub.add_parser("events", help="print events from the WINGSMITH_EVENTS stream")
    events.add_argument("--aggregate", default="*", help="e.g. deployment")
    events.add_argument("--id", default="*", help="aggregate id, e.g. llama--east")
    events.add_argument("--type", default="*", help="event type, e.g. DeploymentScaled")
    events.add_argument("--since", type=int, default=1, metavar="SEQ", help="stream sequence")
    events.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    events.add_argument("--json", action="store_true", help="one JSON event per line")
    events.set_defaults(run=_events)
    return parser


async def _up(args: argparse.Namespace) -> int:
    # The hub keeps many long-lived objects (aggregate cache, recent receipts); with CPython's
    # default thresholds full collections traverse them every few thousand commands, which
    # showed as 100-200 ms stalls at p99 in bench/ingest.py. Collect young objects less often.
    gc.set_threshold(50_000, 20, 20)
    settings = Settings.from_env()
    stop = _stop_on_signals()
    async with running_hub(settings) as hub:
        store = settings.store_url or settings.data_dir / "events.sqlite"
        print(f"wingsmith hub ready: nats {hub.nats_url}, store {store}", flush=True)
        stopping = asyncio.create_task(stop.wait(), name="wingsmith-signals")
        await asyncio.wait([stopping, *hub.tasks], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        failed = [t for t in hub.tasks if t.done()]
        for task in failed:
            error = task.exception() if not task.cancelled() else None
            logging.error("%s stopped unexpectedly: %r; shutting down", task.get_name(), error)
        print("wingsmith hub stopping", flush=True)
    return 1 if failed else 0


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: long-running commands shut down cleanly on either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _projector(args: argparse.Namespace) -> int:
    stop = _stop_on_signals()
    async with running_projector(Settings.from_env()):
        await stop.wait()
    return 0


async def _cmd(args: argparse.Namespace) -> int:
    try:
        body: Any = orjson.loads(args.payload)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"payload is not valid JSON: {e}") from None
    if isinstance(body, dict) and "command_id" not in body:
        body["command_id"] = f"cli-{uuid.uuid4().hex}"
    subject = (
        args.subject if args.subject.startswith("wingsmith.") else f"wingsmith.cmd.{args.subject}"
    )
    nc = await nats_bus.connect(Settings.from_env().resolved_nats_url(), "wingsmith-cli")
    try:
        reply = await nats_bus.request(nc, subject, orjson.dumps(body), args.timeout)
    finally:
        await nc.close()
    print(orjson.dumps(orjson.loads(reply), option=orjson.OPT_INDENT_2).decode())
    return 0 if orjson.loads(reply).get("ok") else 1


async def _schema(args: argparse.Namespace) -> int:
    print(orjson.dumps(json_schemas(), option=orjson.OPT_INDENT_2).decode())
    return 0


async def _events(args: argparse.Namespace) -> int:
    subject = f"wingsmith.evt.{args.aggregate}.{args.id}.{args.type}"
    nc = await nats_bus.connect(Settings.from_env().resolved_nats_url(), "wingsmith-cli")
    try:
        stream = nats_bus.read_stream(
            nc, nats_bus.EVENTS_STREAM, subject, follow=args.follow, start_seq=args.since
        )
        with contextlib.suppress(asyncio.CancelledError):
            async for message in stream:
                print(_event_line(message, as_json=args.json), flush=True)
    finally:
        await nc.close()
    return 0


def _event_line(message: nats_bus.StreamMessage, *, as_json: bool) -> str:
    if as_json:
        return message.data.decode()
    e = orjson.loads(message.data)
    inner = e["event"]
    data = {
        k: v for k, v in inner.items() if k not in {"timestamp", "command_id", "correlation_id"}
    }
    return (
        f"{message.seq:>6} {inner['timestamp'][:23]} {e['aggregate']}/{e['aggregate_id']} "
        f"v{e['version']} {e['type']} cmd={inner['command_id']} "
        f"{orjson.dumps(data).decode()}"
    )


if __name__ == "__main__":
    sys.exit(main())
