"""The discovery inspector reads DGDs nobody rendered for us: every argv form, role and version."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from wingsmith.domain.discovery import DiscoveredComponent, Sighting
from wingsmith.domain.values import Backend, ServingMode
from wingsmith.services.operator.dgd import KIND
from wingsmith.services.operator.inspect import (
    ApiVersion,
    Inspection,
    inspect_dgd,
    inspect_file,
    is_rendered_by_wingsmith,
    kubernetes_expand,
    load_manifest,
)
from wingsmith.services.operator.shell import expand_parameter, shell_commands

FIXTURES = Path(__file__).parents[2] / "fixtures"
DGD_FIXTURES = FIXTURES / "dgd"
FILES = DGD_FIXTURES / "files"  # manifest files as they ship: several documents each
CRD_SCHEMAS = FIXTURES / "dynamo"

# ---------------------------------------------------------------------------------------------
# Builders for small manifests


def container(
    command: list[str] | None = None,
    args: list[str] | None = None,
    gpus: str | int | None = None,
    image: str = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.4.0",
    **extra: Any,
) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "image": image, **extra}
    if command is not None:
        main["command"] = command
    if args is not None:
        main["args"] = args
    if gpus is not None:
        main["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return main


def component(name: str = "worker", type_: str | None = "worker", **kw: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {
        k: kw.pop(k) for k in ("replicas", "multinode", "runtimeVersionOverride") if k in kw
    }
    item: dict[str, Any] = {"name": name, **extra}
    if type_ is not None:
        item["type"] = type_
    item["podTemplate"] = {"spec": {"containers": [container(**kw)]}}
    return item


def v1beta1(*components: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "graph", "namespace": "ns"},
        "spec": {**spec, "components": list(components)},
    }


def v1alpha1(services: dict[str, dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "graph", "namespace": "ns"},
        "spec": {**spec, "services": services},
    }


def service(
    component_type: str | None = "worker",
    sub: str | None = None,
    gpu: str | None = None,
    **main: Any,
) -> dict[str, Any]:
    item: dict[str, Any] = {"extraPodSpec": {"mainContainer": {"image": "img:0.9.1", **main}}}
    if component_type is not None:
        item["componentType"] = component_type
    if sub is not None:
        item["subComponentType"] = sub
    if gpu is not None:
        item["resources"] = {"limits": {"gpu": gpu}}
    return item


def only(dgd: dict[str, Any]) -> Any:
    """The single worker component of a small graph."""
    (found,) = inspect_dgd(dgd).components
    return found


def fixture(name: str) -> dict[str, Any]:
    return load_manifest((DGD_FIXTURES / name).read_text())


# ---------------------------------------------------------------------------------------------
# Fixtures: exact summaries


def summary_of(*components: tuple[str, str, int, int, list[str]]) -> list[dict[str, Any]]:
    keys = ("name", "role", "replicas", "gpus_per_replica", "imported_args")
    return [dict(zip(keys, c, strict=True)) for c in components]


EXPECTED: dict[str, dict[str, Any]] = {
    "vllm-agg-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": "vllm",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, []),
            (
                "VllmWorker",
                "worker",
                2,
                2,
                [
                    "--model", "Qwen/Qwen3-8B", "--tensor-parallel-size", "2",
                    "--max-model-len", "32768", "--gpu-memory-utilization", "0.88",
                    "--enable-prefix-caching",
                ],
            ),
        ),
    },
    "vllm-disagg-v1alpha1.yaml": {
        "api_version": "nvidia.com/v1alpha1",
        "backend": "vllm",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, []),
            (
                "VllmDecodeWorker",
                "decode",
                2,
                1,
                [
                    "--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "192",
                    "--block-size", "32",
                ],
            ),
            (
                "VllmPrefillWorker",
                "prefill",
                1,
                1,
                [
                    "--model", "meta-llama/Llama-3.1-8B-Instruct", "--is-prefill-worker",
                    "--block-size", "32",
                ],
            ),
        ),
    },
    "sglang-disagg-shell-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": "sglang",
        "components": summary_of(
            ("frontend", "frontend", 2, 0, ["--router-mode", "kv", "--http-port", "8000"]),
            (
                "prefill",
                "prefill",
                2,
                2,
                [
                    "--model-path", "/models/DeepSeek-R1-Distill-Llama-8B",
                    "--served-model-name", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
                    "--tp", "2", "--trust-remote-code", "--disaggregation-mode", "prefill",
                    "--disaggregation-bootstrap-port", "30001",
                    "--disaggregation-transfer-backend", "nixl",
                    "--mem-fraction-static", "0.82",
                ],
            ),
            (
                "decode",
                "decode",
                1,
                2,
                [
                    "--model-path", "/models/DeepSeek-R1-Distill-Llama-8B",
                    "--served-model-name", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
                    "--tp", "2", "--trust-remote-code", "--disaggregation-mode", "decode",
                    "--disaggregation-transfer-backend", "nixl", "--page-size", "16",
                    "--mem-fraction-static", "0.85",
                ],
            ),
        ),
    },
    "trtllm-agg-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": "trtllm",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, []),
            (
                "TRTLLMWorker",
                "worker",
                3,
                4,
                [
                    "--model-path", "nvidia/Llama-3.1-8B-Instruct-FP8",
                    "--served-model-name", "llama-3.1-8b-fp8",
                    "--extra-engine-args", "/config/agg.yaml",
                ],
            ),
        ),
    },
    "vllm-legacy-main-v1alpha1.yaml": {
        "api_version": "nvidia.com/v1alpha1",
        "backend": "vllm",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, ["--http-port", "8000"]),
            (
                "PrefillWorker",
                "prefill",
                1,
                1,
                [
                    "--model", "mistralai/Mistral-7B-Instruct-v0.3",
                    "--disaggregation-mode", "prefill",
                ],
            ),
            (
                "DecodeWorker",
                "decode",
                3,
                1,
                [
                    "--model", "mistralai/Mistral-7B-Instruct-v0.3",
                    "--disaggregation-mode", "decode",
                ],
            ),
        ),
    },
    "frontend-planner-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": None,
        "components": summary_of(
            (
                "Frontend",
                "frontend",
                3,
                0,
                ["--http-port=8000", "--router-mode=kv", "--kv-cache-block-size=16"],
            ),
            (
                "Planner",
                "planner",
                1,
                0,
                [
                    "--environment=kubernetes", "--backend=vllm", "--adjustment-interval=60",
                    "--profile-results-dir=/data/profiling",
                ],
            ),
        ),
    },
    "sglang-agg-split-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": "sglang",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, ["--router-mode", "round-robin"]),
            (
                "SGLangWorker",
                "worker",
                1,
                1,
                [
                    "--model-path", "Qwen/Qwen3-0.6B", "--served-model-name", "Qwen/Qwen3-0.6B",
                    "--tp-size", "1", "--page-size", "16", "--trust-remote-code",
                    "--skip-tokenizer-init",
                ],
            ),
        ),
    },
    "vllm-disagg-eqflags-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": "vllm",
        "components": summary_of(
            ("epp", "epp", 1, 0, []),
            ("Frontend", "frontend", 1, 0, []),
            (
                "decode",
                "decode",
                2,
                4,
                [
                    "--model=meta-llama/Llama-3.3-70B-Instruct", "--tensor-parallel-size=4",
                    "--max-model-len=65536", "--kv-cache-dtype=fp8",
                ],
            ),
            (
                "prefill",
                "prefill",
                4,
                2,
                [
                    "--model=meta-llama/Llama-3.3-70B-Instruct", "--tensor-parallel-size=2",
                    "--disaggregation-mode=prefill", "--max-model-len=65536",
                ],
            ),
        ),
    },
    "vllm-multinode-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": "vllm",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, []),
            (
                "VllmWorker",
                "worker",
                1,
                16,
                [
                    "--model", "deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "8",
                    "--pipeline-parallel-size", "2", "--trust-remote-code",
                ],
            ),
        ),
    },
    # every service is `main`: the module says which is the frontend
    "vllm-legacy-frontend-main-v1alpha1.yaml": {
        "api_version": "nvidia.com/v1alpha1",
        "backend": "vllm",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, ["--http-port", "8000"]),
            ("VllmWorker", "worker", 2, 1, ["--model", "Qwen/Qwen3-0.6B"]),
        ),
    },
    # `$(MODEL)` is Kubernetes' own expansion from the container's env
    "vllm-decode-only-v1beta1.yaml": {
        "api_version": "nvidia.com/v1beta1",
        "backend": "vllm",
        "components": summary_of(
            ("Frontend", "frontend", 1, 0, []),
            (
                "VllmDecodeWorker",
                "decode",
                2,
                1,
                [
                    "--model", "meta-llama/Llama-3.1-8B-Instruct", "--disaggregation-mode",
                    "decode", "--max-model-len", "16384",
                ],
            ),
        ),
    },
}  # fmt: skip


def test_every_fixture_has_an_expected_summary() -> None:
    assert {p.name for p in DGD_FIXTURES.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_summary(name: str) -> None:
    summary = inspect_dgd(fixture(name)).summary()
    assert summary == EXPECTED[name]
    assert json.loads(json.dumps(summary)) == EXPECTED[name]  # plain JSON types only


PROMOTION = {
    # name: (namespace, dgd name, mode, model, image, engine_version, tensor_parallel)
    "vllm-agg-v1beta1.yaml": (
        "search-serving", "qwen3-chat", ServingMode.AGGREGATED, "Qwen/Qwen3-8B",
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.4.0", "1.4.0", 2,
    ),
    "vllm-disagg-v1alpha1.yaml": (
        "llm-prod", "llama-8b-disagg", ServingMode.DISAGGREGATED,
        "meta-llama/Llama-3.1-8B-Instruct", "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.9.1",
        "0.9.1", 1,
    ),
    # the tag is not a version, so runtimeVersionOverride speaks; $MODEL_PATH comes from env
    "sglang-disagg-shell-v1beta1.yaml": (
        "reasoning", "r1-distill", ServingMode.DISAGGREGATED,
        "/models/DeepSeek-R1-Distill-Llama-8B",
        "registry.example.com/ml/sglang-runtime:nightly-20260801", "1.3.0", 2,
    ),
    # parallelism sits in the --extra-engine-args file: unknown, not 1
    "trtllm-agg-v1beta1.yaml": (
        "inference", "llama-fp8-trt", ServingMode.AGGREGATED, "nvidia/Llama-3.1-8B-Instruct-FP8",
        "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.2.1", "1.2.1", None,
    ),
    "vllm-legacy-main-v1alpha1.yaml": (
        "team-a", "mistral-legacy", ServingMode.DISAGGREGATED,
        "mistralai/Mistral-7B-Instruct-v0.3", "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.8.1",
        "0.8.1", 1,
    ),
    "frontend-planner-v1beta1.yaml": (
        "shared-serving", "gateway", ServingMode.AGGREGATED, None, None, None, None,
    ),
    "sglang-agg-split-v1beta1.yaml": (
        "dev", "qwen-small", ServingMode.AGGREGATED, "Qwen/Qwen3-0.6B",
        "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.0", "1.1.0", 1,
    ),
    # decode stands for the graph: its TP 4, not prefill's 2
    "vllm-disagg-eqflags-v1beta1.yaml": (
        "llm-prod", "llama-70b", ServingMode.DISAGGREGATED, "meta-llama/Llama-3.3-70B-Instruct",
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:v1.3.0-rc1", "v1.3.0-rc1", 4,
    ),
    "vllm-multinode-v1beta1.yaml": (
        "frontier", "deepseek-v3", ServingMode.AGGREGATED, "deepseek-ai/DeepSeek-V3",
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.4.0", "1.4.0", 8,
    ),
    "vllm-legacy-frontend-main-v1alpha1.yaml": (
        "examples", "qwen-small-legacy", ServingMode.AGGREGATED, "Qwen/Qwen3-0.6B",
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.5.0", "0.5.0", 1,
    ),
    # a decode worker with no prefill beside it serves whole requests: aggregated
    "vllm-decode-only-v1beta1.yaml": (
        "llm-dev", "llama-decode-only", ServingMode.AGGREGATED,
        "meta-llama/Llama-3.1-8B-Instruct", "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.2.0",
        "1.2.0", 1,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PROMOTION))
def test_fixture_promotion_fields(name: str) -> None:
    found = inspect_dgd(fixture(name))
    namespace, dgd_name, mode, model, image, version, tp = PROMOTION[name]
    assert (found.namespace, found.name, found.mode) == (namespace, dgd_name, mode)
    assert (found.model, found.image, found.engine_version) == (model, image, version)
    assert found.tensor_parallel == tp


def test_fixture_modules_and_component_backends() -> None:
    found = inspect_dgd(fixture("sglang-disagg-shell-v1beta1.yaml"))
    assert [(c.module, c.backend) for c in found.components] == [
        ("dynamo.frontend", None),
        ("dynamo.sglang", Backend.SGLANG),
        ("dynamo.sglang", Backend.SGLANG),
    ]
    planner = inspect_dgd(fixture("frontend-planner-v1beta1.yaml")).components[1]
    assert (planner.module, planner.backend) == ("dynamo.planner", None)


def _strict(schema: Any) -> Any:
    """The CRD schema refusing unknown fields, which a real API server would silently drop."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {k: _strict(v) for k, v in schema.items()}
    open_ended = (
        "additionalProperties" in strict or "x-kubernetes-preserve-unknown-fields" in strict
    )
    if "properties" in strict and not open_ended:
        strict["additionalProperties"] = False
    return strict


