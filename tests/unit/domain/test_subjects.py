"""The subject-token encoding: valid ids unchanged, anything else a safe token, reversibly."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from wingsmith.domain import subjects
from wingsmith.domain.values import NAME_PATTERN

# what a NATS subject token and a nats-py KV key may hold
KV_KEY = re.compile(r"^[-/_=.A-Za-z0-9]+$")
TOKEN = re.compile(r"^[-_=A-Za-z0-9]+$")


@given(st.from_regex(NAME_PATTERN, fullmatch=True).filter(lambda s: len(s) <= 63))
def test_a_valid_name_is_its_own_token(name: str) -> None:
    assert subjects.token(name) == name
    assert subjects.key_subject(f"{name}.H100") == f"{name}.H100"


def test_ids_of_the_contract_are_unchanged() -> None:
    for ident in ["llama--east", "NVIDIA-H100-80GB-HBM3", "east--ns--dgd", "workload_phase"]:
        assert subjects.token(ident) == ident
    assert subjects.event_subject("replica", "llama--east--pod-0", "ReplicaReady") == (
        "wingsmith.evt.replica.llama--east--pod-0.ReplicaReady"
    )
    assert subjects.event_msg_id("deployment", "llama--east", 3) == "deployment:llama--east:3"


def test_unsafe_characters_are_escaped() -> None:
    assert subjects.token("a b") == "a=20b"
    assert subjects.token("a\tb\x0b\x0c") == "a=09b=0B=0C"
    assert subjects.token("x.y*>") == "x=2Ey=2A=3E"
    assert subjects.token("=") == "=3D"
    assert subjects.token("") == "="
    assert subjects.token("é") == "=C3=A9"
    assert subjects.key_subject("a b..c") == "a=20b.=.c"


@given(st.text())
def test_every_value_is_one_safe_token_and_comes_back(text: str) -> None:
    encoded = subjects.token(text)
    assert TOKEN.match(encoded) and KV_KEY.match(encoded)
    assert len(encoded) <= subjects.MAX_TOKEN
    if subjects.DIGEST not in encoded:
        assert subjects.value(encoded) == text


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=120))
def test_a_view_key_keeps_its_dots_and_comes_back(key: str) -> None:
    encoded = subjects.key_subject(key)
    assert encoded.count(".") == key.count(".")
    assert all(TOKEN.match(part) for part in encoded.split("."))
    if subjects.DIGEST not in encoded:  # a part too long to encode whole is digested
        assert subjects.key_value(encoded) == key


@given(st.text(min_size=subjects.MAX_TOKEN), st.text(min_size=1, max_size=3))
def test_over_long_values_keep_distinct_bounded_tokens(text: str, tail: str) -> None:
    one, other = subjects.token(text), subjects.token(text + tail)
    assert one != other
    assert len(one) <= subjects.MAX_TOKEN and len(other) <= subjects.MAX_TOKEN
    assert subjects.token(text) == one  # stable
    assert subjects.value(one) == one  # marked, not decoded into something else


def test_a_filter_keeps_its_wildcards() -> None:
    assert subjects.filter_tokens("east.*") == "east.*"
    assert subjects.filter_tokens("a b.>") == "a=20b.>"
