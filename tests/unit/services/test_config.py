"""The API's limits come from the environment, with defaults, and a bad value names its
variable."""

from __future__ import annotations

import pytest

from services.config import Settings


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
