"""The device classes the fleet reports, for the command handlers' check at the edge
(domain/device_classes.py).

Each cluster's latest inventory says which classes it has; the index folds the store's
`InventoryReported` events (whichever hub recorded them) and catches up only when asked, on
the store's thread, reading just those events past the position it reached.
"""

from __future__ import annotations

from wingsmith.adapters.store import EventStore, decode_event
from wingsmith.domain.base import split_id
from wingsmith.domain.cluster import InventoryReported

PAGE = 500


class ReportedClasses:
    def __init__(self) -> None:
        self.position = 0
        self.by_cluster: dict[str, frozenset[str]] = {}

    def read(self, store: EventStore) -> frozenset[str]:
        """Every class some cluster's latest inventory reports, as of the store now."""
        while batch := store.read(self.position, PAGE, types=(InventoryReported,)):
            for notification in batch:
                event = decode_event(notification)
                assert isinstance(event, InventoryReported)
                _, cluster = split_id(event.originator_id)
                self.by_cluster[cluster] = frozenset(n.device_class for n in event.nodes)
            self.position = batch[-1].id
        return frozenset().union(*self.by_cluster.values())
