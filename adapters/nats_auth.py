"""Who may say what on NATS: the nats-server configuration that makes the server itself enforce
that an operator publishes only its own cluster's observations and reads only its own cluster's
render objects, whatever its code does.

Everything lives in one account, `WINGSMITH`, because the operators read the hub's streams:
JetStream across accounts would need exports and imports of API subjects per consumer, while
per-user permissions in one account express the same rules directly. The hub is the trusted
control plane and may do anything in the account. Each operator gets an allow list: its own
observation subjects, the JetStream API subjects of its own durable consumer on the render stream
(and nothing that reads a stream any other way), and its own inbox prefix. Clients (the command
line, the REST API, viewers) get the reading API, and the command subjects if they send commands;
each user receives its replies under an inbox prefix only it may subscribe to.

Durable consumers are what a reader must never touch: the hub's on the observation stream and
each operator's on the render stream hold positions and filters the control plane depends on.
JetStream creates *or updates* a consumer named in the request body of
`$JS.API.CONSUMER.CREATE.<stream>`, and permissions see only subjects, so clients may create
consumers only through the form whose subject carries the consumer's name and filter
(`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`; the server refuses a body naming another
consumer or another filter), and every durable name of the configuration is denied there.

Pure: it only produces text, so a test can start a real server with it and production can write
the same text into its configuration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from wingsmith.domain import names
from wingsmith.domain.names import ACCOUNT, HUB_CONSUMER, RENDER_STREAM

JS_API = "$JS.API"

# A DNS label, as domain.values.Name: a cluster id is a single subject token with no wildcard,
# which is what makes the permissions below exact.
_CLUSTER_ID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# nats-server reads the configuration's strings itself; these would end or bend one.
_UNSAFE_SECRET = re.compile(r'["\\\x00-\x1f\x7f]')
_REFERENCE = re.compile(r"^\$[A-Za-z_][A-Za-z0-9_]*$")
_USER_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_cluster_id(cluster_id: str) -> str:
    if len(cluster_id) > 63 or not _CLUSTER_ID.match(cluster_id):
        raise ValueError(f"not a cluster id (a DNS label): {cluster_id!r}")
    return cluster_id


def operator_user(cluster_id: str) -> str:
    return names.operator_user(check_cluster_id(cluster_id))


def operator_consumer(cluster_id: str) -> str:
    """The durable consumer on WINGSMITH_RENDER through which a cluster's operator reads."""
    return names.operator_consumer(check_cluster_id(cluster_id))


def operator_inbox_prefix(cluster_id: str) -> str:
    """The operator's own inbox prefix: replies to it (JetStream API answers, publish acks,
    fetched messages) go under it, and only it may subscribe there."""
    return names.own_inbox(check_cluster_id(cluster_id))


def user_inbox_prefix(user: str) -> str:
    """A client's own inbox prefix, `_INBOX_<user>`: its replies (API answers, the messages its
    ordered consumers deliver) go under it and only that user may subscribe there, so no other
    user can read them, nor learn the names of its consumers from their acknowledgement
    subjects. The user name becomes a subject token, hence the check."""
    if not _USER_TOKEN.match(user):
        raise ValueError(f"user {user!r}: only letters, digits, `-` and `_` may name a user")
    return names.own_inbox(user)


def render_filter(cluster_id: str) -> str:
    return names.render_filter(check_cluster_id(cluster_id))


