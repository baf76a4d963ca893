"""What the command line prints: aligned tables and progress bars (on stderr)."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; None shows as `-`."""
    cells = [[str(h) for h in headers]] + [
        ["-" if value is None else str(value) for value in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


class Progress:
    """A progress bar on stderr; a line per tenth (or per new note) when stderr is not a
    terminal."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, max(total, 1)
        self.started = time.monotonic()
        self._tty = sys.stderr.isatty()
        self._shown: tuple[int, str] = (-1, "")

    def update(self, done: int, note: str = "") -> None:
        fraction = min(done / self.total, 1.0)
        rate = done / max(time.monotonic() - self.started, 1e-9)
        counts = f"{done:,}/{self.total:,}"
        detail = note or f"{rate:,.0f}/s"
        if self._tty:
            bar = "#" * int(fraction * 30)
            line = f"{self.label} [{bar:30}] {fraction:4.0%} {counts} {detail}"
            width = shutil.get_terminal_size().columns - 1  # a wrapped line would not be redrawn
            sys.stderr.write(f"\r{line[:width]}\033[K")
        elif (int(fraction * 10), note) != self._shown:
            self._shown = (int(fraction * 10), note)
            sys.stderr.write(f"{self.label}: {fraction:.0%} ({counts}, {detail})\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._tty:
            sys.stderr.write("\n")
