"""The health limits and projector settings come from the environment, and a bad value is
refused naming the variable."""

from __future__ import annotations

import pytest

from wingsmith.services.config import HealthLimits, Settings


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.health == HealthLimits()
    assert (settings.checkpoint_seconds, settings.views_duplicate_window) == (10.0, 120.0)


def test_each_limit_is_read_from_its_variable() -> None:
    settings = Settings.from_env(
        {
            "WINGSMITH_HEALTH_RELAY_LAG": "10",
            "WINGSMITH_HEALTH_PROJECTOR_LAG": "20",
            "WINGSMITH_HEALTH_SCHEDULER_LAG": "30",
            "WINGSMITH_HEALTH_STALL": "4.5",
            "WINGSMITH_CHECKPOINT_SECONDS": "2",
            "WINGSMITH_VIEWS_DUPLICATE_WINDOW": "1",
        }
    )
    assert settings.health == HealthLimits(10, 20, 30, 4.5)
    assert (settings.checkpoint_seconds, settings.views_duplicate_window) == (2.0, 1.0)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WINGSMITH_HEALTH_PROJECTOR_LAG", "0"),
        ("WINGSMITH_HEALTH_RELAY_LAG", "many"),
        ("WINGSMITH_HEALTH_STALL", "-1"),
        ("WINGSMITH_CHECKPOINT_SECONDS", "nan"),
        ("WINGSMITH_VIEWS_DUPLICATE_WINDOW", "1e9"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"^{variable} must be a .*, not '{value}'$"):
        Settings.from_env({variable: value})
