"""`wingsmith events`, `dead-letters`, `watch`, `view`, `audit` and `replay`: what happened.

They read the event and view streams over NATS; `view --as-of` and `replay` also read the event
store itself, with the hub's settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from wingsmith.adapters import nats_bus
from wingsmith.adapters.checkpoints import CheckpointStore
from wingsmith.adapters.dead_letters import Component
from wingsmith.adapters.store import StoreThread, store_env
from wingsmith.domain import names, subjects
from wingsmith.domain.workload import Workload
from wingsmith.projections.audit import NAME_KIND, Entry, Timeline, incarnation_of, incarnations
from wingsmith.projections.fleet import PROJECTIONS
from wingsmith.services.cli.follow import Resume, after, following
from wingsmith.services.cli.terminal import Progress
from wingsmith.services.config import Settings, connect
from wingsmith.services.hub.projector import as_of, compare, rebuild


def events(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--aggregate", default="*", help="e.g. deployment")
    parser.add_argument("--id", default="*", help="aggregate id, e.g. llama--east")
    parser.add_argument("--type", default="*", help="event type, e.g. DeploymentScaled")
    parser.add_argument("--since", type=int, default=1, metavar="SEQ", help="stream sequence")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    parser.add_argument("--json", action="store_true", help="one JSON event per line")
    parser.set_defaults(run=_events)


async def _events(args: argparse.Namespace) -> int:
    parts = (args.aggregate, args.id, args.type)
    subject = ".".join([names.EVENTS, *(p if p == "*" else subjects.token(p) for p in parts)])
    stream = _followed(names.EVENTS_STREAM, subject, args.follow, args.since)
    with contextlib.suppress(asyncio.CancelledError):
        async with contextlib.aclosing(stream):
            async for message in stream:
                print(_event_line(message, as_json=args.json), flush=True)
    return 0


def _followed(
    stream: str, subject: str, follow: bool, start: nats_bus.Start, resume: Resume = after
) -> AsyncGenerator[nats_bus.StreamMessage, None]:
    """The stream's messages on `subject` from `start`; to follow, across hub restarts."""

    def read(
        nc: nats_bus.Connection, start: nats_bus.Start
    ) -> AsyncGenerator[nats_bus.StreamMessage, None]:
        return nats_bus.read_stream(nc, stream, subject, follow=follow, start=start)

    return following(Settings.from_env(), read, start, resume)


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


def dead_letters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--component", default="*", choices=[*Component, "*"], help="default: all")
    parser.add_argument(
        "--since", type=_start, default=1, metavar="WHEN", help="a stream sequence, time or age"
    )
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new ones")
    parser.add_argument("--json", action="store_true", help="one JSON record per line")
    parser.set_defaults(run=_dead_letters)


async def _dead_letters(args: argparse.Namespace) -> int:
    subject = names.dead_subject(args.component)
    stream = _followed(names.DEAD_STREAM, subject, args.follow, args.since)
    with contextlib.suppress(asyncio.CancelledError):
        async with contextlib.aclosing(stream):
            async for m in stream:
                if args.json:
                    print(m.data.decode(), flush=True)
                    continue
                r = orjson.loads(m.data)
                at, component, what = r["at"][:19], r["component"], r["subject"]
                print(f"{m.seq:>6} {at} {component:<9} {what!r}: {r['reason']}", flush=True)
    return 0


AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _time(text: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or an age such as 15m, 2h or 1d."""
    text = text.strip()
    if text[:-1].isdigit() and text[-1:] in AGES:
        return datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * AGES[text[-1]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time nor an age such as 15m, 2h or 1d"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _start(text: str) -> nats_bus.Start:
    if text in ("now", "last"):
        return "new" if text == "now" else "last"
    return int(text) if text.isdigit() else _time(text)


def watch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("projection", choices=[kind.name for kind in PROJECTIONS])
    parser.add_argument("--key", default=">", help="a view key, e.g. east.H100 (wildcards: * >)")
    parser.add_argument(
        "--since",
        type=_start,
        default="last",
        metavar="WHEN",
        help="now | a stream sequence | a time (2026-11-29T14:02:00Z) | an age (15m, 2h, 1d); "
        "default: the current views, then changes",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=_watch)


async def _watch(args: argparse.Namespace) -> int:
    stream_name, prefix = nats_bus.view_stream(args.projection)
    subject, prefix = f"{prefix}.{subjects.filter_tokens(args.key)}", f"{prefix}."
    # on another server the current views are shown again, then the changes after them
    stream = _followed(stream_name, subject, True, args.since, resume=lambda _: "last")
    with contextlib.suppress(asyncio.CancelledError):
        async with contextlib.aclosing(stream):
            async for m in stream:
                key, position = (
                    subjects.key_value(m.subject.removeprefix(prefix)),
                    int(m.headers[nats_bus.POSITION_HEADER]),
                )
                view = None if m.headers.get(nats_bus.DELETED_HEADER) else orjson.loads(m.data)
                if args.json:
                    line = orjson.dumps(
                        {
                            "seq": m.seq,
                            "time": m.time.isoformat(),
                            "key": key,
                            "position": position,
                            "view": view,
                        }
                    ).decode()
                else:
                    shown = "(removed)" if view is None else orjson.dumps(view).decode()
                    line = f"{m.seq:>6} {m.time:%Y-%m-%d %H:%M:%S} {key} @{position} {shown}"
                print(line, flush=True)
    return 0


def view(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("projection", choices=[kind.name for kind in PROJECTIONS])
    parser.add_argument("--key", help="one view key, e.g. east.H100")
    parser.add_argument(
        "--as-of", type=_time, metavar="TIME", help="e.g. 2026-11-29T14:02:00Z, or an age: 2h"
    )
    parser.add_argument("--json", action="store_true", help="the views as one JSON object")
    parser.set_defaults(run=_view)


async def _view(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.as_of is None:
        nc = await connect(settings, "wingsmith-cli")
        try:
            live = await nats_bus.latest_views(nc, args.projection)
        finally:
            await nc.close()
        views = {key: orjson.loads(v) for key, (_, v) in sorted(live.items()) if v is not None}
    else:
        kind = next(k for k in PROJECTIONS if k.name == args.projection)
        async with _store(settings) as (store, checkpoints):
            read = store.store.read
            [projection] = await store.run(as_of, read, checkpoints, args.as_of, [kind])
        views = dict(sorted(projection.views.items()))
    if args.key is not None:
        if args.key not in views:
            when = f" as of {args.as_of.isoformat()}" if args.as_of else ""
            print(f"wingsmith: no {args.projection} view {args.key!r}{when}", file=sys.stderr)
            return 1
        views = {args.key: views[args.key]}
    if args.json:
        print(orjson.dumps(views, option=orjson.OPT_INDENT_2).decode())
    else:
        for key, view in views.items():
            print(f"{key}  {orjson.dumps(view).decode()}")
    return 0


@contextlib.asynccontextmanager
async def _store(settings: Settings) -> AsyncIterator[tuple[StoreThread, CheckpointStore]]:
    """The event store and its checkpoints, read directly (the same settings as the hub)."""
    env = store_env(settings.store_url, settings.data_dir)
    store = await StoreThread.open(env)
    try:
        checkpoints = await store.run(CheckpointStore, env)
        try:
            yield store, checkpoints
        finally:
            await store.run(checkpoints.close)
    finally:
        await store.close()


def audit(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "ref",
        nargs="?",
        help="aggregate:id, e.g. deployment:llama--east; workload:<name> shows every "
        "incarnation of the name",
    )
    target.add_argument("--correlation", metavar="ID", help="every event of this correlation id")
    parser.add_argument(
        "--since", type=_time, metavar="TIME", help="with --correlation: search from this time"
    )
    parser.add_argument("--json", action="store_true", help="one JSON entry per line")
    parser.set_defaults(run=_audit)


async def _audit(args: argparse.Namespace) -> int:
    numbered: dict[str, int] = {}
    nc = await connect(Settings.from_env(), "wingsmith-cli")
    try:
        if args.ref is not None:
            kind, key = _reference(args.ref)
            if kind == Workload.kind:
                found, numbered = await _workload_history(nc, key)
            else:
                found = await _read(nc, _events_of(kind, key))
        else:
            found = await _read(nc, names.every(names.EVENTS), args.since or 1, args.correlation)
    finally:
        await nc.close()
    timeline = Timeline()
    for envelope in found:
        timeline.apply(envelope)
    if not timeline.entries:
        print(f"wingsmith: no events for {args.ref or args.correlation!r}", file=sys.stderr)
        return 1
    for entry in timeline.entries:
        n = incarnation_of(entry, numbered)
        if args.json:
            shown = entry.as_dict() | ({} if n is None else {"incarnation": n})
            print(orjson.dumps(shown).decode())
        else:
            print(_audit_line(entry, n))
    return 0


def _reference(ref: str) -> tuple[str, str]:
    """`kind:id` (or `kind/id`) as its kind and id."""
    kind, _, key = ref.replace("/", ":", 1).partition(":")
    if not (kind.isascii() and kind.replace("_", "").isalpha()) or not key:
        raise ValueError(f"{ref!r} is not an aggregate reference like deployment:llama--east")
    return kind, key


def _events_of(kind: str, key: str) -> str:
    return f"{names.EVENTS}.{kind}.{subjects.token(key)}.*"


async def _workload_history(nc: Any, name: str) -> tuple[list[Any], dict[str, int]]:
    """Every incarnation's history of the workload called `name` and its name's record, in
    store order, with each incarnation's number by its id (none for a name never recorded)."""
    record = await _read(nc, _events_of(NAME_KIND, name))
    numbered = incarnations(record)
    found = list(record)
    for workload_id in numbered or [name]:
        found += await _read(nc, _events_of(Workload.kind, workload_id))
    return sorted(found, key=lambda e: e["position"]), numbered


async def _read(nc: Any, subject: str, start: int = 1, correlation: str | None = None) -> list[Any]:
    """The events on `subject` from `start` (of one causal chain, when `correlation` is given)."""
    needle = orjson.dumps(correlation)
    found = []
    stream = nats_bus.read_stream(nc, names.EVENTS_STREAM, subject, follow=False, start=start)
    async for m in stream:
        if correlation is None or needle in m.data:  # cheap test before decoding
            e = orjson.loads(m.data)
            if correlation is None or e["event"]["correlation_id"] == correlation:
                found.append(e)
    return found


def _audit_line(entry: Entry, incarnation: int | None = None) -> str:
    changes = ", ".join(
        f"{name}={_short(c.after)}"
        if c.before is None
        else f"{name}: {_short(c.before)} → {_short(c.after)}"
        for name, c in entry.changes.items()
    )
    label = "" if incarnation is None else f" #{incarnation}"
    return (
        f"{entry.timestamp[:23]:23} {entry.aggregate}:{entry.aggregate_id}{label} "
        f"v{entry.version} {entry.type}  {changes or '-'}  cmd={entry.command_id} "
        f"corr={entry.correlation_id}"
    )


def _short(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def replay(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=60.0, help="wait for the projector")
    parser.set_defaults(run=_replay)


async def _replay(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    async with _store(settings) as (store, _):
        last = await store.run(store.store.last_position)
        bar = Progress("rebuilding", last)

        def read(after: int, limit: int) -> list[Any]:
            return store.store.read(after, limit, last)

        rebuilt = await store.run(rebuild, read, progress=bar.update)
        bar.close()
    upto = rebuilt.last_applied
    nc = await connect(settings, "wingsmith-cli")
    try:
        await _projector_reached(nc, upto, args.timeout)
        verdicts = [
            compare(p, upto, await nats_bus.latest_views(nc, p.name)) for p in rebuilt.projections
        ]
    finally:
        await nc.close()
    print(f"rebuilt from the store up to position {last:,} (last event at {upto:,})")
    print(f"{'PROJECTION':20} {'VIEWS':>8} {'EQUAL':>8} {'CHANGED SINCE':>14} {'MISMATCHED':>11}")
    for v in verdicts:
        views = v.equal + len(v.mismatched)
        print(
            f"{v.projection:20} {views:>8,} {v.equal:>8,} {v.newer:>14,} {len(v.mismatched):>11,}"
        )
        for problem in v.mismatched[:20]:
            print(f"  {problem}")
    mismatched = sum(len(v.mismatched) for v in verdicts)
    print("the live views equal the rebuild" if not mismatched else f"{mismatched} views differ")
    return 0 if not mismatched else 1


async def _projector_reached(nc: nats_bus.Connection, position: int, timeout: float) -> None:
    """Wait until the live projector has applied every event up to `position`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        progress = await nats_bus.projector_progress(nc)
        reached = progress["position"] if progress else 0
        if reached >= position:
            return
        if loop.time() > deadline:
            raise RuntimeError(
                f"the projector has applied events up to position {reached:,}, not yet "
                f"{position:,}; is it running? (waited {timeout:.0f}s)"
            )
        await asyncio.sleep(0.2)
