"""Logs: lines for a person on a terminal, JSON objects for a log pipeline.

`--log-format` (or WINGSMITH_LOG_FORMAT) chooses: `text`, `json`, or `auto`, the default: text
when stderr is a terminal, JSON otherwise (a container, a service manager, a pipe), which is
where a log pipeline collects them. A JSON line carries the time, level, logger, message and
exception, the trace id when tracing is on, and what the code handling it knows of the work at
hand: the command id, correlation id, aggregate and cluster (`context`), set where a command is
handled, where the scheduler decides and where an operator acts.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TextIO

import orjson

from wingsmith.adapters import tracing

FORMATS = ("auto", "text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS = ("command_id", "correlation_id", "aggregate", "aggregate_id", "cluster_id")

_context: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "wingsmith_log_context", default=MappingProxyType({})
)


@contextlib.contextmanager
def context(**fields: str | None) -> Iterator[None]:
    """What the block works on (FIELDS), added to every JSON log line it writes."""
    token = _context.set(_added(fields))
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: str | None) -> None:
    """Add `fields` to every line the current task writes from now on, and to the lines of the
    tasks it starts after this (each task has its own copy)."""
    _context.set(_added(fields))


def _added(fields: Mapping[str, str | None]) -> Mapping[str, str]:
    return {**_context.get(), **{k: v for k, v in fields.items() if v}}


def fields() -> Mapping[str, str]:
    return _context.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        line |= _context.get()
        if (trace_id := tracing.trace_id()) is not None:
            line["trace_id"] = trace_id
        return orjson.dumps(line, default=str).decode()


def chosen(format: str, stream: TextIO) -> str:
    """`text` or `json`: what `format` means for this stream."""
    if format not in FORMATS:
        raise ValueError(
            f"--log-format (WINGSMITH_LOG_FORMAT): {format!r} is not one of {', '.join(FORMATS)}"
        )
    if format == "auto":
        return "text" if stream.isatty() else "json"
    return format


def configure(format: str, level: int, stream: TextIO | None = None) -> None:
    """Log to stderr at `level`, in `format` (FORMATS)."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    json = chosen(format, stream) == "json"
    handler.setFormatter(JsonFormatter() if json else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
