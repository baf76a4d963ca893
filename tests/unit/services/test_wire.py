"""Repeated JSON keys are found wherever they are; everything else is left to the parser."""

import pytest

from wingsmith.services.wire import DuplicateKey, duplicate_key, loads


def test_a_repeated_key_is_named_at_any_depth() -> None:
    assert duplicate_key(b'{"a": 1, "a": 2}') == "a"
    assert duplicate_key(b'{"nodes": [{"id": "n1", "id": "n2"}]}') == "id"


def test_distinct_keys_and_malformed_documents_are_not_flagged() -> None:
    assert duplicate_key(b'{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]}') is None
    assert duplicate_key(b'{"a": ') is None


def test_loads_refuses_what_json_does_not_allow() -> None:
    with pytest.raises(DuplicateKey, match="'x'"):
        loads('{"x": 1, "x": 1}')
    with pytest.raises(ValueError, match="NaN"):
        loads('{"x": NaN}')