@pytest.fixture(scope="module")
def crd_validators() -> dict[str, jsonschema.Draft202012Validator]:
    return {
        version: jsonschema.Draft202012Validator(
            _strict(json.loads((CRD_SCHEMAS / f"dgd-{version}.schema.json").read_text()))
        )
        for version in ("v1beta1", "v1alpha1")
    }


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixtures_are_valid_dgds(
    name: str, crd_validators: dict[str, jsonschema.Draft202012Validator]
) -> None:
    manifest = fixture(name)
    validator = crd_validators[manifest["apiVersion"].split("/")[1]]
    assert [e.message for e in validator.iter_errors(manifest)] == []


@pytest.mark.parametrize("path", sorted(FILES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_graphs_of_manifest_files_are_valid_dgds(
    path: Path, crd_validators: dict[str, jsonschema.Draft202012Validator]
) -> None:
    graphs = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == KIND]
    assert graphs
    for graph in graphs:
        validator = crd_validators[graph["apiVersion"].split("/")[1]]
        assert [e.message for e in validator.iter_errors(graph)] == []


def test_the_schema_check_catches_a_misspelt_field(
    crd_validators: dict[str, jsonschema.Draft202012Validator],
) -> None:
    manifest = fixture("vllm-agg-v1beta1.yaml")
    worker = manifest["spec"]["components"][1]
    worker["podTemplat"] = worker.pop("podTemplate")
    assert list(crd_validators["v1beta1"].iter_errors(manifest))


# ---------------------------------------------------------------------------------------------
# Argv forms

FLAGS = ["--model", "Qwen/Qwen3-0.6B", "--tensor-parallel-size", "2"]

ARGV_FORMS: dict[str, tuple[list[str] | None, list[str] | None]] = {
    "module in command": (["python3", "-m", "dynamo.vllm"], FLAGS),
    "split across command and args": (["python3"], ["-m", "dynamo.vllm", *FLAGS]),
    "all in command": (["python3", "-m", "dynamo.vllm", *FLAGS], None),
    "all in args": (None, ["python3", "-m", "dynamo.vllm", *FLAGS]),
    "python options and env": (["/usr/bin/env", "python3.12", "-u", "-m", "dynamo.vllm"], FLAGS),
    "module glued to -m": (["python", "-mdynamo.vllm"], FLAGS),
    "sh -c with the script in args": (
        ["/bin/sh", "-c"], ["python3 -m dynamo.vllm " + " ".join(FLAGS)],
    ),
    "bash -ec with the script in command": (
        ["bash", "-ec", "exec python3 -m dynamo.vllm " + " ".join(FLAGS)], None,
    ),
    "bash -o pipefail -c": (
        ["bash", "-o", "pipefail", "-c"], ["python3 -m dynamo.vllm " + " ".join(FLAGS)],
    ),
    "a lone string the operator runs with sh -c": (
        None, ["python3 -m dynamo.vllm " + " ".join(FLAGS)],
    ),
    "continuations and a prelude": (
        ["/bin/sh", "-c"],
        ["set -e\necho start; \\\n  python3 -m dynamo.vllm \\\n  --model Qwen/Qwen3-0.6B \\\n"
         "  --tensor-parallel-size 2\n"],
    ),
    "a namespace clean-up before the engine": (
        ["sh", "-c"],
        ["python3 -m dynamo.vllm.utils.clear_namespace --namespace ns && "
         "VLLM_LOGGING_LEVEL=DEBUG python3 -m dynamo.vllm " + " ".join(FLAGS)],
    ),
    "output piped and redirected": (
        ["sh", "-c"], ["python3 -m dynamo.vllm " + " ".join(FLAGS) + " 2>&1 | tee /tmp/log"],
    ),
    "followed by ||": (["sh", "-c"], ["python3 -m dynamo.vllm " + " ".join(FLAGS) + "||exit 1"]),
    "backgrounded": (["sh", "-c"], ["python3 -m dynamo.vllm " + " ".join(FLAGS) + " & wait"]),
    "stdout to a file": (["sh", "-c"], ["python3 -m dynamo.vllm " + " ".join(FLAGS) + " >log"]),
    "a comment line": (
        ["sh", "-c"], ["# start the engine\npython3 -m dynamo.vllm " + " ".join(FLAGS) + " # go"],
    ),
    "quoted words": (
        ["sh", "-c"],
        ["python3 -m dynamo.vllm --model 'Qwen/Qwen3-0.6B' \"--tensor-parallel-size\" '2'"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("form", sorted(ARGV_FORMS))
def test_argv_forms_give_the_same_imported_args(form: str) -> None:
    command, args = ARGV_FORMS[form]
    found = only(v1beta1(component(command=command, args=args)))
    assert (found.module, found.backend) == ("dynamo.vllm", Backend.VLLM)
    assert found.imported_args == tuple(FLAGS)
    assert (found.model, found.tensor_parallel) == ("Qwen/Qwen3-0.6B", 2)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        # references to names the env lacks stay literal tokens, quoted or not, braced or not;
        # a default decides where it is given
        ('--model "$MODEL" --x ${X} --y "${Y:-1}"',
         ["--model", "$MODEL", "--x", "${X}", "--y", "1"]),
        # substitutions keep their spaces and operators inside
        ("--node-rank $(hostname | cut -d- -f2) --b `date +%s`",
         ["--node-rank", "$(hostname | cut -d- -f2)", "--b", "`date +%s`"]),
        # quoted operators are arguments, not operators
        ("--stop ';' --sep '&&' --pipe \"|\" --hash '#x' --v a#b", [
            "--stop", ";", "--sep", "&&", "--pipe", "|", "--hash", "#x", "--v", "a#b"]),
        # double quotes keep the backslash unless it escapes $ ` \" \\
        (r'--t "a \"b\" \$c \n"', ["--t", 'a "b" $c \\n']),
        # a continuation inside a word joins it, inside double quotes too
        ("--max-model-len 32\\\n768", ["--max-model-len", "32768"]),
        ('--name "my\\\nmodel"', ["--name", "mymodel"]),
        # an escaped space and an empty quoted word
        ("--name my\\ model --empty ''", ["--name", "my model", "--empty", ""]),
        # only unquoted digits glued to a redirection name a file descriptor
        ("--tp 2 >log", ["--tp", "2"]),
        ("--tp '2'>log", ["--tp", "2"]),
    ],
)  # fmt: skip
def test_shell_script_words(script: str, expected: list[str]) -> None:
    found = only(
        v1beta1(component(command=["/bin/sh", "-c"], args=[f"python3 -m dynamo.vllm {script}"]))
    )
    assert list(found.imported_args) == expected


def test_shell_commands_split_at_operators_and_newlines() -> None:
    script = "a 'b c'&&d\ne;f | g || h & i > j 2>&1 < k (l) # m ; n\n"
    assert shell_commands(script) == [
        ["a", "b c"], ["d"], ["e"], ["f"], ["g"], ["h"], ["i"], ["j"], ["1"], ["k"], ["l"],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (["/scripts/launch.sh"], ["--model", "m"]),  # a launcher of its own
        (["python3", "/app/serve.py", "-m", "dynamo.vllm"], None),  # runs a file
        (["python3", "-c", "import dynamo"], None),
        (["python3", "-c", "-m", "dynamo.vllm"], None),  # -c takes the next word as its code
        (["bash", "/scripts/run.sh"], None),  # a shell running a file, not -c
        (["sh", "-c"], None),  # -c with no script
        (None, None),
        (["sh", "-c"], ["vllm serve Qwen/Qwen3-0.6B --tensor-parallel-size 2"]),  # no module
    ],
)
def test_unrecognised_launches_import_nothing(
    command: list[str] | None, args: list[str] | None
) -> None:
    found = only(v1beta1(component(command=command, args=args)))
    assert (found.module, found.backend, found.imported_args) == (None, None, ())


def test_a_frontend_without_command_runs_the_operator_default() -> None:
    found = only(v1beta1(component("fe", "frontend", args=["--router-mode", "kv"])))
    assert (found.module, found.imported_args) == ("dynamo.frontend", ("--router-mode", "kv"))


def test_the_engine_wins_over_another_dynamo_process_in_one_script() -> None:
    script = "python3 -m dynamo.frontend --http-port 8000 & python3 -m dynamo.sglang --tp 2"
    found = only(v1beta1(component(type_=None, command=["sh", "-c", script])))
    assert (found.module, found.imported_args, found.role) == (
        "dynamo.sglang",
        ("--tp", "2"),
        "worker",
    )


# ---------------------------------------------------------------------------------------------
# Roles


def vllm(*flags: str) -> dict[str, Any]:
    return {"command": ["python3", "-m", "dynamo.vllm"], "args": list(flags)}


@pytest.mark.parametrize(
    ("declared", "launch", "role"),
    [
        ("frontend", {}, "frontend"),
        ("worker", vllm(), "worker"),
        ("prefill", vllm(), "prefill"),
        ("decode", vllm(), "decode"),
        ("planner", {}, "planner"),
        ("epp", {}, "epp"),
        ("worker", vllm("--disaggregation-mode", "prefill"), "prefill"),
        ("worker", vllm("--disaggregation-mode=decode"), "decode"),
        ("worker", vllm("--disaggregation-mode", "PREFILL"), "prefill"),
        ("worker", vllm("--is-prefill-worker"), "prefill"),
        ("worker", vllm("--is-decode-worker"), "decode"),
        ("worker", vllm("--disaggregation-mode", "prefill_and_decode"), "worker"),
        # the last flag wins, as with argparse
        ("worker", vllm("--disaggregation-mode=decode", "--disaggregation-mode", "prefill"),
         "prefill"),
        # an explicit prefill/decode type is not second-guessed by flags
        ("decode", vllm("--disaggregation-mode", "prefill"), "decode"),
        ("frontend", vllm("--disaggregation-mode", "prefill"), "frontend"),
        ("main", vllm("--disaggregation-mode", "decode"), "decode"),
        ("main", vllm(), "worker"),  # a legacy main running an engine is its worker
        ("Worker", vllm(), "worker"),
        ("lpx", {}, "lpx"),
        (None, vllm(), "worker"),
        (None, vllm("--disaggregation-mode", "prefill"), "prefill"),
        (None, {"command": ["python3", "-m", "dynamo.frontend"]}, "frontend"),
        (None, {"command": ["python3", "-m", "dynamo.planner.planner_sla"]}, "planner"),
        (None, {"command": ["/bin/custom"]}, "unknown"),
    ],
)  # fmt: skip
def test_v1beta1_roles(declared: str | None, launch: dict[str, Any], role: str) -> None:
    assert only(v1beta1(component(type_=declared, **launch))).role == role


@pytest.mark.parametrize(
    ("component_type", "sub", "launch", "role"),
    [
        ("worker", "prefill", vllm(), "prefill"),
        ("worker", "decode", vllm(), "decode"),
        ("worker", "decode", vllm("--disaggregation-mode", "prefill"), "decode"),
        ("worker", None, vllm("--disaggregation-mode", "decode"), "decode"),
        ("main", None, vllm("--disaggregation-mode", "prefill"), "prefill"),
        ("main", "decode", vllm(), "decode"),
        ("frontend", "prefill", {}, "frontend"),
        ("router", None, {}, "router"),
        (None, None, vllm(), "worker"),
    ],
)  # fmt: skip
def test_v1alpha1_roles(
    component_type: str | None, sub: str | None, launch: dict[str, Any], role: str
) -> None:
    dgd = v1alpha1({"Svc": service(component_type, sub, **launch)})
    assert only(dgd).role == role


# ---------------------------------------------------------------------------------------------
# Backend


@pytest.mark.parametrize(
    ("module", "backend"),
    [
        ("dynamo.vllm", Backend.VLLM),
        ("dynamo.sglang", Backend.SGLANG),
        ("dynamo.trtllm", Backend.TRTLLM),
        ("dynamo.sglang.decode_worker", Backend.SGLANG),  # older module layouts
        ("dynamo.vllmx", None),
        ("dynamo.mocker", None),
    ],
)
def test_backend_is_inferred_from_the_worker_module(module: str, backend: Backend | None) -> None:
    dgd = v1beta1(component("fe", "frontend"), component(command=["python3", "-m", module]))
    assert inspect_dgd(dgd).backend is backend


def test_backend_framework_is_taken_as_declared() -> None:
    dgd = v1beta1(component(command=["python3", "-m", "dynamo.vllm"]), backendFramework="sglang")
    assert inspect_dgd(dgd).backend is Backend.SGLANG


def test_workers_of_different_backends_give_no_backend() -> None:
    dgd = v1beta1(
        component("a", command=["python3", "-m", "dynamo.vllm"]),
        component("b", command=["python3", "-m", "dynamo.sglang"]),
    )
    assert inspect_dgd(dgd).backend is None


def test_v1alpha1_backend_inference() -> None:
    dgd = v1alpha1({"W": service(command=["python3", "-m", "dynamo.trtllm"])})
    assert inspect_dgd(dgd).backend is Backend.TRTLLM


# ---------------------------------------------------------------------------------------------
# Replicas and GPUs


def test_replicas_default_to_one_and_zero_is_kept() -> None:
    dgd = v1beta1(component("a"), component("b", replicas=0))
    assert [c.replicas for c in inspect_dgd(dgd).components] == [1, 0]


@pytest.mark.parametrize(
    ("resources", "gpus"),
    [
        ({"limits": {"nvidia.com/gpu": "4"}}, 4),
        ({"limits": {"nvidia.com/gpu": 2}}, 2),
        ({"requests": {"nvidia.com/gpu": "1"}}, 1),
        ({"limits": {"cpu": "4"}}, 0),
        ({}, 0),
    ],
)
def test_v1beta1_gpus(resources: dict[str, Any], gpus: int) -> None:
    assert only(v1beta1(component(resources=resources))).gpus_per_replica == gpus


@pytest.mark.parametrize(("multinode", "nodes"), [({"nodeCount": 4}, 4), ({}, 2)])
def test_multinode_multiplies_gpus_by_nodes(multinode: dict[str, Any], nodes: int) -> None:
    found = only(v1beta1(component(gpus="8", multinode=multinode)))
    assert (found.gpus_per_replica, found.node_count) == (8 * nodes, nodes)


def test_multinode_roles_with_their_own_templates() -> None:
    def role(name: str, gpus: str, **extra: Any) -> dict[str, Any]:
        args = ["--tp", "16", "--leader"] if name == "leader" else ["--tp", "16"]
        main = container(["python3", "-m", "dynamo.sglang"], args, gpus)
        return {"name": name, "podTemplate": {"spec": {"containers": [main]}}, **extra}

    item = {
        "name": "worker",
        "type": "worker",
        "multinode": {"nodeCount": 3},
        "roles": [role("worker", "8"), role("leader", "4")],
    }
    found = only(v1beta1(item))
    assert found.gpus_per_replica == 4 + 2 * 8  # one leader, nodeCount - 1 workers
    assert found.imported_args == ("--tp", "16", "--leader")


@pytest.mark.parametrize(
    ("svc", "gpus"),
    [
        (service(gpu="2"), 2),
        ({**service(), "resources": {"requests": {"gpu": "1"}}}, 1),
        (service(resources={"limits": {"nvidia.com/gpu": "3"}}), 3),  # k8s resources on main
        ({**service(gpu="2"), "multinode": {"nodeCount": 2}}, 4),
        (service(), 0),
        ({"componentType": "frontend"}, 0),  # no extraPodSpec at all
    ],
)
def test_v1alpha1_gpus(svc: dict[str, Any], gpus: int) -> None:
    assert only(v1alpha1({"Svc": svc})).gpus_per_replica == gpus


# ---------------------------------------------------------------------------------------------
# Promotion fields


@pytest.mark.parametrize(
    ("image", "override", "version"),
    [
        ("nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.1", None, "0.4.1"),
        ("nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.1", "0.5.0", "0.4.1"),
        ("registry:5000/vllm-runtime:v1.3.0-rc1@sha256:" + "a" * 64, None, "v1.3.0-rc1"),
        ("vllm-runtime:latest", "1.4.0", "1.4.0"),
        ("registry:5000/team/vllm-runtime", "1.4.0", "1.4.0"),  # a port is not a tag
        ("vllm-runtime@sha256:" + "b" * 64, "1.2.0", "1.2.0"),
        ("vllm-runtime:1.4", None, None),
        ("vllm-runtime:my-tag", None, None),
    ],
)
def test_engine_version(image: str, override: str | None, version: str | None) -> None:
    kwargs = {"runtimeVersionOverride": override} if override else {}
    found = only(v1beta1(component(image=image, **kwargs)))
    assert (found.image, found.engine_version) == (image, version)


def test_engine_version_comes_from_the_runtime_sidecar_when_there_is_one() -> None:
    item = component(image="vllm/vllm-openai:v0.11.0")
    runtime = {"name": "runtime", "image": "nvcr.io/nvidia/ai-dynamo/runtime:1.5.0"}
    item["podTemplate"]["spec"]["initContainers"] = [runtime]
    found = only(v1beta1(item))
    assert (found.image, found.engine_version) == ("vllm/vllm-openai:v0.11.0", "1.5.0")


@pytest.mark.parametrize(
    ("args", "env", "model"),
    [
        (["--model", "a/b", "--served-model-name", "c"], [], "a/b"),
        (["--model-path", "/models/x", "--served-model-name", "c"], [], "/models/x"),
        (["Qwen/Qwen3-0.6B", "--tp", "1"], [], "Qwen/Qwen3-0.6B"),
        (["--served-model-name", "c", "d"], [], "c"),
        (["--model", "$MODEL"], [{"name": "MODEL", "value": "a/b"}], "a/b"),
        (["--model", "${MODEL}"], [{"name": "MODEL", "value": "a/b"}], "a/b"),
        (["--model", "$MODEL"], [{"name": "MODEL", "valueFrom": {"secretKeyRef": {}}}], "$MODEL"),
        (["--model", "/models/$MODEL"], [{"name": "MODEL", "value": "a"}], "/models/$MODEL"),
        (["--trust-remote-code"], [], None),
    ],
)
def test_model(args: list[str], env: list[dict[str, Any]], model: str | None) -> None:
    main: dict[str, Any] = {"command": ["python3", "-m", "dynamo.vllm"], "args": args, "env": env}
    assert only(v1beta1(component(**main))).model == model


@pytest.mark.parametrize(
    ("args", "env", "tp"),
    [
        ([], [], 1),
        (["--tensor-parallel-size", "4"], [], 4),
        (["-tp", "2"], [], 2),
        (["--tp=8"], [], 8),
        (["--tp-size", "2"], [], 2),
        (["--tp", "$TP"], [{"name": "TP", "value": "4"}], 4),
        (["--tp", "$TP"], [], None),
        (["--tp", "0"], [], None),
        (["--extra-engine-args", "/config/engine.yaml"], [], None),
        (["--extra-engine-args=/c.yaml", "--tensor-parallel-size", "2"], [], 2),
    ],
)
def test_tensor_parallel(args: list[str], env: list[dict[str, Any]], tp: int | None) -> None:
    main: dict[str, Any] = {"command": ["python3", "-m", "dynamo.trtllm"], "args": args, "env": env}
    assert only(v1beta1(component(**main))).tensor_parallel == tp


def test_primary_prefers_the_aggregated_worker_then_decode_then_prefill() -> None:
    def engine(name: str, role: str, tp: str) -> dict[str, Any]:
        return component(name, role, command=["python3", "-m", "dynamo.vllm"], args=["--tp", tp])

    found = inspect_dgd(v1beta1(engine("p", "prefill", "1"), engine("d", "decode", "2")))
    assert (found.primary and found.primary.name, found.tensor_parallel) == ("d", 2)
    found = inspect_dgd(v1beta1(engine("d", "decode", "2"), engine("w", "worker", "4")))
    assert (found.primary and found.primary.name, found.tensor_parallel) == ("w", 4)
    found = inspect_dgd(v1beta1(engine("m", "main", "8")))
    assert (found.primary and found.primary.name, found.mode) == ("m", ServingMode.AGGREGATED)
    found = inspect_dgd(v1beta1(component("fe", "frontend")))
    assert (found.primary, found.model, found.image, found.tensor_parallel) == (None,) * 4


# ---------------------------------------------------------------------------------------------
# A graph is disaggregated only with a prefill worker


def engine(name: str, type_: str, *flags: str, gpus: str = "1") -> dict[str, Any]:
    return component(
        name, type_, command=["python3", "-m", "dynamo.vllm"], args=[*flags], gpus=gpus
    )


@pytest.mark.parametrize(
    ("dgd", "mode"),
    [
        (v1beta1(component("fe", "frontend"), engine("d", "decode")), ServingMode.AGGREGATED),
        (v1beta1(engine("w", "worker", "--disaggregation-mode", "decode")),
         ServingMode.AGGREGATED),
        (v1beta1(engine("w", "worker", "--is-decode-worker")), ServingMode.AGGREGATED),
        (v1alpha1({"W": service("worker", "decode", "1", **vllm())}), ServingMode.AGGREGATED),
        (v1beta1(engine("p", "prefill"), engine("d", "decode")), ServingMode.DISAGGREGATED),
        (v1alpha1({"P": service("worker", "prefill"), "D": service("worker", "decode")}),
         ServingMode.DISAGGREGATED),
        (v1beta1(engine("p", "prefill", gpus="1") | {"replicas": 0}, engine("d", "decode")),
         ServingMode.DISAGGREGATED),  # prefill scaled to zero is still part of the graph
    ],
)  # fmt: skip
def test_a_graph_is_disaggregated_only_with_a_prefill_worker(
    dgd: dict[str, Any], mode: ServingMode
) -> None:
    assert inspect_dgd(dgd).mode is mode


def sighting_of(found: Inspection) -> Sighting:
    """The sighting an operator reports for an inspection (as the Kubernetes backend builds it)."""
    return Sighting(
        namespace=found.namespace or "default",
        name=found.name,
        api_version=str(found.api_version),
        backend=found.backend,
        components=tuple(DiscoveredComponent(**c.summary()) for c in found.components),
        model=found.model,
        image=found.image,
        engine_version=found.engine_version,
        tensor_parallel=found.tensor_parallel,
    )


def test_a_decode_only_graph_implies_an_aggregated_serving_config() -> None:
    """Read as disaggregated, one 1-GPU decode worker could not be split into prefill and
    decode halves, and promotion was refused."""
    sighting = sighting_of(inspect_dgd(fixture("vllm-decode-only-v1beta1.yaml")))
    serving = sighting.implied_serving()
    assert (serving.mode, serving.devices_per_replica) == (ServingMode.AGGREGATED, 1)
    assert serving.model == "meta-llama/Llama-3.1-8B-Instruct"


# ---------------------------------------------------------------------------------------------
# Legacy `componentType: main`: the module says what runs


@pytest.mark.parametrize(
    ("name", "svc", "role", "module"),
    [
        ("Frontend", service("main", args=["python3", "-m", "dynamo.frontend"]), "frontend",
         "dynamo.frontend"),
        ("Frontend", service("main", command=["python3", "-m", "dynamo.frontend"], gpu="1"),
         "frontend", "dynamo.frontend"),
        # no command at all: the operator's default, the frontend, on a frontend-ish service
        ("Frontend", service("main"), "frontend", "dynamo.frontend"),
        ("Router", service("main", args=["--router-mode", "kv"]), "frontend", "dynamo.frontend"),
        ("Worker", service("main", gpu="1"), "main", None),  # holds GPUs: not a frontend
        ("Worker", service("main", gpu="1", command=["python3", "-m", "dynamo.sglang"]), "worker",
         "dynamo.sglang"),
        ("Worker", service("main", gpu="1", args=["python3 -m dynamo.trtllm --tp-size 2"]),
         "worker", "dynamo.trtllm"),
        ("Planner", service("main", command=["python3", "-m", "dynamo.planner.planner_sla"]),
         "planner", "dynamo.planner.planner_sla"),
    ],
)  # fmt: skip
def test_legacy_main_services_are_what_their_module_runs(
    name: str, svc: dict[str, Any], role: str, module: str | None
) -> None:
    (found,) = inspect_dgd(v1alpha1({name: svc})).components
    assert (found.role, found.module) == (role, module)


def test_a_legacy_main_frontend_is_never_a_worker() -> None:
    found = inspect_dgd(fixture("vllm-legacy-frontend-main-v1alpha1.yaml"))
    assert [c.name for c in found.workers] == ["VllmWorker"]
    assert found.primary is not None and found.primary.name == "VllmWorker"
    sighting = sighting_of(found)
    assert [c.name for c in sighting.workers()] == ["VllmWorker"]
    assert sighting.devices_per_replica() == 1  # the frontend's pod is not counted
    assert sighting.implied_serving().mode is ServingMode.AGGREGATED


# ---------------------------------------------------------------------------------------------
# Env references: Kubernetes' `$(VAR)` and the shell's `$VAR`, `${VAR:-default}`

ENV = {"M": "a/b", "E": "", "ARGS": "--tp 2  --x y", "S": None}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(M)", "a/b"),
        ("/models/$(M)/w", "/models/a/b/w"),
        ("$$(M)", "$(M)"),  # escaped: the container gets the reference itself
        ("$$", "$"),
        ("$(UNKNOWN)", "$(UNKNOWN)"),
        ("$(S)", "$(S)"),  # set by valueFrom: only the pod knows
        ("$(M", "$(M"),
        ("$M ${M} $", "$M ${M} $"),  # not Kubernetes' syntax
        ("$(hostname | cut -d- -f2)", "$(hostname | cut -d- -f2)"),
    ],
)
def test_kubernetes_expansion(text: str, expanded: str) -> None:
    assert kubernetes_expand(text, ENV) == expanded


