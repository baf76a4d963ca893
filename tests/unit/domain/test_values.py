from __future__ import annotations

import pytest
from pydantic import ValidationError

from wingsmith.domain.values import ServingConfig

from .conftest import serving


def test_equal_configs_give_equal_digests() -> None:
    assert serving().digest() == serving().digest()
    assert serving().digest().startswith("svg_")


@pytest.mark.parametrize(
    "change",
    [
        {"engine_version": "0.9.3"},
        {"context_length": 65536},
        {"parallelism": {"tensor": 2}, "devices_per_replica": 2},
        {"quantization": "fp8"},
    ],
)
def test_any_serving_change_changes_the_digest(change: dict[str, object]) -> None:
    assert serving(**change).digest() != serving().digest()


def test_digest_ignores_how_the_config_was_spelled() -> None:
    spelled = ServingConfig.model_validate_json(serving().model_dump_json())
    assert spelled.digest() == serving().digest()


def test_devices_must_hold_the_parallelism() -> None:
    with pytest.raises(ValidationError, match="multiple of tensor x pipeline"):
        serving(devices_per_replica=3, parallelism={"tensor": 2})
