"""The hub's reply to a command, and what the REST API answers while its views lag behind one.

The hub writes a reply for every command it is sent (services/hub/service.py); the REST API
(services/api/gateway.py, routes.py) and the hub's own senders read it. A reply is `Done`
(`ok: true`, with the handler's `Result`) or `Refused` (`ok: false`, with a `HubError`).
TypedDicts: a reply is made for every command, where a model would cost each one a
validation, and the JSON stays exactly as it is written.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict


class EventRef(TypedDict):
    """One event a command recorded."""

    aggregate: str
    id: str
    version: int
    type: str


class Result(TypedDict):
    """What the command did: its events, and what its handler says of the aggregate it
    changed (services/hub/handlers.py: which keys depends on the command)."""

    command_id: str
    events: list[EventRef]  # none: it changed nothing (a resend, or nothing to do)
    # a workload's
    workload_id: NotRequired[str]  # the incarnation's id
    name: NotRequired[str]  # what its views are kept under and commands address
    incarnation: NotRequired[int]
    replicas: NotRequired[int]
    serving_digest: NotRequired[str]
    deployments: NotRequired[list[str]]
    deleted: NotRequired[bool]
    shares: NotRequired[dict[str, int]]
    # a cluster's
    cluster_id: NotRequired[str]
    reachable: NotRequired[bool]
    devices: NotRequired[dict[str, int]]
    # a project's
    project: NotRequired[str]
    quota: NotRequired[dict[str, int]]
    # a deployment's
    deployment_id: NotRequired[str]
    desired_replicas: NotRequired[int]
    enabled: NotRequired[bool]
    authority: NotRequired[str]
    generation: NotRequired[int]
    engine_args: NotRequired[list[str]]
    admission_phase: NotRequired[str]
    granted_devices: NotRequired[int]
    # a replica's, and a cluster's report of a deployment's replicas
    replica_id: NotRequired[str]
    terminated: NotRequired[list[str]]
    recorded: NotRequired[list[str]]
    skipped: NotRequired[dict[str, str]]  # replica name -> why it was not recorded
    # a discovery's
    discovery_id: NotRequired[str]
    state: NotRequired[str]


class Done(TypedDict):
    """The command is stored (or was before: `duplicate`). `position`: where its last event
    is in the store; absent when it recorded none, or the hub no longer knows."""

    ok: Literal[True]
    result: Result
    duplicate: NotRequired[Literal[True]]
    position: NotRequired[int]


class HubError(TypedDict):
    """Why the hub refused: a code (services/api/problems.py maps each to an HTTP status), a
    sentence, and details such as `field`, `errors` or `retry_after_ms`."""

    code: str
    message: str
    details: dict[str, Any]


class Refused(TypedDict):
    """Nothing was stored."""

    ok: Literal[False]
    error: HubError


Reply = Done | Refused


class Accepted(TypedDict):
    """The REST API's `202`: the hub stored the command, but the views did not show it in
    time (or cannot say), so the resource is not shown; its result is."""

    result: Result
    consistent: Literal[False]
