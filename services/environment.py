"""The environment variables Wingsmith reads, as one pydantic-settings model.

Each field names its variable; a variable that is unset or empty keeps the field's default, and
a bad value is refused with a message naming the variable and the value as it was given (never
a token's). `services.config.Settings.from_env` turns the result into its settings; this module
is imported only then, so a command line that needs no settings does not pay for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict

from wingsmith.adapters.nats_auth import PASSWORD_VARIABLE, USER_VARIABLE, credentials_from_env
from wingsmith.domain.commands import OBSERVATION_PREFIX
from wingsmith.domain.names import STREAMS

MIN_TOKEN = 16
TOKEN_NAME = re.compile(r"^[A-Za-z0-9][-_.A-Za-z0-9]{0,31}$")
_YES = {"1", "true", "yes", "on"}
_NO = {"0", "false", "no", "off"}
_SIZE = re.compile(r"^(WINGSMITH_[A-Z]+)=([0-9]+)([KMG]?)$")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _variable(info: ValidationInfo) -> str:
    assert info.field_name is not None
    return str(Environment.model_fields[info.field_name].validation_alias)


def _read(parse: Callable[[str, str], Any]) -> BeforeValidator:
    """A field read from its variable's text by `parse(variable, text)`."""
    return BeforeValidator(lambda text, info: parse(_variable(info), str(text)))