@dataclass(frozen=True, slots=True)
class Permissions:
    """Subjects a user may publish and subscribe to; anything not allowed is refused, and so is
    anything in `deny_publish` even where an allowed wildcard matches it."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()


def durable_consumers(cluster_ids: Iterable[str]) -> tuple[str, ...]:
    """The names of every durable consumer the control plane keeps: the hub's on the
    observation stream, and one per operator on the render stream."""
    return (HUB_CONSUMER, *sorted(map(operator_consumer, cluster_ids)))


def operator_permissions(cluster_id: str) -> Permissions:
    """Exactly what an operator needs, and so the only ways it has to reach the server.

    Reading: the consumer is created through the API subject that names its filter; the server
    refuses a request whose body's filter differs from the one in the subject, so the operator
    can create its consumer only with its own filter. No stream info, message get or direct get,
    no other consumer's name: those would read (or list) other clusters' subjects.
    Writing: its own observation subjects, through JetStream (the acks come to its inbox).
    Its node agents log in as it, and publish on its observation subjects too; it hears them
    there (`wingsmith.obs.<cluster>.devices.<node>`), and no other cluster's."""
    stream, consumer = RENDER_STREAM, operator_consumer(cluster_id)
    api = f"$JS.API.CONSUMER.{{}}.{stream}.{consumer}"
    return Permissions(
        publish=(
            names.observation_subject(cluster_id, ">"),
            f"{api.format('CREATE')}.{render_filter(cluster_id)}",
            api.format("INFO"),
            api.format("DELETE"),
            api.format("MSG.NEXT"),
            f"$JS.ACK.{stream}.{consumer}.>",
        ),
        subscribe=(
            f"{operator_inbox_prefix(cluster_id)}.>",
            names.node_devices_subject(cluster_id, "*"),  # its node agents' reports
        ),
    )


