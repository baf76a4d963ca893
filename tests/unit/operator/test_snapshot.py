"""A Kubernetes cluster's sync is taken only from a complete view of its pods."""

from wingsmith.adapters.kube import Change
from wingsmith.services.operator.backends.kube import COMPONENT_TYPE_LABEL, KubeBackend
from wingsmith.services.operator.dgd import LABEL_DEPLOYMENT, deployment_label


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


async def test_a_sync_is_as_of_the_list_even_when_a_deletion_is_its_newest_change() -> None:
    """A pod deleted while nobody watched leaves only its revision behind, in the list's own
    resourceVersion: a sync as of the pods listed would be older than the deleted pod's last
    report, and the plane would keep its replica for ever on a quiet cluster."""
    backend = KubeBackend(None, "east", "dynamo", read_only=True)  # type: ignore[arg-type]
    desired = {"deployment_id": "chat--east", "replicas": 1}
    backend._index("chat--east", desired)
    backend.applied["chat--east"] = desired
    labels = {LABEL_DEPLOYMENT: deployment_label("chat--east"), COMPONENT_TYPE_LABEL: "worker"}
    meta = {"name": "chat-0", "namespace": "dynamo", "labels": labels, "resourceVersion": "5"}
    pod = {"metadata": meta, "spec": {"nodeName": "n1"}}
    await backend._on_change("pod", Change("RELISTING", {}))
    await backend._on_change("pod", Change("ADDED", pod))
    await backend._on_change("pod", Change("SYNCED", {"metadata": {"resourceVersion": "9"}}))
    [sync] = backend.snapshot() or []
    assert (sync.version, [r.pod for r in sync.replicas]) == (9, ["chat-0"])
