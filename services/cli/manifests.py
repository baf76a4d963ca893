"""`wingsmith render` and `inspect-dgd`: DynamoGraphDeployment manifests, offline.

What the operator would apply for a render object, and what the graphs of a manifest file run;
neither needs a hub, NATS or Kubernetes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from wingsmith.services.cli.shared import pod_defaults
from wingsmith.services.operator import inspect
from wingsmith.services.operator.dgd import V1ALPHA1, V1BETA1, render_yaml
from wingsmith.services.operator.pods import with_defaults


def render(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a render object as published on wingsmith.render.>")
    parser.add_argument("--namespace", default="wingsmith")
    parser.add_argument("--api-version", choices=[V1BETA1, V1ALPHA1], default=V1BETA1)
    parser.add_argument("--pod-defaults", metavar="FILE", help="a cluster's pod defaults")
    parser.set_defaults(run=_render)


async def _render(args: argparse.Namespace) -> int:
    try:
        desired = orjson.loads(Path(args.file).read_bytes())  # noqa: ASYNC240 - the command runs alone
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{args.file}: not JSON: {e}") from None
    desired = with_defaults(desired, pod_defaults(args.pod_defaults))
    print(render_yaml(desired, namespace=args.namespace, api_version=args.api_version), end="")
    return 0


def inspect_dgd(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        help="a manifest file holding DynamoGraphDeployments (YAML or JSON; v1alpha1 or "
        "v1beta1), ConfigMaps and other objects beside them",
    )
    parser.set_defaults(run=_inspect_dgd)


async def _inspect_dgd(args: argparse.Namespace) -> int:
    """One graph prints its summary; several print a list of them, each named."""
    text = Path(args.file).read_text()  # noqa: ASYNC240 - the command runs alone
    try:
        inspections = inspect.inspect_file(text)
    except ValueError as e:
        raise ValueError(f"{args.file}: {e}") from None
    if len(inspections) == 1:
        printed: object = inspections[0].summary()
    else:
        printed = [{"namespace": i.namespace, "name": i.name} | i.summary() for i in inspections]
    print(orjson.dumps(printed, option=orjson.OPT_INDENT_2).decode())
    return 0
