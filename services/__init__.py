"""Command handlers, the hub's command service, the relay, the CLI and the wiring."""
