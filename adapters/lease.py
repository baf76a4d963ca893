"""The hubs' lease in a NATS key-value bucket: one key, written only by compare-and-set.

The bucket keeps one value, `hub`, naming the hub that holds the roles only one hub may run
(services/hub/lease.py says how it is used). Every write names the revision it replaces, so of
two hubs writing at once only one succeeds, and the revision a hub's taking of the lease got is
its fencing token: the bucket's revisions only grow, so a later holder's token is larger.
"""

from __future__ import annotations

from dataclasses import dataclass

import nats.errors
import orjson
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from wingsmith.domain.names import LEASE_BUCKET

__all__ = ["LEASE_BUCKET", "LeaseEntry", "LeaseUnreachable", "NatsLease"]

KEY = "hub"
REQUEST_TIMEOUT = 2.0  # seconds one read or write of the lease may take


class LeaseUnreachable(Exception):
    """The bucket could not be read or written (no connection, no JetStream leader)."""


@dataclass(frozen=True, slots=True)
class LeaseEntry:
    revision: int
    holder: str  # "" once released
    token: int  # the revision its holder took it at (0 once released)

    @property
    def released(self) -> bool:
        return not self.holder


class NatsLease:
    """Reads and writes the lease; every write is a compare-and-set."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, nc: Client, replicas: int = 1) -> NatsLease:
        js = nc.jetstream(timeout=REQUEST_TIMEOUT)
        kv = await js.create_key_value(
            KeyValueConfig(bucket=LEASE_BUCKET, history=1, replicas=replicas)
        )
        return cls(kv)

    async def read(self) -> LeaseEntry | None:
        """The lease as it stands (None: never taken, or deleted)."""
        try:
            entry = await self._kv.get(KEY)
        except KeyNotFoundError:  # KeyDeletedError is one too
            return None
        except (nats.errors.Error, TimeoutError) as e:
            raise LeaseUnreachable(str(e) or type(e).__name__) from e
        value = orjson.loads(entry.value or b"{}")
        return LeaseEntry(entry.revision or 0, value.get("holder", ""), value.get("token", 0))

    async def take(self, holder: str, replacing: LeaseEntry | None) -> int | None:
        """Take the lease from `replacing` (None: from nobody); the new revision, which is the
        fencing token, or None when another write came first."""
        try:
            if replacing is None:
                revision = await self._kv.create(KEY, _value(holder, 0))
            else:
                revision = await self._kv.update(KEY, _value(holder, 0), last=replacing.revision)
        except KeyWrongLastSequenceError:
            return None
        except (nats.errors.Error, TimeoutError) as e:
            raise LeaseUnreachable(str(e) or type(e).__name__) from e
        return revision

    async def renew(self, holder: str, token: int, revision: int) -> int | None:
        """Write the lease again over `revision`; the new revision, or None if it is no longer
        at `revision` (taken, or renewed by a write whose answer was lost)."""
        try:
            return await self._kv.update(KEY, _value(holder, token), last=revision)
        except KeyWrongLastSequenceError:
            return None
        except (nats.errors.Error, TimeoutError) as e:
            raise LeaseUnreachable(str(e) or type(e).__name__) from e

    async def release(self, revision: int) -> None:
        """Give the lease up, so another hub may take it at once (if it is still at
        `revision`; otherwise it was not ours any more)."""
        try:
            await self._kv.update(KEY, _value("", 0), last=revision)
        except KeyWrongLastSequenceError:
            pass
        except (nats.errors.Error, TimeoutError) as e:
            raise LeaseUnreachable(str(e) or type(e).__name__) from e


def _value(holder: str, token: int) -> bytes:
    return orjson.dumps({"holder": holder, "token": token})