@pytest.mark.parametrize(
    ("reference", "value"),
    [
        ("$M", "a/b"), ("${M}", "a/b"), ("${M:-d}", "a/b"), ("${M-d}", "a/b"),
        ("${X:-d}", "d"), ("${X-d}", "d"), ("${E:-d}", "d"), ("${E-d}", ""),
        ("${M:+set}", "set"), ("${E:+set}", ""), ("${E+set}", "set"), ("${X+set}", ""),
        ("${X:-$M}", "a/b"), ("${X:-${M}/x}", "a/b/x"),
        ("$X", None), ("${X}", None), ("${X:-$Y}", None),
        ("$S", None), ("${S:-d}", None),  # valueFrom: only the pod knows
        ("${#M}", None), ("${M%b}", None),
    ],
)  # fmt: skip
def test_shell_parameter_expansion(reference: str, value: str | None) -> None:
    assert expand_parameter(reference, ENV) == value


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ('--model "$M" --served ${M}', ["--model", "a/b", "--served", "a/b"]),
        ("--model '$M'", ["--model", "$M"]),  # single quotes expand nothing
        ("$ARGS --z", ["--tp", "2", "--x", "y", "--z"]),  # unquoted: split into words
        ('"$ARGS"', ["--tp 2  --x y"]),
        ("--a $E --b", ["--a", "--b"]),  # an empty unquoted value is no word at all
        ('--a "$E" --b', ["--a", "", "--b"]),
        ("--len ${LEN:-8192}", ["--len", "8192"]),
        ("--dir /m/${M}x", ["--dir", "/m/a/bx"]),
        ("--t $S --u ${S:-1}", ["--t", "$S", "--u", "${S:-1}"]),
        ("--r $(hostname)", ["--r", "$(hostname)"]),
    ],
)
def test_shell_scripts_expand_the_env(script: str, words: list[str]) -> None:
    assert shell_commands(script, ENV) == [words]


