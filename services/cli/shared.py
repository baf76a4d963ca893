"""What the long-running commands share: a cluster id read from the command line, and stopping
cleanly on SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal

from wingsmith.domain.values import is_name


def cluster_id(text: str) -> str:
    """An argparse type: a cluster id is a DNS label."""
    if not is_name(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a cluster id is a DNS label (a-z, 0-9, -)")
    return text


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: long-running commands shut down cleanly on either."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
