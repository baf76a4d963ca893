"""OpenTelemetry traces, off unless configured: one trace follows a command from the client that
sends it, through the hub's group commit, the relay and the scheduler, to the cluster's operator
and back with its report.

Off (the default), nothing of OpenTelemetry is even imported and every call here is a branch on
one flag, so the command path pays nothing for it. On, the W3C `traceparent` of the span that
sends a message travels in the message's NATS headers, and the receiving side continues it.
Inside the hub a command's span context is remembered by command id (and the first command of a
correlation id under that id), for the events it recorded and the decisions they led to, which
are handled later and elsewhere in the process (`of_command`).
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

REMEMBERED = 50_000  # command ids whose span context is kept (the most recent ones)
EXPORTERS = ("otlp", "console")

_tracer: Tracer | None = None  # None: tracing is off
_provider: TracerProvider | None = None
_commands: OrderedDict[str, Context] = OrderedDict()


def enabled() -> bool:
    return _tracer is not None


def wanted(env: Mapping[str, str]) -> str | None:
    """The exporter the standard OTEL_* variables ask for, or None: tracing stays off unless an
    OTLP endpoint or OTEL_TRACES_EXPORTER names one (OTEL_SDK_DISABLED=true turns it off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return "otlp" if endpoint else None
    if exporter == "none":
        return None
    if exporter not in EXPORTERS:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER: {exporter!r} is not supported; use one of "
            f"{', '.join(EXPORTERS)} or none"
        )
    return exporter


def configure_from_env(service: str, env: Mapping[str, str] | None = None) -> bool:
    """Export spans as the OTEL_* variables say (OTEL_SERVICE_NAME, else `service`, names the
    process); whether tracing is on."""
    env = os.environ if env is None else env
    exporter = wanted(env)
    if exporter is None:
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        chosen: Any = OTLPSpanExporter()  # endpoint, headers, timeout: from OTEL_EXPORTER_OTLP_*
    else:
        chosen = ConsoleSpanExporter()
    named = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(chosen))
    trace.set_tracer_provider(provider)  # for libraries that trace too
    configure(provider)
    return True


def configure(provider: TracerProvider | None) -> None:
    """Trace with `provider` from now on (None: stop tracing)."""
    global _tracer, _provider
    _commands.clear()
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer("wingsmith")


def shutdown() -> None:
    """Export what is still buffered; tracing is off afterwards."""
    provider = _provider
    configure(None)
    if provider is not None:
        provider.shutdown()


@contextlib.contextmanager
def span(
    name: str,
    parent: Context | None = None,
    links: Sequence[Context] = (),
    **attributes: Any,
) -> Iterator[Span | None]:
    """A span around the block, current inside it; a child of `parent` (else of the current
    span), linked to the spans of `links`. None, and nothing recorded, when tracing is off."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(
        name, context=parent, links=_links(links), attributes=_attributes(attributes)
    ) as s:
        yield s


def start(name: str, parent: Context | None = None, **attributes: Any) -> Span | None:
    """A span that ends later (`end`), not made current; None when tracing is off."""
    if _tracer is None:
        return None
    return _tracer.start_span(name, context=parent, attributes=_attributes(attributes))


def end(s: Span | None, **attributes: Any) -> None:
    if s is not None:
        s.set_attributes(_attributes(attributes))
        s.end()


def context_of(s: Span | None) -> Context | None:
    """A context whose current span is `s`: a parent for spans started elsewhere."""
    if s is None:
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(s)


def current() -> Context | None:
    """The current context when it has a span (None when tracing is off)."""
    if _tracer is None:
        return None
    from opentelemetry import context, trace

    return context.get_current() if trace.get_current_span().get_span_context().is_valid else None


def inject(headers: dict[str, str], parent: Context | None = None) -> dict[str, str]:
    """Add the `traceparent` of `parent` (else of the current span) to message headers."""
    if _tracer is not None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        TraceContextTextMapPropagator().inject(headers, context=parent)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The context a message's `traceparent` carries, if any."""
    if _tracer is None or not headers or "traceparent" not in headers:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(headers)


@contextlib.contextmanager
def continued(headers: Mapping[str, str] | None) -> Iterator[None]:
    """The context a message's headers carry, current inside the block."""
    extracted = extract(headers)
    if extracted is None:
        yield
        return
    from opentelemetry import context

    token = context.attach(extracted)
    try:
        yield
    finally:
        context.detach(token)


def remember(command_id: str, s: Span | None, correlation_id: str | None = None) -> None:
    """Keep a command's span context (and, if it is the first of its correlation id that this
    process sees, under that id too) for what its events lead to."""
    if s is None:
        return
    traced = context_of(s)
    assert traced is not None
    _commands[command_id] = traced
    if correlation_id and correlation_id != command_id:
        _commands.setdefault(correlation_id, traced)
    while len(_commands) > REMEMBERED:
        _commands.popitem(last=False)


def of_command(command_id: str | None) -> Context | None:
    """The span context remembered for a command id (or a correlation id)."""
    return _commands.get(command_id) if command_id and _tracer is not None else None


def trace_id(s: Span | None = None) -> str | None:
    """The hex trace id of `s` (else of the current span), for a log line."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = (s or trace.get_current_span()).get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def _links(contexts: Sequence[Context]) -> list[Any]:
    from opentelemetry import trace

    spans = (trace.get_current_span(c).get_span_context() for c in contexts)
    return [trace.Link(s) for s in spans if s.is_valid]


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry's attribute values: no None."""
    return {f"wingsmith.{k}": v for k, v in attributes.items() if v is not None}
