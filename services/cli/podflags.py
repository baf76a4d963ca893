"""The `workloads create|serving` flags for what a workload's pods need (domain/pods.py).

Each flag sets one field of the serving config's `pod`, over what the workload has (for
`serving`): `--env` and `--secret-env` by variable name, `--image-pull-secret`, `--toleration`
and `--node-affinity` as a whole list. Shapes beyond the flags (several affinity terms, a
toleration's seconds) go in a serving `--file`. The hub checks every value; these only split
the text.
"""

from __future__ import annotations

import argparse
from typing import Any

from wingsmith.domain.pods import RouterMode


def add_pod_flags(parser: argparse.ArgumentParser) -> None:
    pod = parser.add_argument_group("what the pods need (docs/commands.md#pod-needs)")
    pod.add_argument("--env", action="append", metavar="NAME=VALUE", help="repeatable")
    pod.add_argument(
        "--secret-env", action="append", metavar="NAME=SECRET:KEY", help="e.g. HF_TOKEN=hf:token"
    )
    pod.add_argument("--model-cache", metavar="CLAIM[:PATH]", help="a PVC; sets HF_HOME")
    pod.add_argument("--shared-memory", metavar="SIZE", help="/dev/shm of each worker, e.g. 16Gi")
    pod.add_argument("--cpu", metavar="QUANTITY", help="each worker's CPU request")
    pod.add_argument("--memory", metavar="QUANTITY", help="each worker's memory request")
    pod.add_argument("--ephemeral-storage", metavar="QUANTITY")
    pod.add_argument(
        "--toleration", action="append", metavar="KEY[=VALUE][:EFFECT]", help="repeatable"
    )
    pod.add_argument(
        "--node-affinity",
        action="append",
        metavar="KEY=V1[,V2]",
        help="nodes whose label KEY is one of the values; repeatable (all must hold)",
    )
    pod.add_argument("--image-pull-secret", action="append", metavar="NAME")
    pod.add_argument("--priority-class", metavar="NAME")
    pod.add_argument("--frontend-replicas", type=int, metavar="N")
    pod.add_argument("--router-mode", choices=[m.value for m in RouterMode])


_SIMPLE = ("shared_memory", "priority_class", "frontend_replicas", "router_mode")
_RESOURCES = ("cpu", "memory", "ephemeral_storage")


def pod_from(args: argparse.Namespace, current: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pod needs the flags give over `current` (None when neither says anything)."""
    pod = dict(current or {})
    for name in _SIMPLE:
        if getattr(args, name) is not None:
            pod[name] = getattr(args, name)
    resources = {n: getattr(args, n) for n in _RESOURCES if getattr(args, n) is not None}
    if resources:
        pod["resources"] = dict(pod.get("resources") or {}) | resources
    if args.env:
        pod["env"] = _by_name(pod.get("env"), [_env(text) for text in args.env])
    if args.secret_env:
        pod["secret_env"] = _by_name(
            pod.get("secret_env"), [_secret_env(text) for text in args.secret_env]
        )
    if args.model_cache:
        claim, _, path = args.model_cache.partition(":")
        pod["model_cache"] = {"claim": claim} | ({"mount_path": path} if path else {})
    if args.toleration:
        pod["tolerations"] = [_toleration(text) for text in args.toleration]
    if args.node_affinity:
        expressions = [_in(text) for text in args.node_affinity]
        pod["node_affinity"] = [{"match_expressions": expressions}]
    if args.image_pull_secret:
        pod["image_pull_secrets"] = list(args.image_pull_secret)
    return pod or None


def _by_name(current: Any, given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {item["name"] for item in given}
    return [item for item in current or () if item.get("name") not in names] + given


def _split(text: str, sep: str, flag: str, shape: str) -> tuple[str, str]:
    head, found, tail = text.partition(sep)
    if not found or not head:
        raise ValueError(f"{flag}: {text!r} is not {shape}")
    return head, tail


def _env(text: str) -> dict[str, Any]:
    name, value = _split(text, "=", "--env", "NAME=VALUE")
    return {"name": name, "value": value}


def _secret_env(text: str) -> dict[str, Any]:
    name, ref = _split(text, "=", "--secret-env", "NAME=SECRET:KEY")
    secret, key = _split(ref, ":", "--secret-env", "NAME=SECRET:KEY")
    return {"name": name, "secret": secret, "key": key}


def _toleration(text: str) -> dict[str, Any]:
    """`kubectl taint`'s spelling: `key=value:Effect`, `key:Effect` or `key` (any value)."""
    taint, _, effect = text.partition(":")
    key, equal, value = taint.partition("=")
    out: dict[str, Any] = {"key": key, "operator": "Equal" if equal else "Exists"}
    if equal:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def _in(text: str) -> dict[str, Any]:
    key, values = _split(text, "=", "--node-affinity", "KEY=V1[,V2]")
    return {"key": key, "operator": "In", "values": values.split(",")}
