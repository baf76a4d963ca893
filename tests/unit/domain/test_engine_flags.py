"""Engine arguments that would fight what the renderer spells are refused, naming the flag."""

from __future__ import annotations

import pytest

from wingsmith.domain import engine_flags, releases
from wingsmith.domain.values import ServingConfig

from .conftest import serving


def test_the_release_table_is_newest_first_and_strict_semver() -> None:
    versions = [tuple(int(p) for p in v.split(".")) for v in releases.RELEASES]
    assert versions == sorted(versions, reverse=True)
    assert releases.LATEST == "1.3.1"
    assert releases.RELEASES["1.0.0"].image("trtllm") == (
        "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.0.0"
    )


@pytest.mark.parametrize(
    ("version", "mode_flag"),
    [("0.9.1", False), ("1.0.0", True), ("0.4.1", False), ("2.1", True), ("main", True)],
)
def test_vllm_takes_the_disaggregation_mode_flag_from_dynamo_1_0(
    version: str, mode_flag: bool
) -> None:
    assert releases.vllm_disaggregation_mode(version) is mode_flag


@pytest.mark.parametrize(
    ("changes", "args", "named"),
    [
        ({}, ["--tensor-parallel-size=8"], ["--tensor-parallel-size"]),
        ({}, ["--model", "x", "--model", "y", "-tp", "2"], ["--model", "-tp"]),
        ({"backend": "sglang"}, ["--tp-size", "2", "--headless"], ["--tp-size"]),
        (
            {"backend": "sglang", "mode": "disaggregated", "devices_per_replica": 8},
            ["--host=::"],
            ["--host"],
        ),
        (
            {"backend": "trtllm", "kv_cache": {"dtype": "fp8"}},
            ["--override-engine-args", "{}"],
            ["--override-engine-args"],
        ),
    ],
)
def test_a_conflicting_flag_is_named(
    changes: dict[str, object], args: list[str], named: list[str]
) -> None:
    config = serving(**changes)
    problems = engine_flags.conflicts(config, args)
    assert [p.split(" ", 1)[0] for p in problems] == named
    with pytest.raises(ValueError, match=f"^engine_args: {named[0]} conflicts"):
        engine_flags.check_engine_args(config, args)


@pytest.mark.parametrize(
    ("changes", "args"),
    [
        ({}, ["--max-num-seqs", "8", "--enforce-eager", "--", "-"]),
        ({"backend": "sglang"}, ["--host", "0.0.0.0"]),
        ({"backend": "trtllm"}, ["--override-engine-args", "{}"]),
        ({}, ["--tokenizer", "--model-like-value"]),
    ],
)
def test_other_flags_pass(changes: dict[str, object], args: list[str]) -> None:
    engine_flags.check_engine_args(serving(**changes), args)


def test_trtllm_renders_an_override_exactly_when_there_is_something_to_override() -> None:
    plain: ServingConfig = serving(backend="trtllm")
    assert not engine_flags.renders_trtllm_override(plain)
    for changes in (
        {"kv_cache": {"block_size": 16}},
        {"quantization": "fp8"},
        {"mode": "disaggregated", "devices_per_replica": 8},
    ):
        assert engine_flags.renders_trtllm_override(serving(backend="trtllm", **changes))