def env_entries(**values: str | None) -> list[dict[str, Any]]:
    return [
        {"name": k, "value": v} if v is not None else {"name": k, "valueFrom": {"fieldRef": {}}}
        for k, v in values.items()
    ]


@pytest.mark.parametrize(
    ("main", "args"),
    [
        # Kubernetes expands `$(VAR)` in command and args, an env value using an earlier one
        ({"command": ["python3", "-m", "dynamo.vllm"], "args": ["--model", "$(MODEL)"]},
         ["--model", "/models/llama"]),
        ({"command": ["python3", "-m", "dynamo.vllm", "--model=$(MODEL)"]},
         ["--model=/models/llama"]),
        # ... and before the shell reads the script: `$$(VAR)` reaches it as `$(VAR)`
        ({"command": ["sh", "-c"], "args": ["python3 -m dynamo.vllm --model $(MODEL) --n $$(N)"]},
         ["--model", "/models/llama", "--n", "$(N)"]),
        ({"command": ["sh", "-c"], "args": ['python3 -m dynamo.vllm --model "${MODEL}" $EXTRA']},
         ["--model", "/models/llama", "--enforce-eager", "--max-num-seqs", "64"]),
        ({"args": ["python3 -m dynamo.vllm --model $MODEL --len ${LEN:-4096}"]},
         ["--model", "/models/llama", "--len", "4096"]),
        # exec form: no shell, so `$MODEL` reaches the engine as written
        ({"command": ["python3", "-m", "dynamo.vllm"], "args": ["--model", "$MODEL"]},
         ["--model", "$MODEL"]),
    ],
)  # fmt: skip
def test_engine_args_are_read_after_env_expansion(main: dict[str, Any], args: list[str]) -> None:
    env = env_entries(
        DIR="/models", MODEL="$(DIR)/llama", EXTRA="--enforce-eager --max-num-seqs 64"
    )
    found = only(v1beta1(component(**main, env=env)))
    assert (list(found.imported_args), found.model) == (args, "/models/llama")


