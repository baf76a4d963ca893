"""Engine arguments that would fight the rendered flags are refused where commands enter:
on create (the command itself), on set_engine_args and on a serving change (their handlers,
which know the deployment's serving config)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from wingsmith.domain import commands as c
from wingsmith.domain.base import InvalidValue
from wingsmith.domain.deployment import Deployment

from .test_delete import CHAT, fleet, run
from .test_discover import ARGS, promote
from .test_discover import fleet as discovered


def test_create_refuses_a_flag_the_serving_config_renders() -> None:
    body = {
        "command_id": "x",
        "workload_id": "chat",
        "project": "research",
        "device_class": "H100",
        "serving": CHAT,
        "replicas": 1,
        "engine_args": ["--enforce-eager", "--tensor-parallel-size=2"],
    }
    with pytest.raises(ValidationError, match=r"engine_args\n.*--tensor-parallel-size conflicts"):
        c.CreateWorkload.model_validate(body)
    c.CreateWorkload.model_validate(body | {"engine_args": ["--enforce-eager"]})


def test_set_engine_args_refuses_a_flag_the_serving_config_renders() -> None:
    repo = fleet()
    with pytest.raises(InvalidValue, match="--model conflicts") as refused:
        run(
            repo,
            "deployment.set_engine_args",
            deployment_id="chat--east",
            engine_args=["--model=x"],
        )
    assert refused.value.field == "engine_args"
    run(repo, "deployment.set_engine_args", deployment_id="chat--east", engine_args=["--host=::"])


def test_a_serving_change_that_would_render_a_set_flag_is_refused() -> None:
    repo = fleet()
    run(
        repo, "deployment.set_engine_args", deployment_id="chat--east", engine_args=["--host", "::"]
    )
    sglang_disagg = CHAT | {"backend": "sglang", "mode": "disaggregated", "devices_per_replica": 2}
    with pytest.raises(InvalidValue, match="--host conflicts"):
        run(repo, "workload.change_serving_config", workload_id="chat", serving=sglang_disagg)
    run(
        repo,
        "workload.change_serving_config",
        workload_id="chat",
        serving=CHAT | {"backend": "sglang"},
    )


def test_an_adopted_deployment_takes_its_workers_whole_argv() -> None:
    """Setting engine_args to what an adopted worker runs (`--model` and all) clears drift:
    its graph is never rendered, so nothing fights them."""
    repo = discovered()
    promote(repo)
    run(repo, "deployment.set_engine_args", deployment_id="qwen--east", engine_args=ARGS)
    assert repo.get(Deployment, "qwen--east").engine_args == tuple(ARGS)
