"""docs/commands.md documents every command, and each example is a valid command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wingsmith.domain.commands import COMMANDS

DOC = (Path(__file__).resolve().parents[3] / "docs" / "commands.md").read_text()
SECTIONS = dict(re.findall(r"^## `wingsmith\.cmd\.([a-z_.]+)`\n(.*?)(?=^## |\Z)", DOC, re.M | re.S))


def test_every_command_is_documented() -> None:
    assert set(SECTIONS) == set(COMMANDS)


@pytest.mark.parametrize("subject", sorted(COMMANDS))
def test_the_example_is_a_valid_command(subject: str) -> None:
    example = re.search(r"```json\n(.*?)```", SECTIONS[subject], re.S)
    assert example, f"{subject} has no example"
    COMMANDS[subject].model_validate_json(example.group(1), strict=True)
