"""`wingsmith backup`: a copy of the event store to restore from, taken while the hub runs.

The store is the whole of Wingsmith's history; the NATS streams and views are built from it
again (docs/operations.md#backup-and-restore).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from wingsmith.adapters.store import backup_sqlite, store_env
from wingsmith.services.config import Settings

PG_DUMP = (
    "the event store is PostgreSQL (WINGSMITH_STORE): back it up with pg_dump "
    "(docs/operations.md#backup-and-restore)"
)


def backup(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dest", metavar="DEST", help="the file to write (it must not exist)")
    parser.set_defaults(run=_backup)


async def _backup(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    env = store_env(settings.store_url, settings.data_dir)
    if not env["PERSISTENCE_MODULE"].endswith("sqlite"):
        print(f"wingsmith: {PG_DUMP}", file=sys.stderr)
        return 2
    dest, last = await asyncio.to_thread(_copy, env, Path(args.dest))
    print(f"backed up {env['SQLITE_DBNAME']} to {dest}: events up to position {last:,}")
    return 0


def _copy(env: dict[str, str], dest: Path) -> tuple[Path, int]:
    dest = dest.resolve()
    if dest.exists():
        raise ValueError(f"DEST: {dest} exists already; name a new file")
    partial = dest.with_name(f"{dest.name}.partial")  # DEST appears only once it is whole
    try:
        last = backup_sqlite(env, partial)
        partial.rename(dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest, last
