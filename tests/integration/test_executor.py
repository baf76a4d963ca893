"""The group-commit executor against a real SQLite store, without NATS: batches, refusals inside
a batch, duplicates inside a batch, and a second writer on the same store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from wingsmith.adapters.store import EventStore, store_env
from wingsmith.domain import commands as c
from wingsmith.services.hub.service import Executor, Submission, parse

from .conftest import LLAMA


@pytest.fixture
def store_env_(tmp_path: Path) -> dict[str, str]:
    return store_env(None, tmp_path)


@pytest.fixture
def executor(store_env_: dict[str, str]) -> Executor:
    return Executor(EventStore(store_env_))


def command(verb: str, **body: Any) -> Submission:
    parsed = parse(f"wingsmith.cmd.{verb}", orjson.dumps(body), 65536)
    assert not isinstance(parsed, bytes), parsed
    return Submission(parsed, None)


def unchecked(cls: type[c.Command], **fields: Any) -> Submission:
    """A command that never passed the edge's validation, to reach the domain's own guards."""
    return Submission(cls.model_construct(**fields), None)


def replies(executor: Executor, *batch: Submission) -> list[dict[str, Any]]:
    raw, _ = executor.execute(list(batch))
    return [orjson.loads(r) for r in raw]


def seed(executor: Executor) -> None:
    assert all(
        r["ok"]
        for r in replies(
            executor,
            command(
                "project.set_quota",
                command_id="q",
                project="research",
                device_class="H100",
                devices=8,
            ),
            command("cluster.register", command_id="c", cluster_id="east"),
            command(
                "workload.create",
                command_id="w",
                workload_id="llama",
                project="research",
                device_class="H100",
                serving=LLAMA,
                replicas=2,
                cluster="east",
            ),
        )
    )


def history(executor: Executor, agg_id: str) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.command_id) for e in executor.store.history(agg_id)]


def test_a_refused_command_leaves_nothing_and_the_rest_of_its_batch_stands(
    executor: Executor,
) -> None:
    out = replies(
        executor,
        command(
            "project.set_quota", command_id="a", project="alpha", device_class="H100", devices=1
        ),
        # registers project beta, then the domain refuses the quota: beta must vanish
        unchecked(c.SetQuota, command_id="b", project="beta", device_class="H100", devices=-1),
        command(
            "project.set_quota", command_id="c", project="alpha", device_class="A100", devices=2
        ),
        command(
            "project.set_quota", command_id="d", project="beta", device_class="H100", devices=3
        ),
    )
    assert [r["ok"] for r in out] == [True, False, True, True]
    assert out[1]["error"] == {
        "code": "invalid_value",
        "message": "quota cannot be negative",
        "details": {"field": "devices"},
    }
    assert history(executor, "project:alpha") == [
        ("ProjectRegistered", "a"),
        ("QuotaSet", "a"),
        ("QuotaSet", "c"),
    ]
    assert history(executor, "project:beta") == [("ProjectRegistered", "d"), ("QuotaSet", "d")]


def test_duplicates_inside_one_batch(executor: Executor) -> None:
    same = dict(command_id="x", project="alpha", device_class="H100", devices=1)
    out = replies(
        executor,
        command("project.set_quota", **same),
        command("project.set_quota", **same),
        command("project.set_quota", **(same | {"devices": 2})),
        unchecked(c.SetQuota, command_id="y", project="alpha", device_class="H100", devices=-1),
        command(
            "project.set_quota", command_id="y", project="alpha", device_class="H100", devices=5
        ),
    )
    assert out[0]["ok"] and out[1]["ok"] and out[1]["duplicate"]
    assert out[1]["result"] == out[0]["result"]
    assert out[2]["error"]["code"] == "command_id_reused"
    assert out[3]["error"]["code"] == "invalid_value"
    assert out[4]["ok"], "a refused command_id may be sent again with a corrected body"
    assert executor.store.load("project:alpha").quota == {"H100": 5}  # type: ignore[union-attr]


def test_a_no_op_decided_on_a_stale_cache_is_decided_again(
    executor: Executor, store_env_: dict[str, str]
) -> None:
    seed(executor)  # this hub now caches the deployment as enabled
    other_hub = Executor(EventStore(store_env_))
    assert replies(
        other_hub, command("deployment.disable", command_id="off", deployment_id="llama--east")
    )[0]["ok"]
    out = replies(
        executor, command("deployment.enable", command_id="on", deployment_id="llama--east")
    )[0]
    assert [e["type"] for e in out["result"]["events"]] == ["DeploymentEnabled"]
    assert executor.store.load("deployment:llama--east").enabled  # type: ignore[union-attr]


def test_a_change_decided_on_a_stale_cache_is_retried_on_fresh_state(
    executor: Executor, store_env_: dict[str, str]
) -> None:
    seed(executor)
    other_hub = Executor(EventStore(store_env_))
    assert replies(
        other_hub,
        command(
            "deployment.set_engine_args",
            command_id="a1",
            deployment_id="llama--east",
            engine_args=["--a"],
        ),
    )[0]["ok"]
    out = replies(
        executor,
        command(
            "deployment.set_engine_args",
            command_id="a2",
            deployment_id="llama--east",
            engine_args=["--b"],
        ),
    )[0]
    assert out["result"]["events"][0]["version"] == 3
    assert executor.conflicts == 1
    assert history(executor, "deployment:llama--east")[1:] == [
        ("EngineArgsSet", "a1"),
        ("EngineArgsSet", "a2"),
    ]


def test_deployment_ids_that_meet_are_refused(executor: Executor) -> None:
    seed(executor)

    def create(workload: str, cluster: str) -> dict[str, Any]:
        return replies(
            executor,
            command(
                "workload.create",
                command_id=f"{workload}.{cluster}",
                workload_id=workload,
                project="research",
                device_class="H100",
                serving=LLAMA,
                replicas=1,
                cluster=cluster,
            ),
        )[0]

    for cluster in ("c", "b--c"):
        replies(
            executor, command("cluster.register", command_id=f"reg-{cluster}", cluster_id=cluster)
        )
    assert create("a--b", "c")["ok"]
    clash = create("a", "b--c")  # also deployment a--b--c
    assert clash["error"]["code"] == "already_exists"
    assert clash["error"]["message"] == "deployment 'a--b--c' already exists"
    assert executor.store.load("workload:a") is None


def test_a_refusal_decided_on_a_stale_cache_is_decided_again(
    executor: Executor, store_env_: dict[str, str]
) -> None:
    """This hub caches `llama` as live; another deleted it: its name is free again."""
    seed(executor)
    other_hub = Executor(EventStore(store_env_))
    assert replies(other_hub, command("workload.delete", command_id="d", workload_id="llama"))[0][
        "ok"
    ]
    again = {"project": "research", "device_class": "H100", "serving": LLAMA, "replicas": 1}
    out = replies(
        executor, command("workload.create", command_id="w2", workload_id="llama", **again)
    )[0]
    assert out["ok"], out
    assert (out["result"]["workload_id"], out["result"]["incarnation"]) == ("llama--2", 2)
    refused = replies(
        executor, command("workload.create", command_id="w3", workload_id="llama", **again)
    )[0]
    assert refused["error"]["code"] == "already_exists"  # fresh, and still refused