def _number_from(variable: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        value = low - 1  # refused below, with the same message as one out of range
    if not low <= value <= high:  # nan too
        raise ValueError(f"{variable} must be a number from {low:g} to {high:g}, not {text!r}")
    return value


def _number(low: float, high: float) -> BeforeValidator:
    return _read(lambda variable, text: _number_from(variable, text, low, high))


def _whole(least: int = 1) -> BeforeValidator:
    def parse(variable: str, text: str) -> int:
        if not text.isdigit() or int(text) < least:
            raise ValueError(f"{variable} must be a whole number of at least {least}, not {text!r}")
        return int(text)

    return _read(parse)


def _switch(default: bool) -> BeforeValidator:
    """Only a clear word for the other answer turns a switch (so a switch that is on stays on
    unless told 0, false, no or off)."""

    def parse(_: str, text: str) -> bool:
        word = text.strip().lower()
        return word not in _NO if default else word in _YES

    return _read(parse)


def _clear_switch(variable: str, text: str) -> bool:
    """A switch whose wrong guess is costly (read-only): only a clear word either way."""
    word = text.strip().lower()
    if word not in _YES | _NO:
        raise ValueError(
            f"{variable} must be true or false (1/0, yes/no, on/off), not {text!r}: "
            "an unclear value would leave the operator free to write"
        )
    return word in _YES


def _sweep(variable: str, text: str) -> float:
    """0 turns the sweep off (docs/nats-security.md says what that gives up); otherwise at
    least 0.1 s, so a sweep never runs back to back with the last."""
    seconds = _number_from(variable, text, 0, 3600)
    if 0 < seconds < 0.1:
        raise ValueError(f"{variable} must be 0 (off) or from 0.1 to 3600 seconds, not {seconds:g}")
    return seconds


def _replicas(variable: str, text: str) -> int:
    """An odd count, so a JetStream cluster keeps a quorum."""
    if text not in {"1", "3", "5"}:
        raise ValueError(f"{variable} must be 1, 3 or 5, not {text!r}")
    return int(text)


def host_port(variable: str, text: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets); `variable` names the setting in an error."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{variable} must be HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def _tokens(variable: str, text: str) -> dict[str, str]:
    """`name:token,name:token`: each bearer token with the name it stands for (the name goes
    into the ids of the commands it sends). An error never shows a token."""
    tokens: dict[str, str] = {}
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for number, entry in enumerate(entries, 1):
        name, _, token = entry.partition(":")
        if not TOKEN_NAME.match(name) or len(token) < MIN_TOKEN:
            raise ValueError(
                f"{variable}: entry {number} is not NAME:TOKEN (a name of letters, digits and "
                f"-_. up to 32; a token of at least {MIN_TOKEN} characters)"
            )
        if f"{name}:" == OBSERVATION_PREFIX:  # its commands' ids would be `obs:<uuid>`
            raise ValueError(f"{variable}: entry {number}: the name {name!r} is reserved")
        tokens[token] = name
    return tokens


def _stream_sizes(variable: str, text: str) -> dict[str, int]:
    """`WINGSMITH_EVENTS=16G,WINGSMITH_PROJ=4G`: each stream's size limit, in bytes. A name that
    is no stream's is refused: a misspelt one would otherwise leave its stream at the default."""
    sizes: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        found = _SIZE.match(entry)
        if found is None or int(found[2]) == 0:
            raise ValueError(
                f"{variable}: {entry!r} is not STREAM=SIZE "
                "(e.g. WINGSMITH_EVENTS=16G; K, M or G, or bytes)"
            )
        if found[1] not in STREAMS:
            raise ValueError(
                f"{variable}: {found[1]!r} is no stream; the streams are {', '.join(STREAMS)}"
            )
        sizes[found[1]] = int(found[2]) * _UNITS[found[3]]
    return sizes


def _text(_: str, text: str) -> str:
    return text


def _login(user: str, info: ValidationInfo) -> str:
    """The user, once it is clear that it comes with a password."""
    credentials_from_env({USER_VARIABLE: user, PASSWORD_VARIABLE: info.data["nats_password"]})
    return user


def _var(variable: str, default: Any) -> Any:
    return Field(default, validation_alias=variable)


class Environment(BaseSettings):
    """Every variable, in the order a bad one is reported in."""

    model_config = SettingsConfigDict(
        case_sensitive=True, extra="ignore", frozen=True, validate_default=False
    )

    observation_rate: Annotated[float, _number(1, 1_000_000)] = _var("WINGSMITH_OBS_RATE", 200.0)
    observation_burst: Annotated[float, _number(1, 10_000_000)] = _var(
        "WINGSMITH_OBS_BURST", 5000.0
    )
    stream_max_bytes: Annotated[dict[str, int], NoDecode, _read(_stream_sizes)] = _var(
        "WINGSMITH_STREAM_MAX_BYTES", {}
    )
    nats_url: Annotated[str | None, _read(_text)] = _var("WINGSMITH_NATS_URL", None)
    store_url: Annotated[str | None, _read(_text)] = _var("WINGSMITH_STORE", None)
    data_dir: Annotated[str | None, _read(_text)] = _var("WINGSMITH_DATA_DIR", None)
    max_command_bytes: Annotated[int, _whole(1024)] = _var("WINGSMITH_MAX_COMMAND_BYTES", 65536)
    # the concept document's name for the switch, and ours; either may be given, not both apart
    concept_read_only: Annotated[bool | None, _read(_clear_switch)] = _var(
        "HANGAR_OPERATOR_READ_ONLY", None
    )
    operator_read_only: Annotated[bool | None, _read(_clear_switch)] = _var(
        "WINGSMITH_OPERATOR_READ_ONLY", None
    )
    no_relay: Annotated[bool, _switch(False)] = _var("WINGSMITH_NO_RELAY", False)
    lease_seconds: Annotated[float, _number(1, 300)] = _var("WINGSMITH_LEASE_SECONDS", 5.0)
    projector: Annotated[bool, _switch(True)] = _var("WINGSMITH_PROJECTOR", True)
    admission: Annotated[bool, _switch(True)] = _var("WINGSMITH_ADMISSION", True)
    stream_replicas: Annotated[int, _read(_replicas)] = _var("WINGSMITH_STREAM_REPLICAS", 1)
    cluster_silence: Annotated[float, _number(1, 86_400)] = _var("WINGSMITH_CLUSTER_SILENCE", 30.0)
    placement_move_after: Annotated[float, _number(0.1, 86_400)] = _var(
        "WINGSMITH_PLACEMENT_MOVE_AFTER", 300.0
    )
    cluster_lost_after: Annotated[float, _number(0.1, 86_400)] = _var(
        "WINGSMITH_CLUSTER_LOST_AFTER", 600.0
    )
    rebalance_max_fraction: Annotated[float, _number(0, 1)] = _var(
        "WINGSMITH_REBALANCE_MAX_FRACTION", 0.25
    )
    intake_max_lag: Annotated[float, _number(0.01, 3_600)] = _var("WINGSMITH_INTAKE_MAX_LAG", 0.25)
    operator_sync_every: Annotated[float, _number(0.1, 86_400)] = _var(
        "WINGSMITH_OPERATOR_SYNC_EVERY", 60.0
    )
    operator_pod_defaults: Annotated[str | None, _read(_text)] = _var(
        "WINGSMITH_OPERATOR_POD_DEFAULTS", None
    )
    nats_password: Annotated[str, _read(_text)] = _var(PASSWORD_VARIABLE, "")
    nats_user: Annotated[str, BeforeValidator(_login)] = _var(USER_VARIABLE, "")  # after it
    operator_pod_selector: Annotated[str | None, _read(_text)] = _var(
        "WINGSMITH_OPERATOR_POD_SELECTOR", None
    )
    operator_leader_elect: Annotated[bool, _switch(False)] = _var(
        "WINGSMITH_OPERATOR_LEADER_ELECT", False
    )
    operator_lease_seconds: Annotated[float, _number(1, 3_600)] = _var(
        "WINGSMITH_OPERATOR_LEASE_SECONDS", 15.0
    )
    operator_node_agents: Annotated[bool, _switch(False)] = _var(
        "WINGSMITH_OPERATOR_NODE_AGENTS", False
    )
    node_name: Annotated[str | None, _read(_text)] = _var("WINGSMITH_NODE_NAME", None)
    operator_probes: Annotated[tuple[str, int] | None, NoDecode, _read(host_port)] = _var(
        "WINGSMITH_OPERATOR_PROBES", None
    )
    metrics_listen: Annotated[tuple[str, int] | None, NoDecode, _read(host_port)] = _var(
        "WINGSMITH_METRICS_LISTEN", None
    )
    projector_metrics_listen: Annotated[tuple[str, int] | None, NoDecode, _read(host_port)] = _var(
        "WINGSMITH_PROJECTOR_METRICS_LISTEN", None
    )
    api_listen: Annotated[tuple[str, int], NoDecode, _read(host_port)] = _var(
        "WINGSMITH_API_LISTEN", ("127.0.0.1", 8080)
    )
    api_tokens: Annotated[dict[str, str], NoDecode, _read(_tokens)] = _var(
        "WINGSMITH_API_TOKENS", {}
    )
    api_read_tokens: Annotated[dict[str, str], NoDecode, _read(_tokens)] = _var(
        "WINGSMITH_API_READ_TOKENS", {}
    )
    api_header_timeout: Annotated[float, _number(0.1, 3600)] = _var(
        "WINGSMITH_API_HEADER_TIMEOUT", 10.0
    )
    api_body_timeout: Annotated[float, _number(0.1, 3600)] = _var(
        "WINGSMITH_API_BODY_TIMEOUT", 15.0
    )
    api_max_connections: Annotated[int, _whole()] = _var("WINGSMITH_API_MAX_CONNECTIONS", 512)
    consumer_sweep: Annotated[float, _read(_sweep)] = _var("WINGSMITH_CONSUMER_SWEEP", 5.0)
    relay_lag: Annotated[int, _whole()] = _var("WINGSMITH_HEALTH_RELAY_LAG", 20_000)
    projector_lag: Annotated[int, _whole()] = _var("WINGSMITH_HEALTH_PROJECTOR_LAG", 20_000)
    scheduler_lag: Annotated[int, _whole()] = _var("WINGSMITH_HEALTH_SCHEDULER_LAG", 20_000)
    stall_seconds: Annotated[float, _number(1, 86_400)] = _var("WINGSMITH_HEALTH_STALL", 30.0)
    checkpoint_seconds: Annotated[float, _number(0.1, 86_400)] = _var(
        "WINGSMITH_CHECKPOINT_SECONDS", 10.0
    )
    views_duplicate_window: Annotated[float, _number(0.1, 86_400)] = _var(
        "WINGSMITH_VIEWS_DUPLICATE_WINDOW", 120.0
    )


class _Variables(EnvSettingsSource):
    """pydantic-settings' reading of environment variables, from a given mapping (a test's, or
    the process's own). An empty variable counts as unset."""

    def __init__(self, variables: Mapping[str, str]) -> None:
        self._variables = variables
        super().__init__(Environment)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name: text for name, text in self._variables.items() if text}


def read(variables: Mapping[str, str] | None = None) -> Environment:
    """The environment (by default the process's); a bad value raises ValueError with the
    message of the first bad variable, and nothing more (pydantic's report would show the
    value, which may be a token)."""
    found = _Variables(os.environ if variables is None else variables)()
    try:
        return Environment.model_validate(found)
    except ValidationError as e:
        first = e.errors()[0]
        error = first.get("ctx", {}).get("error")
        message = str(error) if isinstance(error, ValueError) else f"{first['loc']}: bad value"
        raise ValueError(message) from None
