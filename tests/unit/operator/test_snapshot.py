"""A Kubernetes cluster's sync is taken only from a complete view of its pods."""

from wingsmith.adapters.kube import Change
from wingsmith.services.operator.backends.kube import KubeBackend


async def test_no_sync_while_a_relist_is_replayed() -> None:
    """A relist's changes come in key order, not resourceVersion order: until it is complete
    the cache mixes old pods with a version that is already new, so a sync would stamp stale
    pods as current."""
    backend = KubeBackend(None, "east", "dynamo", read_only=True)  # type: ignore[arg-type]
    assert backend.snapshot() is None  # not listed yet
    await backend._on_change("pod", Change("RELISTING", {}))
    await backend._on_change("pod", Change("SYNCED", {}))
    assert backend.snapshot() == []
    await backend._on_change("pod", Change("RELISTING", {}))  # a 410 Gone: listed again
    assert backend.snapshot() is None
    await backend._on_change("pod", Change("SYNCED", {}))
    assert backend.snapshot() == []
