"""Wingsmith: an event-sourced control plane for GPU inference fleets served with NVIDIA Dynamo."""

__version__ = "0.1.0"