def test_references_left_unresolved_are_said() -> None:
    main: dict[str, Any] = {
        "command": ["sh", "-c"],
        "args": ["python3 -m dynamo.vllm --model $(HF_MODEL) --tp $TP --x ${DIR:-/d} --y $MISSING"],
        "env": env_entries(HF_MODEL=None, TP=None),
    }
    found = inspect_dgd(v1beta1(component("fe", "frontend"), component("w", **main)))
    assert found.components[1].unresolved == (
        ("HF_MODEL", "valueFrom"), ("TP", "valueFrom"), ("MISSING", "unset"),
    )  # fmt: skip
    assert found.summary()["unresolved"] == [
        {"component": "w", "variable": "HF_MODEL", "why": "valueFrom"},
        {"component": "w", "variable": "TP", "why": "valueFrom"},
        {"component": "w", "variable": "MISSING", "why": "unset"},
    ]
    assert found.tensor_parallel is None  # `$TP` is not a number


def test_fixtures_leave_no_reference_unresolved() -> None:
    for name in EXPECTED:
        assert "unresolved" not in inspect_dgd(fixture(name)).summary(), name


# ---------------------------------------------------------------------------------------------
# Manifest files: several documents, several graphs, ConfigMaps beside them


def test_a_file_is_read_for_the_graph_beside_its_configmap_and_secret() -> None:
    (found,) = inspect_file((FILES / "trtllm-agg-recipe.yaml").read_text())
    assert (found.name, found.namespace, found.backend) == ("llama-agg", None, Backend.TRTLLM)
    assert [c.role for c in found.components] == ["frontend", "worker"]
    assert found.model == "nvidia/Llama-3.3-70B-Instruct-FP8"  # `"${MODEL_PATH}"` from env
    assert found.primary is not None and found.primary.imported_args[4:6] == (
        "--max-seq-len",
        "8192",  # `${MAX_SEQ_LEN:-8192}`, unset
    )
    assert found.tensor_parallel == 4  # from the engine config in the ConfigMap


