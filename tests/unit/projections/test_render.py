"""Render commands as given / when / then, over events made by the real Deployment aggregate."""

from __future__ import annotations

from typing import Any

import orjson

from wingsmith.domain.base import Aggregate
from wingsmith.domain.cluster import Cluster, Node
from wingsmith.domain.contracts.render import RenderDocument, RenderObject
from wingsmith.domain.deployment import AdmissionReason, Authority, Deployment
from wingsmith.domain.values import ServingMode
from wingsmith.projections.base import Fold
from wingsmith.projections.render import Render

from .history import CLUSTER, PLANE, envelope, serving

KEY = "east.w--east"


class Given:
    def __init__(self, authority: Authority = Authority.MANAGED, devices: int = 2) -> None:
        self.render = Render()
        self.fold = Fold([self.render])
        self.position = 0
        self.d = Deployment.create(
            PLANE,
            workload_id="w",
            cluster_id="east",
            project="p",
            device_class="H100",
            serving=serving(devices),
            desired_replicas=3,
            authority=authority,
            imported_args=None if authority is Authority.MANAGED else ("--x",),
        )
        self.published: list[dict[str, Any] | None] = []
        self.flush()

    def flush(self, *aggregates: Aggregate) -> None:
        for event in [e for a in (self.d, *aggregates) for e in a.collect_events()]:
            self.position += 1
            for projection, key in self.fold.apply_envelope(envelope(event, self.position)):
                self.published.append(projection.view(key))

    def admit(self, devices: int) -> None:
        self.d.decide_admission(PLANE, admitted=True, reason=None, evidence={}, devices=devices)
        self.flush()


def test_nothing_is_rendered_before_admission() -> None:
    given = Given()
    given.d.decide_admission(
        PLANE, admitted=False, reason=AdmissionReason.INSUFFICIENT_QUOTA, evidence={}
    )
    given.flush()
    assert given.published == [] and given.render.views == {}


def test_admission_renders_as_many_replicas_as_the_grant_covers() -> None:
    given = Given()
    given.admit(4)  # 3 wanted, 2 devices each: the grant covers 2
    assert given.published[-1] is not None
    assert given.published[-1]["replicas"] == 2
    given.admit(6)
    assert given.render.views[KEY]["replicas"] == 3
    assert given.render.views[KEY]["serving_digest"] == given.d.serving_digest


def test_every_change_to_what_should_run_publishes_the_whole_object() -> None:
    given = Given()
    given.admit(6)
    given.d.change_serving_config(PLANE, serving(2).model_copy(update={"engine_version": "2.0"}))
    given.d.set_engine_args(PLANE, ("--enforce-eager",))
    given.d.disable(PLANE)  # scale to zero, the object stays
    given.flush()
    generations = [(v or {}).get("generation") for v in given.published]
    assert generations == [1, 2, 2, 2]
    last = given.published[-1]
    assert last is not None
    assert (last["replicas"], last["enabled"], last["engine_args"]) == (
        0,
        False,
        ["--enforce-eager"],
    )


def test_an_observed_deployment_is_rendered_as_observed_and_managed_only_once_admitted() -> None:
    given = Given(Authority.OBSERVED)
    assert [(v or {}).get("authority") for v in given.published] == ["observed"]
    assert given.published[0] is not None and given.published[0]["replicas"] == 3
    given.d.observe_imported_args(CLUSTER, ())  # engine_args () now equal the imported ones
    given.d.promote_authority(PLANE)
    given.flush()
    assert len(given.published) == 1  # promoted, not admitted: the operator keeps off it
    given.admit(4)  # the grant covers 2 of its 3 replicas
    assert given.published[-1] is not None
    assert (given.published[-1]["authority"], given.published[-1]["replicas"]) == ("managed", 2)


