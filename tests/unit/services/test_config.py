"""The API's limits come from the environment, with defaults, and a bad value names its
variable."""

from __future__ import annotations

from dataclasses import fields

import pytest

from wingsmith.services.config import Settings
from wingsmith.services.environment import Environment


def test_the_api_limits_have_defaults() -> None:
    settings = Settings.from_env({})
    assert (settings.api_header_timeout, settings.api_body_timeout) == (10.0, 15.0)
    assert settings.api_max_connections == 512


def test_the_api_limits_are_read() -> None:
    settings = Settings.from_env(
        {
            "WINGSMITH_API_HEADER_TIMEOUT": "2.5",
            "WINGSMITH_API_BODY_TIMEOUT": "60",
            "WINGSMITH_API_MAX_CONNECTIONS": "64",
        }
    )
    assert (settings.api_header_timeout, settings.api_body_timeout) == (2.5, 60.0)
    assert settings.api_max_connections == 64


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WINGSMITH_API_HEADER_TIMEOUT", "0"),
        ("WINGSMITH_API_HEADER_TIMEOUT", "soon"),
        ("WINGSMITH_API_BODY_TIMEOUT", "-1"),
        ("WINGSMITH_API_BODY_TIMEOUT", "nan"),
        ("WINGSMITH_API_MAX_CONNECTIONS", "0"),
        ("WINGSMITH_API_MAX_CONNECTIONS", "1.5"),
    ],
)
def test_a_bad_limit_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable):
        Settings.from_env({variable: value})


def test_the_intake_bound_has_a_default_is_read_and_refused_when_bad() -> None:
    assert Settings.from_env({}).intake_max_lag == 0.25
    assert Settings.from_env({"WINGSMITH_INTAKE_MAX_LAG": "1.5"}).intake_max_lag == 1.5
    for bad in ("0", "later", "-2"):
        with pytest.raises(ValueError, match="WINGSMITH_INTAKE_MAX_LAG"):
            Settings.from_env({"WINGSMITH_INTAKE_MAX_LAG": bad})


def test_a_size_for_a_stream_that_does_not_exist_is_refused_naming_the_streams() -> None:
    with pytest.raises(ValueError) as refused:
        Settings.from_env({"WINGSMITH_STREAM_MAX_BYTES": "WINGSMITH_EVENTS=1G,WINGSMITH_EVENT=16G"})
    message = str(refused.value)
    assert message.startswith("WINGSMITH_STREAM_MAX_BYTES: 'WINGSMITH_EVENT' is no stream")
    for stream in ("WINGSMITH_EVENTS", "WINGSMITH_RENDER", "WINGSMITH_OBS", "WINGSMITH_PROJ"):
        assert stream in message


def test_every_stream_may_be_sized() -> None:
    text = "WINGSMITH_EVENTS=1G,WINGSMITH_RENDER=2M,WINGSMITH_OBS=3K,WINGSMITH_PROJ=4"
    text += ",WINGSMITH_DEAD=5G"
    sizes = Settings.from_env({"WINGSMITH_STREAM_MAX_BYTES": text}).stream_max_bytes
    assert sizes == {
        "WINGSMITH_EVENTS": 1024**3,
        "WINGSMITH_RENDER": 2 * 1024**2,
        "WINGSMITH_OBS": 3 * 1024,
        "WINGSMITH_PROJ": 4,
        "WINGSMITH_DEAD": 5 * 1024**3,
    }


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WINGSMITH_MAX_COMMAND_BYTES", "1023"),
        ("WINGSMITH_MAX_COMMAND_BYTES", "64k"),
        ("WINGSMITH_CLUSTER_SILENCE", "0.5"),
        ("WINGSMITH_CLUSTER_SILENCE", "soon"),
        ("WINGSMITH_OBS_RATE", "0"),
        ("WINGSMITH_OBS_BURST", "1e8"),
        ("WINGSMITH_OPERATOR_SYNC_EVERY", "0"),
        ("WINGSMITH_STREAM_REPLICAS", "2"),
    ],
)
def test_a_bad_number_is_refused_naming_its_variable_and_value(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"^{variable} must be .*, not '{value}'$"):
        Settings.from_env({variable: value})


