"""A serving change the engine does not see (pod scheduling, the frontend) is published to the
operator in the same generation and digest: it reaches the cluster without a rollout."""

from __future__ import annotations

from wingsmith.domain.contracts.render import RenderObject
from wingsmith.domain.values import ServingConfig

from .history import PLANE, serving
from .test_render import KEY, Given


def test_an_amended_serving_config_is_published_in_the_same_generation() -> None:
    given = Given()
    given.admit(6)
    before = given.render.views[KEY]
    pod = {"tolerations": [{"key": "gpu", "operator": "Exists"}], "priority_class": "high"}
    moved = ServingConfig.model_validate(serving(2).model_dump() | {"pod": pod})
    given.d.change_serving_config(PLANE, moved)
    given.flush()
    after = given.render.views[KEY]
    assert (after["generation"], after["serving_digest"]) == (
        before["generation"],
        before["serving_digest"],
    )
    assert after["replicas"] == before["replicas"]
    rendered = RenderObject.model_validate(after)
    assert rendered.serving == moved
    assert rendered.serving.pod is not None and rendered.serving.pod.priority_class == "high"
    assert given.published[-1] == after
