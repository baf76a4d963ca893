"""`wingsmith operator manifests` and `wingsmith nats-config`: what installing Wingsmith on
Kubernetes needs, printed offline (deploy/kubernetes/, docs/operations.md).

The first prints the operator's kustomize overlay filled in for one cluster, for
`kubectl apply -f -`; the second the NATS servers' users for the clusters named, with every
password a reference to the servers' environment.
"""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from wingsmith.adapters.nats_auth import INSTALLED_USERS, installed_config, password_variable
from wingsmith.services.cli import overlays
from wingsmith.services.cli.shared import cluster_id

NATS_SCHEMES = {"nats", "tls", "ws", "wss"}


def operator_manifests(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster-id", required=True, type=cluster_id, metavar="ID")
    overlay = parser.add_mutually_exclusive_group()
    overlay.add_argument(
        "--read-only",
        action="store_true",
        help="the read-only overlay: no write rights at all, one replica with --read-only",
    )
    overlay.add_argument(
        "--adopt",
        action="store_true",
        help="the adopt overlay: also the rights to manage adopted graphs in any namespace",
    )
    parser.add_argument(
        "--nats-url",
        type=_nats_url,
        metavar="URL",
        help="where the operator reaches NATS, several comma-separated (default: the control "
        "plane installed in the cluster, as in deploy/kubernetes/operator/base/config.env)",
    )
    parser.add_argument(
        "--image",
        type=_image,
        metavar="IMAGE",
        help="the Wingsmith image, NAME[:TAG] or NAME@DIGEST (default: wingsmith:latest)",
    )
    parser.set_defaults(run=_operator_manifests)


async def _operator_manifests(args: argparse.Namespace) -> int:
    overlay = "read-only" if args.read_only else "adopt" if args.adopt else "base"
    config = {"WINGSMITH_CLUSTER_ID": args.cluster_id}
    if args.nats_url:
        config["WINGSMITH_NATS_URL"] = args.nats_url
    print(overlays.dump(overlays.operator(overlay, config, args.image)), end="")
    return 0


def _nats_url(text: str) -> str:
    for url in text.split(","):
        parts = urlsplit(url.strip())
        if parts.scheme not in NATS_SCHEMES or not parts.hostname:
            schemes = ", ".join(f"{s}://" for s in sorted(NATS_SCHEMES))
            raise argparse.ArgumentTypeError(f"{url!r}: a NATS URL ({schemes}) with a host")
    return text


def _image(text: str) -> dict[str, str]:
    """An image as kustomize's `images` entry takes it: `newName`, and `newTag` or `digest`."""
    if not text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r}: an image, NAME[:TAG] or NAME@DIGEST")
    name, tag, digest = overlays.image_parts(text)
    return (
        {"newName": name}
        | ({"newTag": tag} if tag else {})
        | ({"digest": digest} if digest else {})
    )


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
