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
