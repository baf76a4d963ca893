"""What the long-running commands share: a cluster id read from the command line, a cluster's
pod defaults read from a file, and stopping cleanly on SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from wingsmith.domain.pods import PodNeeds
from wingsmith.domain.values import is_name
from wingsmith.services.operator.pods import parse_defaults


def cluster_id(text: str) -> str:
    """An argparse type: a cluster id is a DNS label."""
    if not is_name(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a cluster id is a DNS label (a-z, 0-9, -)")
    return text


def pod_defaults(path: str | None) -> PodNeeds | None:
    """A cluster's pod defaults from the file at `path`, checked before anything starts."""
    if path is None:
        return None
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"pod defaults {path}: {e.strerror or e}") from None
    return parse_defaults(text, path)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: long-running commands shut down cleanly on either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
