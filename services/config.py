"""Settings from the environment, with defaults that run on a laptop.

The variables are read by pydantic-settings (services/environment.py), only when settings are
asked for: the command line's REST client reads this module for its file names alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from wingsmith.adapters.nats_auth import (
    PASSWORD_VARIABLE,
    USER_VARIABLE,
    Credentials,
    credentials_from_env,
)

if TYPE_CHECKING:
    from wingsmith.adapters.nats_bus import Connection
    from wingsmith.services.environment import Environment

API_TOKEN_FILE = "api.token"  # in the data directory: the token `wingsmith up` made
API_URL_FILE = "api.url"  # where `wingsmith up` serves the API, for the CLI
DEFAULT_DATA_DIR = ".wingsmith"


def data_dir_from(env: dict[str, str]) -> Path:
    return _data_dir(env.get("WINGSMITH_DATA_DIR"))


def _data_dir(text: str | None) -> Path:
    return Path(text or DEFAULT_DATA_DIR).resolve()


def _read_only(concept: bool | None, ours: bool | None) -> bool:
    """HANGAR_OPERATOR_READ_ONLY or WINGSMITH_OPERATOR_READ_ONLY (unset: read-write); two that
    disagree are refused rather than one of them quietly ignored."""
    if concept is not None and ours is not None and concept != ours:
        raise ValueError(
            "HANGAR_OPERATOR_READ_ONLY and WINGSMITH_OPERATOR_READ_ONLY disagree: set one of them"
        )
    return bool(concept if concept is not None else ours)


def _environment(env: dict[str, str] | None) -> Environment:
    from wingsmith.services.environment import read  # pydantic-settings, only when asked

    return read(env)


@dataclass(frozen=True)
class HealthLimits:
    """When the hub stops calling itself healthy (docs/operations.md#health): a stage more than
    its lag behind the store, or behind and not moving for `stall_seconds`."""

    relay_lag: int = 20_000  # store positions not yet on WINGSMITH_EVENTS
    projector_lag: int = 20_000  # events on WINGSMITH_EVENTS not yet folded into the views
    scheduler_lag: int = 20_000  # store positions the scheduler has not yet decided on
    stall_seconds: float = 30.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> HealthLimits:
        return _health(_environment(env))


def _health(e: Environment) -> HealthLimits:
    return HealthLimits(e.relay_lag, e.projector_lag, e.scheduler_lag, e.stall_seconds)


@dataclass(frozen=True)
class Settings:
    nats_url: str | None  # None: start the embedded nats-server
    store_url: str | None  # None: a SQLite file in data_dir
    data_dir: Path
    max_command_bytes: int = 64 * 1024
    operator_read_only: bool = False
    relay: bool = True  # prefer the one-per-store roles (False: take them only after others)
    lease_seconds: float = 5.0  # how long a silent holder's lease stands (services/hub/lease.py)
    projector: bool = True  # `up` starts the projector process
    admission: bool = True  # the hub with the relay runs the admission process
    stream_replicas: int = 1
    cluster_silence: float = 30.0  # seconds without a heartbeat before a cluster is unreachable
    placement_move_after: float = 300.0  # seconds a share waits for capacity before it moves
    cluster_lost_after: float = 600.0  # seconds unreachable before a cluster's shares move
    rebalance_max_fraction: float = 0.25  # of a workload's replicas one rebalancing move takes
    observation_rate: float = 200.0  # reports a second each cluster may have handled, sustained
    observation_burst: float = 5000.0  # ... and at once
    stream_max_bytes: dict[str, int] = field(default_factory=dict)  # stream -> size limit
    intake_max_lag: float = 0.25  # seconds the scheduler may be behind before clients wait
    operator_sync_every: float = 60.0  # seconds between an operator's full reports (syncs)
    operator_pod_defaults: str | None = None  # a file of the cluster's pod needs (YAML or JSON)
    operator_probes: tuple[str, int] | None = None  # where /healthz and /readyz are served
    operator_pod_selector: str | None = None  # only the pods it matches are watched
    operator_leader_elect: bool = False  # act only while holding the cluster's Lease
    operator_lease_seconds: float = 15.0  # how long a silent leader's Lease stands
    operator_node_agents: bool = False  # node agents report devices: wait for their ids
    node_name: str | None = None  # the node a node agent runs on (the downward API's)
    nats_credentials: Credentials | None = None  # WINGSMITH_NATS_USER / _PASSWORD
    metrics_listen: tuple[str, int] | None = None  # where /metrics is served; None: not
    projector_metrics_listen: tuple[str, int] | None = None  # ... the projector's /metrics
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
        e = _environment(env)
        login = {USER_VARIABLE: e.nats_user, PASSWORD_VARIABLE: e.nats_password}
        # every setting the environment has under the same name, as read; then those it
        # reads differently (a relative data directory, two read-only names, a login)
        read = {f.name: getattr(e, f.name) for f in fields(cls) if f.name in type(e).model_fields}
        return cls(
            **read
            | {
                "data_dir": _data_dir(e.data_dir),
                "operator_read_only": _read_only(e.concept_read_only, e.operator_read_only),
                "relay": not e.no_relay,
                "nats_credentials": credentials_from_env(login),
                "health": _health(e),
            }
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
) -> Connection:
    """A NATS connection as `name`, logged in with the configured credentials, if any; with
    `operator_of`, the connection of that cluster's operator (replies under its own inbox)."""
    from wingsmith.adapters import nats_bus  # the NATS client, only for those who connect

    login = settings.nats_credentials
    url = url or settings.resolved_nats_url()
    user, password = (login.user, login.password) if login else (None, None)
    if operator_of is not None:
        return await nats_bus.connect_operator(url, operator_of, user=user, password=password)
    return await nats_bus.connect(url, name, user=user, password=password)
