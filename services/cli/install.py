"""`wingsmith nats-config`: what installing Wingsmith on Kubernetes needs, printed offline
(deploy/kubernetes/, docs/operations.md): the NATS servers' users for the clusters named, with
every password a reference to the servers' environment.
"""

from __future__ import annotations

import argparse

from wingsmith.adapters.nats_auth import INSTALLED_USERS, installed_config, password_variable
from wingsmith.services.cli.shared import cluster_id


def nats_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster",
        action="append",
        default=[],
        type=cluster_id,
        metavar="ID",
        help="a cluster whose operator logs in (as operator-ID); repeatable",
    )
    parser.set_defaults(run=_nats_config)


async def _nats_config(args: argparse.Namespace) -> int:
    clusters = sorted(set(args.cluster))
    command = " ".join(["wingsmith nats-config", *(f"--cluster {c}" for c in clusters)])
    operators = ", ".join(f"operator-{c}" for c in clusters) or "no operator yet"
    print(f"# Written by `{command}`: users {', '.join(INSTALLED_USERS)}, {operators}.")
    print(f"# Passwords come from the servers' environment: {password_variable('hub')}, ….")
    print(installed_config(clusters), end="")
    return 0
