"""Every name Wingsmith gives on NATS: subjects, streams, KV buckets, consumers and inboxes.

They are the contract between the hub, the operators, the REST API, the command line and the
server's permissions (adapters/nats_auth.py), so each is spelled here once and everyone builds
from it. Values that become tokens of a subject are encoded by `domain.subjects`; the cluster ids
taken here are DNS labels already (nats_auth checks them where a permission depends on it).
Environment variables are not here: they are settings (services/config.py).
"""

from __future__ import annotations

ACCOUNT = "WINGSMITH"  # the one account every user of the server is in

# -- subjects ---------------------------------------------------------------------------------

COMMANDS = "wingsmith.cmd"  # .<aggregate>.<verb>: a command for the hub, answered by reply
EVENTS = "wingsmith.evt"  # .<aggregate>.<id>.<EventType>: the stored history, in store order
RENDER = "wingsmith.render"  # .<cluster>.<deployment>: render object, for that cluster's operator
OBSERVATIONS = "wingsmith.obs"  # .<cluster>.<kind>: what an operator reports
VIEWS = "wingsmith.proj"  # .<projection>.<key>: each change of a view
DEAD = "wingsmith.dead"  # .<component>: what a component set aside, with the reason
SIMULATED = "wingsmith.sim"  # .<cluster>.fault: faults asked of a simulated cluster

HEALTH_SUBJECT = f"{COMMANDS}.hub.health"  # under the commands: every client role may ask
HEARTBEAT = "heartbeat"  # the kind of observation every operator sends every few seconds
NODE_DEVICES = "devices"  # .<node>: what a node agent read from its kubelet, for the operator


def every(prefix: str) -> str:
    """The wildcard subject of everything under `prefix`."""
    return f"{prefix}.>"


def command_subject(verb: str) -> str:
    """`wingsmith.cmd.<verb>`, the verb being `<aggregate>.<verb>` (`project.set_quota`)."""
    return f"{COMMANDS}.{verb}"


def observation_subject(cluster_id: str, kind: str) -> str:
    return f"{OBSERVATIONS}.{cluster_id}.{kind}"


def node_devices_subject(cluster_id: str, node_token: str) -> str:
    """`wingsmith.obs.<cluster>.devices.<node>`: a node agent's report, the node's name made
    one token (`domain.subjects.token`)."""
    return observation_subject(cluster_id, f"{NODE_DEVICES}.{node_token}")


def render_filter(cluster_id: str) -> str:
    """Every render object of one cluster."""
    return f"{RENDER}.{cluster_id}.>"


def view_prefix(projection: str) -> str:
    return f"{VIEWS}.{projection}"


def dead_subject(component: str) -> str:
    return f"{DEAD}.{component}"


def fault_subject(cluster_id: str) -> str:
    return f"{SIMULATED}.{cluster_id}.fault"


# -- streams ----------------------------------------------------------------------------------

EVENTS_STREAM = "WINGSMITH_EVENTS"
RENDER_STREAM = "WINGSMITH_RENDER"
OBS_STREAM = "WINGSMITH_OBS"
VIEWS_STREAM = "WINGSMITH_PROJ"
DEAD_STREAM = "WINGSMITH_DEAD"
STREAMS = (EVENTS_STREAM, RENDER_STREAM, OBS_STREAM, VIEWS_STREAM, DEAD_STREAM)

# -- KV buckets (each kept by the server on the stream `KV_<bucket>`) ------------------------

BUCKET_PREFIX = "wingsmith_"
PROGRESS_BUCKET = f"{BUCKET_PREFIX}projector"  # the projector's progress, under PROGRESS_KEY
PROGRESS_KEY = "position"
LEASE_BUCKET = (
    f"{BUCKET_PREFIX}lease"  # which hub runs the one-per-store roles (docs/operations.md)
)
KV_STREAM_PREFIX = "KV_"


def view_bucket(projection: str) -> str:
    """The bucket holding each key's latest view of a projection."""
    return f"{BUCKET_PREFIX}{projection}"


def bucket_stream(bucket: str) -> str:
    return f"{KV_STREAM_PREFIX}{bucket}"


# -- consumers, queue groups and inboxes ------------------------------------------------------

HUB_CONSUMER = "wingsmith-hub"  # the hub's durable consumer on WINGSMITH_OBS
HUB_QUEUE = "wingsmith-hub"  # the queue group all hubs take commands in
INBOX = "_INBOX"  # nats-py's default inbox prefix


def operator_consumer(cluster_id: str) -> str:
    """The durable consumer on WINGSMITH_RENDER through which a cluster's operator reads."""
    return f"operator-{cluster_id}"


def operator_user(cluster_id: str) -> str:
    """The user a cluster's operator logs in as."""
    return f"operator-{cluster_id}"


def own_inbox(owner: str) -> str:
    """`_INBOX_<owner>`: an inbox prefix only that user (or operator) may subscribe under."""
    return f"{INBOX}_{owner}"
