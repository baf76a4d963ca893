"""One hub per data directory.

A hub keeps its embedded nats-server, its SQLite store, the files that tell clients where it
listens (`nats.url`, `api.url`) and the local API token in its data directory. A second hub on
the same directory would share the server's files and the store, and remove the first one's
URL files when it stopped. So a hub holds an exclusive lock on `hub.lock` there for as long as
it runs, and a second one is refused before it touches anything. The kernel drops the lock
when the process ends, however it ends (a hub killed with SIGKILL does not keep its directory),
and the file itself stays: removing it would let a third hub lock a new file while the second
still held the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "hub.lock"


class DataDirUnusable(RuntimeError):
    """Another hub runs on the data directory, or it cannot be written."""


@contextlib.contextmanager
def owning(data_dir: Path) -> Iterator[None]:
    """Hold the data directory for this hub while the block runs; DataDirUnusable if another
    process holds it (naming its pid) or it cannot be written."""
    path = data_dir / LOCK_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as e:
        raise DataDirUnusable(f"data directory {data_dir} cannot be written: {e}") from None
    with path.open("r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise DataDirUnusable(
                f"data directory {data_dir} is in use by another wingsmith hub (pid {holder}): "
                "stop that one first, or give this one its own WINGSMITH_DATA_DIR"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
