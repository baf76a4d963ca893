"""An operator acts only on render messages for its own cluster: the subject's cluster token and
the render object's `cluster_id` must both name it."""

from __future__ import annotations

import orjson
import pytest

from wingsmith.services.operator.runtime import foreign_cluster


def render(cluster_id: str | None, deployment_id: str = "chat--east") -> bytes:
    return orjson.dumps({"deployment_id": deployment_id, "cluster_id": cluster_id, "replicas": 1})


@pytest.mark.parametrize(
    ("subject", "data"),
    [
        ("wingsmith.render.east.chat--east", render("east")),
        ("wingsmith.render.east.chat--east", b""),  # a removal names no cluster but its subject's
        ("wingsmith.render.east.a.b", render("east")),  # the rest of the subject is the id's
        (
            "wingsmith.render.east.x--west--east",
            render("east", "x--west--east"),
        ),  # workload x--west
    ],
)
def test_its_own_clusters_render_message_is_accepted(subject: str, data: bytes) -> None:
    assert foreign_cluster("east", subject, data) is None


@pytest.mark.parametrize(
    ("subject", "data", "reason"),
    [
        ("wingsmith.render.west.chat--west", render("west"), "not under wingsmith.render.east"),
        ("wingsmith.render.west.chat--west", b"", "not under wingsmith.render.east"),
        ("wingsmith.render.east-2.chat", render("east"), "not under wingsmith.render.east"),
        ("wingsmith.render.east", render("east"), "not under wingsmith.render.east"),
        ("wingsmith.render.east.chat--east", render("west"), "names cluster 'west'"),
        ("wingsmith.render.east.chat--east", render(None), "names cluster None"),
        ("wingsmith.render.east.chat--east", b'{"replicas": 1}', "names cluster None"),
        ("wingsmith.render.east.chat--east", render("east", "chat--west"), "'chat--west' of"),
        ("wingsmith.render.east.chat--east", render("east", "chat--us-east"), "of another"),
    ],
)
def test_a_render_message_naming_another_cluster_is_refused(
    subject: str, data: bytes, reason: str
) -> None:
    why = foreign_cluster("east", subject, data)
    assert why is not None and reason in why
