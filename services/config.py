"""Settings from the environment, with defaults that run on a laptop."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from wingsmith.adapters import nats_bus
from wingsmith.adapters.nats_auth import Credentials, credentials_from_env
from wingsmith.domain.commands import OBSERVATION_PREFIX

_YES = {"1", "true", "yes", "on"}
_NO = {"0", "false", "no", "off"}


def _flag(env: dict[str, str], variable: str, default: bool = False) -> bool:
    """A switch: unset keeps its default, and only a clear word for the other answer turns it
    (so a switch that is on stays on unless told 0, false, no or off)."""
    text = (env.get(variable) or "").strip().lower()
    return text not in _NO if default else text in _YES


MIN_TOKEN = 16
API_TOKEN_FILE = "api.token"  # in the data directory: the token `wingsmith up` made
API_URL_FILE = "api.url"  # where `wingsmith up` serves the API, for the CLI


def data_dir_from(env: dict[str, str]) -> Path:
    return Path(env.get("WINGSMITH_DATA_DIR") or ".wingsmith").resolve()


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"WINGSMITH_API_LISTEN must be HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def _number(env: dict[str, str], variable: str, default: float, low: float, high: float) -> float:
    """A number from `low` to `high`; unset or empty keeps the default."""
    text = env.get(variable) or str(default)
    try:
        value = float(text)
    except ValueError:
        value = low - 1  # refused below, with the same message as one out of range
    if not low <= value <= high:
        raise ValueError(f"{variable} must be a number from {low:g} to {high:g}, not {text!r}")
    return value


def _whole(env: dict[str, str], variable: str, default: int, least: int = 1) -> int:
    """A whole number of at least `least`; unset or empty keeps the default."""
    text = env.get(variable) or str(default)
    if not text.isdigit() or int(text) < least:
        raise ValueError(f"{variable} must be a whole number of at least {least}, not {text!r}")
    return int(text)


def _sweep(env: dict[str, str]) -> float:
    """WINGSMITH_CONSUMER_SWEEP: 0 turns the sweep off (docs/nats-security.md says what that
    gives up); otherwise at least 0.1 s, so a sweep never runs back to back with the last."""
    variable = "WINGSMITH_CONSUMER_SWEEP"
    seconds = _number(env, variable, 5, 0, 3600)
    if 0 < seconds < 0.1:
        raise ValueError(f"{variable} must be 0 (off) or from 0.1 to 3600 seconds, not {seconds:g}")
    return seconds


def _replicas(env: dict[str, str]) -> int:
    """WINGSMITH_STREAM_REPLICAS: an odd count, so a JetStream cluster keeps a quorum."""
    text = env.get("WINGSMITH_STREAM_REPLICAS") or "1"
    if text not in {"1", "3", "5"}:
        raise ValueError(f"WINGSMITH_STREAM_REPLICAS must be 1, 3 or 5, not {text!r}")
    return int(text)


@dataclass(frozen=True)
class HealthLimits:
    """When the hub stops calling itself healthy (docs/operations.md#health): a stage more than
    its lag behind the store, or behind and not moving for `stall_seconds`."""

    relay_lag: int = 20_000  # store positions not yet on WINGSMITH_EVENTS
    projector_lag: int = 20_000  # events on WINGSMITH_EVENTS not yet folded into the views
    scheduler_lag: int = 20_000  # store positions the scheduler has not yet decided on
    stall_seconds: float = 30.0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> HealthLimits:
        def lag(name: str, default: int) -> int:
            return _whole(env, f"WINGSMITH_HEALTH_{name}_LAG", default)

        return cls(
            relay_lag=lag("RELAY", cls.relay_lag),
            projector_lag=lag("PROJECTOR", cls.projector_lag),
            scheduler_lag=lag("SCHEDULER", cls.scheduler_lag),
            stall_seconds=_number(env, "WINGSMITH_HEALTH_STALL", cls.stall_seconds, 1, 86_400),
        )


TOKEN_NAME = re.compile(r"^[A-Za-z0-9][-_.A-Za-z0-9]{0,31}$")


def _tokens(env: dict[str, str], variable: str) -> dict[str, str]:
    """`name:token,name:token`: each bearer token with the name it stands for (the name goes
    into the ids of the commands it sends). An error never shows a token."""
    tokens: dict[str, str] = {}
    entries = [e.strip() for e in env.get(variable, "").split(",") if e.strip()]
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


_SIZE = re.compile(r"^(WINGSMITH_[A-Z]+)=([0-9]+)([KMG]?)$")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _stream_sizes(env: dict[str, str]) -> dict[str, int]:
    """`WINGSMITH_EVENTS=16G,WINGSMITH_PROJ=4G`: each stream's size limit, in bytes. A name that
    is no stream's is refused: a misspelt one would otherwise leave its stream at the default."""
    # Imported here, not above: the CLI's HTTP client reads this module's file names and has
    # no use for the NATS client that adapters.nats_bus brings in.
    from wingsmith.adapters.nats_bus import STREAMS

    streams = [config.name or "" for config in STREAMS]
    variable = "WINGSMITH_STREAM_MAX_BYTES"
    sizes: dict[str, int] = {}
    for entry in (e.strip() for e in env.get(variable, "").split(",") if e.strip()):
        found = _SIZE.match(entry)
        if found is None or int(found[2]) == 0:
            raise ValueError(
                f"{variable}: {entry!r} is not STREAM=SIZE "
                "(e.g. WINGSMITH_EVENTS=16G; K, M or G, or bytes)"
            )
        if found[1] not in streams:
            raise ValueError(
                f"{variable}: {found[1]!r} is no stream; the streams are {', '.join(streams)}"
            )
        sizes[found[1]] = int(found[2]) * _UNITS[found[3]]
    return sizes


@dataclass(frozen=True)
class Settings:
    nats_url: str | None  # None: start the embedded nats-server
    store_url: str | None  # None: a SQLite file in data_dir
    data_dir: Path
    max_command_bytes: int = 64 * 1024
    operator_read_only: bool = False
    relay: bool = True
    projector: bool = True  # `up` starts the projector process
    admission: bool = True  # the hub with the relay runs the admission process
    stream_replicas: int = 1
    cluster_silence: float = 30.0  # seconds without a heartbeat before a cluster is unreachable
    observation_rate: float = 200.0  # reports a second each cluster may have handled, sustained
    observation_burst: float = 5000.0  # ... and at once
    stream_max_bytes: dict[str, int] = field(default_factory=dict)  # stream -> size limit
    intake_max_lag: float = 0.25  # seconds the scheduler may be behind before clients wait
    operator_sync_every: float = 60.0  # seconds between an operator's full reports (syncs)
    nats_credentials: Credentials | None = None  # WINGSMITH_NATS_USER / _PASSWORD
    api_listen: tuple[str, int] = ("127.0.0.1", 8080)
    api_tokens: dict[str, str] = field(default_factory=dict)  # token -> name; may write
    api_read_tokens: dict[str, str] = field(default_factory=dict)  # token -> name; only read
    api_header_timeout: float = 10.0  # seconds a client has to send a whole request head
    api_body_timeout: float = 15.0  # seconds a client has to send a whole body, after its head
    api_max_connections: int = 512  # open at once; more are answered 503
    consumer_sweep: float = 5.0  # seconds between the hub's consumer sweeps; 0: none
    health: HealthLimits = field(default_factory=HealthLimits)
    checkpoint_seconds: float = 10.0  # the projector checkpoints at most this long after a change
    views_duplicate_window: float = 120.0  # WINGSMITH_PROJ's Nats-Msg-Id window, seconds

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ) if env is None else env
        return cls(
            observation_rate=_number(env, "WINGSMITH_OBS_RATE", 200.0, 1, 1_000_000),
            observation_burst=_number(env, "WINGSMITH_OBS_BURST", 5000.0, 1, 10_000_000),
            stream_max_bytes=_stream_sizes(env),
            nats_url=env.get("WINGSMITH_NATS_URL") or None,
            store_url=env.get("WINGSMITH_STORE") or None,
            data_dir=data_dir_from(env),
            max_command_bytes=_whole(env, "WINGSMITH_MAX_COMMAND_BYTES", 64 * 1024, 1024),
            operator_read_only=_flag(env, "HANGAR_OPERATOR_READ_ONLY"),
            relay=not _flag(env, "WINGSMITH_NO_RELAY"),
            projector=_flag(env, "WINGSMITH_PROJECTOR", default=True),
            admission=_flag(env, "WINGSMITH_ADMISSION", default=True),
            stream_replicas=_replicas(env),
            cluster_silence=_number(env, "WINGSMITH_CLUSTER_SILENCE", 30.0, 1, 86_400),
            intake_max_lag=_number(env, "WINGSMITH_INTAKE_MAX_LAG", 0.25, 0.01, 3_600),
            operator_sync_every=_number(env, "WINGSMITH_OPERATOR_SYNC_EVERY", 60.0, 0.1, 86_400),
            nats_credentials=credentials_from_env(env),
            api_listen=_listen(env.get("WINGSMITH_API_LISTEN") or "127.0.0.1:8080"),
            api_tokens=_tokens(env, "WINGSMITH_API_TOKENS"),
            api_read_tokens=_tokens(env, "WINGSMITH_API_READ_TOKENS"),
            api_header_timeout=_number(env, "WINGSMITH_API_HEADER_TIMEOUT", 10, 0.1, 3600),
            api_body_timeout=_number(env, "WINGSMITH_API_BODY_TIMEOUT", 15, 0.1, 3600),
            api_max_connections=_whole(env, "WINGSMITH_API_MAX_CONNECTIONS", 512),
            consumer_sweep=_sweep(env),
            health=HealthLimits.from_env(env),
            checkpoint_seconds=_number(env, "WINGSMITH_CHECKPOINT_SECONDS", 10.0, 0.1, 86_400),
            views_duplicate_window=_number(
                env, "WINGSMITH_VIEWS_DUPLICATE_WINDOW", 120.0, 0.1, 86_400
            ),
        )

    @property
    def api_token_file(self) -> Path:
        """Where `wingsmith up` keeps the token it made when none is configured."""
        return self.data_dir / API_TOKEN_FILE

    @property
    def api_url_file(self) -> Path:
        """Where `wingsmith up` writes the API's URL for the CLI to find."""
        return self.data_dir / API_URL_FILE

    @property
    def url_file(self) -> Path:
        """Where `wingsmith up` writes the embedded server's URL for the CLI to find."""
        return self.data_dir / "nats.url"

    def resolved_nats_url(self) -> str:
        if self.nats_url:
            return self.nats_url
        try:
            return self.url_file.read_text().strip()
        except FileNotFoundError:
            raise RuntimeError(
                f"no NATS server: set WINGSMITH_NATS_URL or run `wingsmith up` "
                f"(looked for {self.url_file})"
            ) from None


async def connect(
    settings: Settings, name: str, url: str | None = None, *, operator_of: str | None = None
) -> nats_bus.Connection:
    """A NATS connection as `name`, logged in with the configured credentials, if any; with
    `operator_of`, the connection of that cluster's operator (replies under its own inbox)."""
    login = settings.nats_credentials
    url = url or settings.resolved_nats_url()
    user, password = (login.user, login.password) if login else (None, None)
    if operator_of is not None:
        return await nats_bus.connect_operator(url, operator_of, user=user, password=password)
    return await nats_bus.connect(url, name, user=user, password=password)
