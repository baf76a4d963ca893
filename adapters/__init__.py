"""The only code that talks to the outside: NATS, Kubernetes, the event store, nats-server."""