def test_without_its_configmap_the_engine_configs_parallelism_is_unknown() -> None:
    documents = list(yaml.safe_load_all((FILES / "trtllm-agg-recipe.yaml").read_text()))
    (graph,) = [d for d in documents if d["kind"] == KIND]
    assert inspect_dgd(graph).tensor_parallel is None


def trtllm_worker(mount: dict[str, Any], volume: dict[str, Any], flag: str) -> dict[str, Any]:
    item = component(
        command=["python3", "-m", "dynamo.trtllm"],
        args=["--extra-engine-args", flag],
        volumeMounts=[{"name": "cfg", **mount}],
    )
    item["podTemplate"]["spec"]["volumes"] = [{"name": "cfg", "configMap": volume}]
    return item


def config_map(data: dict[str, str], namespace: str | None = "ns") -> dict[str, Any]:
    metadata = {"name": "engine"} | ({"namespace": namespace} if namespace else {})
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


_AT_CFG: dict[str, Any] = {"mountPath": "/cfg"}
_ENGINE: dict[str, Any] = {"name": "engine"}


def _engine_yaml(text: str, key: str = "e.yaml") -> dict[str, str]:
    return {key: text}


@pytest.mark.parametrize(
    ("mount", "volume", "flag", "data", "tp"),
    [
        (_AT_CFG, _ENGINE, "/cfg/e.yaml", _engine_yaml("tensor_parallel_size: 2"), 2),
        ({"mountPath": "/cfg/"}, _ENGINE, "/cfg/e.yaml", _engine_yaml("tensor_parallel_size: 2"),
         2),
        ({"mountPath": "/cfg/e.yaml", "subPath": "k"}, _ENGINE, "/cfg/e.yaml",
         _engine_yaml("tensor_parallel_size: 8", "k"), 8),
        (_AT_CFG, _ENGINE | {"items": [{"key": "k", "path": "sub/e.yaml"}]}, "/cfg/sub/e.yaml",
         _engine_yaml("tensor_parallel_size: 4", "k"), 4),
        # TensorRT-LLM's default when the file does not say
        (_AT_CFG, _ENGINE, "/cfg/e.yaml", _engine_yaml("backend: pytorch"), 1),
        (_AT_CFG, _ENGINE, "/cfg/e.yaml", _engine_yaml("tensor_parallel_size: x"), None),
        (_AT_CFG, _ENGINE, "/cfg/e.yaml", _engine_yaml("[: bad"), None),
        (_AT_CFG, _ENGINE, "/other/e.yaml", _engine_yaml("tensor_parallel_size: 2"), None),
        (_AT_CFG, {"name": "other"}, "/cfg/e.yaml", _engine_yaml("tensor_parallel_size: 2"), None),
    ],
)  # fmt: skip
def test_the_engine_config_is_read_from_the_configmap_the_worker_mounts(
    mount: dict[str, Any], volume: dict[str, Any], flag: str, data: dict[str, str], tp: int | None
) -> None:
    text = yaml.safe_dump_all([config_map(data), v1beta1(trtllm_worker(mount, volume, flag))])
    (found,) = inspect_file(text)
    assert found.tensor_parallel == tp