def client_permissions(
    user: str, *, commands: bool, durables: Iterable[str] = (HUB_CONSUMER,)
) -> Permissions:
    """A person's command line, the REST API or a viewer: reads events, views and the render and
    observation streams (stream info, message gets, KV gets, and the ordered consumers
    `nats_bus.read_stream` reads with); sends commands only if `commands`. It writes to no
    stream and deletes nothing. It receives its replies under its own inbox prefix.

    Its consumers are created through the subject naming the consumer and its filter, the one
    form permissions can tell apart by name: the unnamed form (`CONSUMER.CREATE.<stream>`)
    would update any consumer its body names, and the older `CONSUMER.DURABLE.CREATE` form
    always makes a durable one. Every name in `durables` is denied there, so no client can
    create over, re-filter or redirect the hub's or an operator's consumer, nor pull from,
    acknowledge for or delete one."""
    publish = [
        f"{JS_API}.STREAM.INFO.*",
        f"{JS_API}.STREAM.MSG.GET.*",
        f"{JS_API}.DIRECT.GET.>",
        f"{JS_API}.CONSUMER.CREATE.*.*.>",  # `<stream>.<name>.<filter>`: named and filtered
        f"{JS_API}.CONSUMER.INFO.*.*",  # whether a reader's own consumer has anything to read
        "$JS.FC.>",  # flow control replies of the ordered consumers
    ]
    if commands:
        publish.append(names.every(names.COMMANDS))
    deny = [f"{JS_API}.CONSUMER.CREATE.*.{name}.>" for name in durables]
    inbox = f"{user_inbox_prefix(user)}.>"
    return Permissions(publish=tuple(publish), subscribe=(inbox,), deny_publish=tuple(deny))


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user's name and password. The password is one of: plain text (tests, laptops); a
    bcrypt hash as `nats server passwd` prints it (`$2a$11$...`), which the server recognises
    by its prefix; or `$NAME`, a reference the server resolves from its own environment when it
    starts, so the configuration itself holds no secret."""

    user: str
    password: str


USER_VARIABLE = "WINGSMITH_NATS_USER"
PASSWORD_VARIABLE = "WINGSMITH_NATS_PASSWORD"


def credentials_from_env(env: Mapping[str, str]) -> Credentials | None:
    """How every process (hub, operator, command line) is given its NATS login: the user in
    WINGSMITH_NATS_USER and its plain password in WINGSMITH_NATS_PASSWORD. None when no user is
    set: a server without users (the embedded one) needs none."""
    user = env.get(USER_VARIABLE, "").strip()
    if not user:
        return None
    password = env.get(PASSWORD_VARIABLE, "")
    if not password:
        raise ValueError(f"{USER_VARIABLE} is set but {PASSWORD_VARIABLE} is empty")
    return Credentials(user, password)


def _quote(text: str) -> str:
    return json.dumps(text)


def _secret(password: str) -> str:
    # Unquoted, `$NAME` is a variable reference; quoted, a bcrypt hash stays a literal string.
    return password if _REFERENCE.match(password) else _quote(password)


def _subject_list(kind: str, subjects: Iterable[str]) -> list[str]:
    quoted = [f"             {_quote(subject)}" for subject in subjects]
    return [f"           {kind}: [", *quoted, "           ]"]


def _user_block(credentials: Credentials, permissions: Permissions | None) -> str:
    if _UNSAFE_SECRET.search(credentials.password) or _UNSAFE_SECRET.search(credentials.user):
        raise ValueError(f"user {credentials.user!r}: quotes, backslashes or control characters")
    lines = [f"      {{user: {_quote(credentials.user)}, password: {_secret(credentials.password)}"]
    if permissions is not None:
        lines.append("       permissions: {")
        for verb, allow, deny in [
            ("publish", permissions.publish, permissions.deny_publish),
            ("subscribe", permissions.subscribe, ()),
        ]:
            lines.append(f"         {verb}: {{")
            lines += _subject_list("allow", allow)
            lines += _subject_list("deny", deny) if deny else []
            lines.append("         }")
        lines.append("       }")
    lines[-1] += "}"
    return "\n".join(lines)


def server_config(
    hub: Credentials,
    operators: Mapping[str, str],
    *,
    client: Credentials | None = None,
    api: Credentials | None = None,
    viewer: Credentials | None = None,
) -> str:
    """The `accounts` block of a nats-server configuration.

    `operators` maps each cluster id to its operator's password (plain or bcrypt); the user is
    `operator-<cluster id>`. `client` (the command line) and `api` (the REST API) may send
    commands and read; `viewer` may only read. None of them may touch a durable consumer."""
    users = [_user_block(hub, None)]
    for cluster_id, password in sorted(operators.items()):
        users.append(
            _user_block(
                Credentials(operator_user(cluster_id), password), operator_permissions(cluster_id)
            )
        )
    durables = durable_consumers(operators)
    for credentials, commands in [(client, True), (api, True), (viewer, False)]:
        if credentials is not None:
            permissions = client_permissions(credentials.user, commands=commands, durables=durables)
            users.append(_user_block(credentials, permissions))
    clients = [c.user for c in (client, api, viewer) if c]
    everyone = [hub.user, *map(operator_user, operators), *clients]
    if len(set(everyone)) != len(everyone):
        raise ValueError(f"user names must differ: {everyone}")
    return "\n".join(
        [
            "accounts {",
            f"  {ACCOUNT} {{",
            "    jetstream: enabled",
            "    users: [",
            *users,
            "    ]",
            "  }",
            "}",
            "",
        ]
    )


# The users of an installation beside its operators: the hub, the REST API, people's command line.
INSTALLED_USERS = ("hub", "api", "cli")


def password_variable(user: str) -> str:
    """The environment variable a server reads `user`'s password from in `installed_config`:
    `NATS_PASSWORD_` and the user in upper case, `-` as `_` (`NATS_PASSWORD_OPERATOR_EAST`).
    deploy/kubernetes/control-plane/secrets/generate.sh names its keys the same way."""
    user_inbox_prefix(user)  # a token: letters, digits, `-` and `_`
    return "NATS_PASSWORD_" + user.upper().replace("-", "_")


def installed_config(cluster_ids: Iterable[str]) -> str:
    """The configuration of an installation (deploy/kubernetes/control-plane): the users of
    `INSTALLED_USERS` and an operator per cluster, each password a `$NATS_PASSWORD_…`
    reference that the server resolves from its environment, so the file holds no secret."""

    def login(user: str) -> Credentials:
        return Credentials(user, f"${password_variable(user)}")

    hub, api, cli = map(login, INSTALLED_USERS)
    operators = {c: login(operator_user(c)).password for c in cluster_ids}
    return server_config(hub, operators, client=cli, api=api)