def test_numbers_are_read_and_default() -> None:
    defaults = Settings.from_env({})
    assert (defaults.max_command_bytes, defaults.cluster_silence) == (64 * 1024, 30.0)
    assert (defaults.observation_rate, defaults.observation_burst) == (200.0, 5000.0)
    settings = Settings.from_env(
        {
            "WINGSMITH_MAX_COMMAND_BYTES": "1024",
            "WINGSMITH_CLUSTER_SILENCE": "2.5",
            "WINGSMITH_OBS_RATE": "1",
            "WINGSMITH_OBS_BURST": "10000000",
            "WINGSMITH_STREAM_REPLICAS": "3",
        }
    )
    assert (settings.max_command_bytes, settings.cluster_silence) == (1024, 2.5)
    assert (settings.observation_rate, settings.observation_burst) == (1.0, 10_000_000.0)
    assert settings.stream_replicas == 3


@pytest.mark.parametrize(
    ("value", "on"),
    [(None, True), ("", True), ("false", False), (" OFF ", False), ("0", False), ("maybe", True)],
)
def test_a_switch_that_is_on_stays_on_unless_told_off(value: str | None, on: bool) -> None:
    env = {} if value is None else {"WINGSMITH_PROJECTOR": value, "WINGSMITH_ADMISSION": value}
    settings = Settings.from_env(env)
    assert (settings.projector, settings.admission) == (on, on)


@pytest.mark.parametrize(
    ("value", "on"), [(None, False), ("", False), ("true", True), ("Yes", True), ("maybe", False)]
)
def test_a_switch_that_is_off_stays_off_unless_told_on(value: str | None, on: bool) -> None:
    settings = Settings.from_env({} if value is None else {"WINGSMITH_NO_RELAY": value})
    assert settings.relay is not on


@pytest.mark.parametrize("variable", ["HANGAR_OPERATOR_READ_ONLY", "WINGSMITH_OPERATOR_READ_ONLY"])
@pytest.mark.parametrize(
    ("value", "read_only"),
    [(None, False), ("", False), ("true", True), (" Yes", True), ("1", True), ("OFF", False)],
)
def test_the_read_only_switch_has_two_names(
    variable: str, value: str | None, read_only: bool
) -> None:
    settings = Settings.from_env({} if value is None else {variable: value})
    assert settings.operator_read_only is read_only


@pytest.mark.parametrize("value", ["maybe", "ture", "2", "read-only"])
def test_an_unclear_read_only_switch_is_refused_not_taken_as_read_write(value: str) -> None:
    for variable in ("HANGAR_OPERATOR_READ_ONLY", "WINGSMITH_OPERATOR_READ_ONLY"):
        with pytest.raises(ValueError, match=f"^{variable} must be true or false .*{value!r}"):
            Settings.from_env({variable: value})


def test_the_two_read_only_names_may_not_disagree() -> None:
    both = {"HANGAR_OPERATOR_READ_ONLY": "true", "WINGSMITH_OPERATOR_READ_ONLY": "no"}
    with pytest.raises(ValueError, match="disagree"):
        Settings.from_env(both)
    agreeing = Settings.from_env(both | {"WINGSMITH_OPERATOR_READ_ONLY": "on"})
    assert agreeing.operator_read_only is True


def test_every_setting_is_read_from_the_environment() -> None:
    """A setting the environment has no variable for would quietly keep its default."""
    derived = {"relay", "nats_credentials", "health"}  # from no_relay, the login, the limits
    missing = {f.name for f in fields(Settings)} - set(Environment.model_fields) - derived
    assert not missing


def test_the_move_delays_and_fraction_are_read_and_default() -> None:
    defaults = Settings.from_env({})
    assert (defaults.placement_move_after, defaults.cluster_lost_after) == (300.0, 600.0)
    assert defaults.rebalance_max_fraction == 0.25
    settings = Settings.from_env(
        {
            "WINGSMITH_PLACEMENT_MOVE_AFTER": "2",
            "WINGSMITH_CLUSTER_LOST_AFTER": "1.5",
            "WINGSMITH_REBALANCE_MAX_FRACTION": "0.5",
        }
    )
    assert (settings.placement_move_after, settings.cluster_lost_after) == (2.0, 1.5)
    assert settings.rebalance_max_fraction == 0.5
    for variable, value in (
        ("WINGSMITH_REBALANCE_MAX_FRACTION", "1.5"),
        ("WINGSMITH_CLUSTER_LOST_AFTER", "0"),
        ("WINGSMITH_PLACEMENT_MOVE_AFTER", "later"),
    ):
        with pytest.raises(ValueError, match=f"^{variable} must be .*, not '{value}'$"):
            Settings.from_env({variable: value})