def test_a_configmap_of_another_namespace_is_not_the_graphs() -> None:
    worker = trtllm_worker({"mountPath": "/cfg"}, {"name": "engine"}, "/cfg/e.yaml")
    data = {"e.yaml": "tensor_parallel_size: 2"}
    text = yaml.safe_dump_all([config_map(data, "elsewhere"), v1beta1(worker)])
    assert inspect_file(text)[0].tensor_parallel is None
    text = yaml.safe_dump_all([config_map(data, None), v1beta1(worker)])
    assert inspect_file(text)[0].tensor_parallel == 2  # applied with `-n`, like the graph


def test_each_graph_of_a_file_is_inspected() -> None:
    found = inspect_file((FILES / "two-graphs.yaml").read_text())
    assert [(i.namespace, i.name, i.backend) for i in found] == [
        ("team-b", "qwen-agg", Backend.VLLM),
        ("team-b", "qwen-sglang", Backend.SGLANG),
    ]
    assert [i.tensor_parallel for i in found] == [1, 2]


def test_a_kubectl_list_and_json_are_read_alike() -> None:
    graphs = [fixture("vllm-agg-v1beta1.yaml"), fixture("vllm-disagg-v1alpha1.yaml")]
    listed = {"apiVersion": "v1", "kind": "List", "items": graphs}
    for text in (yaml.safe_dump(listed), json.dumps(listed), json.dumps(graphs[0], indent="\t")):
        found = inspect_file(text)
        assert [i.name for i in found] == [g["metadata"]["name"] for g in graphs][: len(found)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: v1\nkind: ConfigMap\n---\nkind: Secret\n",
         "no DynamoGraphDeployment in it (only ConfigMap, Secret)"),
        ("", "no DynamoGraphDeployment in it (no document)"),
        ("--- [1, 2]\n", "no DynamoGraphDeployment in it (no document)"),
        ("a: [", "not YAML or JSON"),
    ],
)  # fmt: skip
def test_a_file_without_a_graph_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        inspect_file(text)


def test_a_malformed_graph_among_several_is_named() -> None:
    broken = fixture("vllm-agg-v1beta1.yaml")
    del broken["spec"]
    text = yaml.safe_dump_all([fixture("vllm-disagg-v1alpha1.yaml"), broken])
    with pytest.raises(ValueError, match=r"^DynamoGraphDeployment 'qwen3-chat': spec: missing$"):
        inspect_file(text)
    with pytest.raises(ValueError, match=r"^spec: missing$"):  # alone, as inspect_dgd says it
        inspect_file(yaml.safe_dump(broken))


# ---------------------------------------------------------------------------------------------
# Malformed input names the path; optional fields are optional


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return mutate