def test_a_rollout_waiting_for_its_previous_generation_renders_the_new_one_inside_the_grant() -> (
    None
):
    given = Given()
    given.admit(6)
    bigger = serving(3)  # 3 devices a replica now: the old grant of 6 holds 2 of them
    given.d.change_serving_config(PLANE, bigger)
    given.d.decide_admission(
        PLANE,
        admitted=False,
        reason=AdmissionReason.WAITING_FOR_PREVIOUS_GENERATION,
        evidence={},
        devices=6,
    )
    given.flush()
    rendered = [(v or {}).get("replicas") for v in given.published]
    assert rendered == [3, 2]  # never zero: the generation that serves is not taken down
    assert given.render.views[KEY]["serving_digest"] == bigger.digest()
    given.admit(9)  # the old replicas are gone: the new generation in full
    assert given.render.views[KEY]["replicas"] == 3


def test_a_failure_the_cluster_reports_renders_zero_replicas_until_admitted_again() -> None:
    given = Given()
    given.admit(6)
    given.d.mark_failed(CLUSTER, "ImagePullBackOff", "no such image")
    given.flush()
    assert given.render.views[KEY]["replicas"] == 0  # its grant is gone: nothing may run
    given.d.decide_admission(
        PLANE, admitted=False, reason=AdmissionReason.AWAITING_ADMISSION, evidence={}
    )
    given.admit(6)
    assert given.render.views[KEY]["replicas"] == 3


def test_deleting_publishes_a_removal() -> None:
    given = Given()
    given.admit(6)
    given.d.delete(PLANE)
    given.flush()
    assert given.published == [given.published[0], None]  # the operator deletes its object
    assert given.render.views == {} and given.render.desired == {}


def test_deleting_what_was_never_rendered_publishes_nothing() -> None:
    given = Given()
    given.d.delete(PLANE)
    given.flush()
    assert given.published == [] and given.render.views == {}


def test_what_is_rendered_is_the_render_contract_and_the_operator_reads_it() -> None:
    given = Given()
    given.admit(4)
    view = given.published[-1]
    assert view is not None
    assert list(view) == list(RenderDocument.__annotations__)  # every key, in the wire's order
    assert list(view) == list(RenderObject.model_fields)
    obj = RenderObject.model_validate_json(orjson.dumps(view))
    assert obj.replicas == 2 and obj.authority is Authority.MANAGED


def test_a_worker_wider_than_the_largest_node_is_rendered_over_several() -> None:
    """12 devices a replica on nodes of 8: two nodes of 6 each. The span follows the largest
    node of the class: a node coming or going publishes nothing unless that size changes."""
    given = Given(devices=12)
    east = Cluster.register(PLANE, "east", None, {})

    def nodes(*sizes: int) -> None:
        reported = [
            Node(node_id=f"n{i}", device_class="H100", devices=d) for i, d in enumerate(sizes)
        ]
        east.report_inventory(CLUSTER, tuple(reported))
        given.flush(east)

    nodes(8, 8)
    given.admit(36)
    assert given.render.views[KEY]["nodes_per_worker"] == 2
    published = len(given.published)
    nodes(8, 8, 8, 4)
    assert len(given.published) == published  # the largest node is still 8: nothing changes
    nodes(16, 8)
    assert given.render.views[KEY]["nodes_per_worker"] == 1
    assert RenderObject.model_validate_json(orjson.dumps(given.published[-1])).nodes_per_worker == 1
    nodes()  # no node of the class: admission grants nothing more; the span stays
    assert len(given.published) == published + 1


def test_a_disaggregated_replica_spans_nodes_per_worker() -> None:
    """16 devices a replica, disaggregated: prefill and decode of 8 each, on nodes of 4."""
    given = Given(devices=16)
    given.d.change_serving_config(
        PLANE, serving(16).model_copy(update={"mode": ServingMode.DISAGGREGATED})
    )
    east = Cluster.register(PLANE, "east", None, {})
    east.report_inventory(CLUSTER, (Node(node_id="n1", device_class="H100", devices=4),))
    given.flush(east)
    given.admit(48)
    assert given.render.views[KEY]["nodes_per_worker"] == 2
