"""Every view a projection publishes is the document its contract (domain/contracts/views.py)
describes: no key missing, none unknown, every value of its type."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given

from wingsmith.domain.base import Cause, Writer
from wingsmith.domain.contracts import views as v
from wingsmith.domain.discovery import DiscoveredComponent, Discovery, Sighting
from wingsmith.domain.values import Backend
from wingsmith.projections.base import Projection
from wingsmith.projections.fleet import PROJECTIONS, Discovered
from wingsmith.projections.render import Render

from ...schemas import check
from .history import PLANE, Fleet, envelope, histories
from .test_properties import fold

DOCUMENTS: dict[str, Any] = {
    v.WORKLOAD_PHASE.name: v.WorkloadPhaseView,
    v.CAPACITY.name: v.CapacityRow,
    v.CAPACITY_NODES.name: v.NodeCapacityView,
    v.QUOTA_USE.name: v.QuotaUseRow,
    v.DEPLOYMENT_HEALTH.name: v.DeploymentHealthView,
    v.DISCOVERED.name: v.DiscoveredView,
    v.ALLOCATIONS.name: v.AllocationView,
    v.WORKLOADS.name: v.WorkloadView,
    v.CLUSTERS.name: v.ClusterView,
}
CLUSTER = Cause(
    command_id="c", correlation_id="c", at=datetime(2026, 12, 1, tzinfo=UTC), writer=Writer.CLUSTER
)


def test_each_fleet_projection_has_a_contract() -> None:
    assert {p.name for p in PROJECTIONS if p is not Render} == DOCUMENTS.keys()


def _check_views(projection: Projection) -> None:
    for key, view in projection.views.items():
        try:
            check(DOCUMENTS[projection.name], view)
        except Exception as e:
            raise AssertionError(f"{projection.name} {key}: {e}") from e


@given(histories())
def test_every_view_of_a_history_is_its_contracts_document(fleet: Fleet) -> None:
    for cls in PROJECTIONS:
        if cls is not Render:
            _check_views(fold(cls, fleet.envelopes))


def test_a_sighting_is_its_contracts_document_as_it_moves() -> None:
    worker = DiscoveredComponent(name="w", role="worker", replicas=1, gpus_per_replica=2)
    sighting = Sighting(
        namespace="ns",
        name="qwen",
        api_version="nvidia.com/v1alpha1",
        backend=Backend.VLLM,
        components=(worker,),
        model="qwen",
    )
    discovery = Discovery.sight(CLUSTER, "east", sighting)
    discovery.resight(CLUSTER, sighting.model_copy(update={"image": "img"}))
    discovery.promote(PLANE, "qwen")
    discovery.vanish(CLUSTER)
    events = [envelope(e, i) for i, e in enumerate(discovery.collect_events(), 1)]
    for upto in range(1, len(events) + 1):
        _check_views(fold(Discovered, events[:upto]))
    assert fold(Discovered, events).views  # something was checked