_DELETE = object()
_MAIN: list[str | int] = ["spec", "components", 1, "podTemplate", "spec", "containers", 0]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set(["kind"], "Deployment"), "kind: expected DynamoGraphDeployment, got 'Deployment'"),
        (_set(["kind"], _DELETE), "kind: expected DynamoGraphDeployment, got None"),
        (_set(["apiVersion"], "nvidia.com/v2"), "apiVersion: expected nvidia.com/v1beta1 or"),
        (_set(["metadata"], _DELETE), "metadata: missing"),
        (_set(["metadata", "name"], _DELETE), "metadata.name: missing"),
        (_set(["metadata", "namespace"], 7), "metadata.namespace: expected a string, got int 7"),
        (_set(["spec"], _DELETE), "spec: missing"),
        (_set(["spec"], []), "spec: expected a mapping, got a list"),
        (_set(["spec", "components"], []), "spec.components: a DynamoGraphDeployment needs"),
        (_set(["spec", "components"], {"a": {}}), "spec.components: expected a list"),
        (_set(["spec", "components", 1], "worker"), "spec.components[1]: expected a mapping"),
        (_set(["spec", "components", 1, "name"], _DELETE), "spec.components[1].name: missing"),
        (_set(["spec", "components", 1, "type"], ["worker"]), "spec.components[1].type: "),
        (_set(["spec", "components", 1, "replicas"], "2"), "spec.components[1].replicas: "),
        (_set(["spec", "components", 1, "replicas"], -1), "spec.components[1].replicas: "),
        (_set(["spec", "components", 1, "replicas"], True), "spec.components[1].replicas: "),
        (_set(["spec", "components", 1, "multinode"], {"nodeCount": 0}),
         "spec.components[1].multinode.nodeCount: "),
        (_set(["spec", "components", 1, "podTemplate"], "x"),
         "spec.components[1].podTemplate: expected a mapping"),
        (_set(["spec", "components", 1, "podTemplate", "spec", "containers", 0, "name"], "engine"),
         "spec.components[1].podTemplate: no container named main"),
        (_set([*_MAIN, "args"], ["--tp", 2]),
         "spec.components[1].podTemplate.spec.containers[0].args[1]: expected a string"),
        (_set([*_MAIN, "command"], "python3 -m dynamo.vllm"),
         "spec.components[1].podTemplate.spec.containers[0].command: expected a list"),
        (_set([*_MAIN, "resources"], {"limits": {"nvidia.com/gpu": "two"}}),
         "containers[0].resources.limits.nvidia.com/gpu: expected a whole number"),
        (_set([*_MAIN, "env"], [{"value": "x"}]), "containers[0].env[0].name: missing"),
        (_set([*_MAIN, "command"], ["sh", "-c", "python3 -m dynamo.vllm --x 'open"]),
         "spec.components[1].podTemplate.spec.containers[0]: unterminated single quote"),
        (_set([*_MAIN, "command"], ["sh", "-c", 'python3 -m dynamo.vllm "open']),
         "containers[0]: unterminated double quote"),
        (_set([*_MAIN, "command"], ["sh", "-c", "python3 -m dynamo.vllm $(open"]),
         "containers[0]: unterminated substitution"),
        (_set(["spec", "backendFramework"], "tensorflow"),
         "spec.backendFramework: expected one of vllm, sglang, trtllm, got 'tensorflow'"),
    ],
)  # fmt: skip
def test_malformed_v1beta1_names_the_path(
    mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = v1beta1(component("fe", "frontend"), component(command=["python3", "-m", "dynamo.vllm"]))
    mutate(doc)
    with pytest.raises(ValueError, match=re.escape(message)):
        inspect_dgd(doc)


def test_a_component_list_must_hold_a_main_container() -> None:
    doc = v1beta1(component("a"), component("b"), component("c"))
    doc["spec"]["components"][2]["podTemplate"]["spec"]["containers"] = [{"name": "sidecar"}]
    with pytest.raises(ValueError) as raised:
        inspect_dgd(doc)
    assert str(raised.value) == "spec.components[2].podTemplate: no container named main"


@pytest.mark.parametrize(
    ("svc", "message"),
    [
        ("worker", "spec.services.W: expected a mapping, got str 'worker'"),
        ({"resources": {"limits": {"gpu": "x"}}}, "spec.services.W.resources.limits.gpu: "),
        ({"resources": {"limits": "1"}}, "spec.services.W.resources.limits: expected a mapping"),
        ({"extraPodSpec": {"mainContainer": []}}, "spec.services.W.extraPodSpec.mainContainer: "),
        ({"extraPodSpec": {"mainContainer": {"args": [1]}}},
         "spec.services.W.extraPodSpec.mainContainer.args[0]: expected a string"),
        ({"subComponentType": 1}, "spec.services.W.subComponentType: expected a string"),
        ({"multinode": {"nodeCount": "2"}}, "spec.services.W.multinode.nodeCount: "),
    ],
)  # fmt: skip
def test_malformed_v1alpha1_names_the_path(svc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        inspect_dgd(v1alpha1({"W": svc}))


@pytest.mark.parametrize(
    ("services", "message"),
    [(None, "spec.services: missing"), ({}, "spec.services: a DynamoGraphDeployment needs")],
)
def test_v1alpha1_needs_services(services: Any, message: str) -> None:
    doc = v1alpha1({})
    doc["spec"]["services"] = services
    with pytest.raises(ValueError, match=message):
        inspect_dgd(doc)


@pytest.mark.parametrize("not_a_dgd", [[], "text", None, 3])
def test_a_manifest_must_be_a_mapping(not_a_dgd: Any) -> None:
    with pytest.raises(ValueError, match="manifest: "):
        inspect_dgd(not_a_dgd)


def test_a_component_deployment_is_not_a_graph() -> None:
    dcd = fixture("vllm-agg-v1beta1.yaml") | {"kind": "DynamoComponentDeployment"}
    with pytest.raises(ValueError, match="kind: expected DynamoGraphDeployment"):
        inspect_dgd(dcd)


def test_optional_fields_may_be_missing() -> None:
    doc = {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "bare"},
        "spec": {"components": [{"name": "frontend", "type": "frontend"}, {"name": "w"}]},
    }
    found = inspect_dgd(doc)
    assert (found.namespace, found.backend, found.model) == (None, None, None)
    assert found.summary()["components"] == summary_of(
        ("frontend", "frontend", 1, 0, []), ("w", "unknown", 1, 0, [])
    )


def test_unknown_fields_are_ignored() -> None:
    doc = fixture("vllm-agg-v1beta1.yaml")
    doc["spec"]["somethingNew"] = {"x": 1}
    doc["spec"]["components"][1]["futureField"] = [1, 2]
    assert inspect_dgd(doc).summary() == EXPECTED["vllm-agg-v1beta1.yaml"]


def test_inspection_is_frozen() -> None:
    found = inspect_dgd(fixture("vllm-agg-v1beta1.yaml"))
    assert isinstance(found, Inspection) and found.api_version is ApiVersion.V1BETA1
    with pytest.raises(AttributeError):
        found.name = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        found.components[0].replicas = 5  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Ownership and loading


@pytest.mark.parametrize(
    ("metadata", "ours"),
    [
        ({"labels": {"wingsmith.dev/managed-by": "wingsmith"}}, True),
        ({"labels": {"wingsmith.dev/managed-by": "someone-else"}}, False),
        ({"labels": {"app.kubernetes.io/managed-by": "wingsmith"}}, False),
        ({"labels": None}, False),
        ({"labels": ["wingsmith.dev/managed-by"]}, False),
        ({}, False),
        (None, False),
    ],
)
def test_is_rendered_by_wingsmith(metadata: Any, ours: bool) -> None:
    doc = v1beta1(component())
    doc["metadata"] = metadata
    assert is_rendered_by_wingsmith(doc) is ours


def test_load_manifest_reads_yaml_and_json_alike() -> None:
    text = (DGD_FIXTURES / "vllm-disagg-v1alpha1.yaml").read_text()
    from_yaml = load_manifest(text)
    assert load_manifest(json.dumps(from_yaml)) == from_yaml
    assert load_manifest(json.dumps(from_yaml, indent="\t")) == from_yaml
    assert list(from_yaml["spec"]["services"]) == [
        "Frontend",
        "VllmDecodeWorker",
        "VllmPrefillWorker",
    ]


def test_load_manifest_takes_the_first_document() -> None:
    text = "# comment\n---\n---\nkind: First\n---\nkind: Second\n---\n: : not even yaml"
    assert load_manifest(text) == {"kind": "First"}
    assert load_manifest("{kind: Flow}") == {"kind": "Flow"}  # YAML flow style, not JSON


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no document found"),
        ("---\n# nothing\n", "no document found"),
        ("- a\n- b\n", "expected a mapping, got a list"),
        ("just text", "expected a mapping, got str"),
        ("[1, 2]", "expected a mapping, got a list"),
        ("kind: [unclosed", "not YAML or JSON"),
        ('{"kind": ', "not YAML or JSON"),
    ],
)
def test_load_manifest_refuses_what_is_not_a_manifest(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_manifest(text)


# ---------------------------------------------------------------------------------------------
# Properties

flag_lists = st.lists(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
    max_size=10,
)


# Kubernetes expands `$(NAME)` and `$$` in every form alike; flags here carry no `$`.
plain_flag_lists = st.lists(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00$"), max_size=12),
    max_size=10,
)


def _forms(flags: list[str]) -> dict[str, dict[str, Any]]:
    script = "python3 -m dynamo.sglang " + " ".join(shlex.quote(f) for f in flags)
    return {
        "module in command": {"command": ["python3", "-m", "dynamo.sglang"], "args": flags},
        "split": {"command": ["python3"], "args": ["-m", "dynamo.sglang", *flags]},
        "sh -c": {"command": ["/bin/sh", "-c"], "args": [script]},
        "sh -c, then more": {"command": ["/bin/sh", "-c"], "args": [script + " 2>&1 | tee l && x"]},
        "lone string": {"args": [script]},
    }


@given(plain_flag_lists)
def test_every_command_form_imports_the_same_args(flags: list[str]) -> None:
    for form, main in _forms(flags).items():
        found = only(v1beta1(component(**main)))
        assert (form, found.module, found.imported_args) == (form, "dynamo.sglang", tuple(flags))


@given(st.lists(st.lists(flag_lists.filter(bool), min_size=1, max_size=4), min_size=1, max_size=4))
def test_quoted_commands_split_where_the_operators_are(commands: list[list[list[str]]]) -> None:
    words = [[w for group in command for w in group] for command in commands]
    script = " && ".join(" ".join(shlex.quote(w) for w in command) for command in words)
    assert shell_commands(script) == words


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        children: Any = node.items()
    else:
        children = enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found += _paths(child, (*prefix, key))
    return found


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_BASES = [fixture(name) for name in sorted(EXPECTED)]


@given(st.sampled_from(_BASES), st.data())
def test_damaged_manifests_raise_only_value_error(
    base: dict[str, Any], data: st.DataObject
) -> None:
    doc = copy.deepcopy(base)
    path = data.draw(st.sampled_from(_paths(doc)))
    parent: Any = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = data.draw(json_values)
    with contextlib.suppress(ValueError):  # anything else escaping is a bug
        inspect_dgd(doc).summary()


def test_volume_and_mount_names_that_are_not_strings_are_passed_over() -> None:
    dgd = fixture("vllm-agg-v1beta1.yaml")
    pod = dgd["spec"]["components"][1]["podTemplate"]["spec"]
    pod["volumes"] = [{"name": ["x"], "configMap": {"name": "engine"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": {"a": 1}, "mountPath": "/config"}]
    assert inspect_dgd(dgd).summary()  # no TypeError: these are no engine config mounts
