"""Engine arguments that would fight what Wingsmith renders, per backend.

A deployment's engine_args come after the flags the renderer spells from the serving config,
so with argparse's last-one-wins they override them. For most flags that is the point (tune
what the serving config does not say); for some it breaks the graph: a second `--model`, a
tensor-parallel size the devices were not counted for, a disaggregation role the component
type contradicts, a bind address decode cannot reach, a second engine-config override that
replaces Wingsmith's whole, or the flags Dynamo's operator appends itself to a multinode
worker. Those are refused, naming the flag, both where commands enter (domain/commands.py,
the hub's handlers) and where the operator renders (services/operator/dgd.py), so a render
object stored before the check still fails with the same words instead of a broken pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from wingsmith.domain.values import Backend, ServingConfig, ServingMode

_MODEL = "serving.model"
_TENSOR = "serving.parallelism.tensor"
_PIPELINE = "serving.parallelism.pipeline"
_EXPERT = "serving.parallelism.expert"
_DEVICES = "serving.devices_per_replica (the devices left after tensor x pipeline)"
_MODE = "serving.mode (the component each worker runs in)"
_MULTINODE = "Dynamo's operator for a multinode worker"

# The flags each backend's worker is always rendered with, and where the value comes from.
_ALWAYS: Final[Mapping[Backend, Mapping[str, str]]] = {
    Backend.VLLM: {
        "--model": _MODEL,
        "--tensor-parallel-size": _TENSOR,
        "-tp": _TENSOR,
        "--pipeline-parallel-size": _PIPELINE,
        "-pp": _PIPELINE,
        "--data-parallel-size": _DEVICES,
        "-dp": _DEVICES,
        "--disaggregation-mode": _MODE,
        "--is-prefill-worker": _MODE,
        # Dynamo's operator appends these to a multinode worker (backend_vllm.go).
        "--nnodes": _MULTINODE,
        "--node-rank": _MULTINODE,
        "--master-addr": _MULTINODE,
        "--master-port": _MULTINODE,
        "--headless": _MULTINODE,
        "--data-parallel-address": _MULTINODE,
        "--data-parallel-rpc-port": _MULTINODE,
        "--data-parallel-start-rank": _MULTINODE,
        "--data-parallel-size-local": _MULTINODE,
    },
    Backend.SGLANG: {
        "--model-path": _MODEL,
        "--tensor-parallel-size": _TENSOR,
        "--tp-size": _TENSOR,
        "--tp": _TENSOR,
        "--pipeline-parallel-size": _PIPELINE,
        "--pp-size": _PIPELINE,
        "--data-parallel-size": _DEVICES,
        "--dp-size": _DEVICES,
        "--expert-parallel-size": _EXPERT,
        "--ep-size": _EXPERT,
        "--disaggregation-mode": _MODE,
        # Dynamo's operator appends these to a multinode worker (backend_sglang.go).
        "--dist-init-addr": _MULTINODE,
        "--nnodes": _MULTINODE,
        "--node-rank": _MULTINODE,
    },
    Backend.TRTLLM: {
        "--model": _MODEL,
        "--model-path": _MODEL,
        "--tensor-parallel-size": _TENSOR,
        "--pipeline-parallel-size": _PIPELINE,
        "--expert-parallel-size": _EXPERT,
        "--disaggregation-mode": _MODE,
    },
}
_SGLANG_HOST = "serving.mode (disaggregated SGLang workers bind 0.0.0.0 for decode to reach)"
_TRTLLM_OVERRIDE = (
    "the engine-config override Wingsmith renders from serving.kv_cache, serving.quantization "
    "and serving.mode (a second one would replace it whole)"
)


def renders_trtllm_override(serving: ServingConfig) -> bool:
    """Whether a TensorRT-LLM worker of this config gets an `--override-engine-args`."""
    kv = serving.kv_cache
    return (
        serving.mode is ServingMode.DISAGGREGATED
        or serving.quantization is not None
        or any(v is not None for v in (kv.dtype, kv.block_size, kv.gpu_memory_utilization))
    )


def rendered_flags(serving: ServingConfig) -> dict[str, str]:
    """Every flag engine_args may not repeat for this config, with where its value comes from."""
    flags = dict(_ALWAYS[serving.backend])
    disaggregated = serving.mode is ServingMode.DISAGGREGATED
    if serving.backend is Backend.SGLANG and disaggregated:
        flags["--host"] = _SGLANG_HOST
    if serving.backend is Backend.TRTLLM and renders_trtllm_override(serving):
        flags["--override-engine-args"] = _TRTLLM_OVERRIDE
    return flags


def flag_names(args: Iterable[str]) -> list[str]:
    """The flags in an argument list, `--flag=value` read as `--flag`, in order."""
    return [a.split("=", 1)[0] for a in args if a.startswith("-") and a not in ("-", "--")]


def conflicts(serving: ServingConfig, engine_args: Sequence[str]) -> list[str]:
    """A sentence for each engine argument that fights what Wingsmith renders, in order."""
    rendered = rendered_flags(serving)
    named = dict.fromkeys(n for n in flag_names(engine_args) if n in rendered)
    return [f"{name} conflicts with what Wingsmith renders from {rendered[name]}" for name in named]


def check_engine_args(serving: ServingConfig, engine_args: Sequence[str]) -> None:
    """Refuse engine arguments that conflict with the rendered ones, naming each flag."""
    problems = conflicts(serving, engine_args)
    if problems:
        raise ValueError("engine_args: " + "; ".join(problems))
