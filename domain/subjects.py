"""Values as NATS subject tokens and KV keys: one reversible encoding, used wherever a value
becomes part of a subject, a KV key or a message id.

A NATS subject is a list of tokens separated by `.`; a token may not be empty or hold
whitespace, `*` or `>` means a wildcard, and the server refuses or misroutes control characters.
An id with such a character, once stored, would stop every stage that publishes it. So a value
is never put into a subject as it is: each character outside the safe set `A-Z a-z 0-9 - _`
becomes `=` and two upper-case hex digits per UTF-8 byte (`a b` -> `a=20b`, `=` -> `=3D`), and
the empty value is the token `=`. Every valid id (a DNS label, a device class, `llama--east`)
is made of safe characters only, so its token is the id itself: the public contract does not
move. The result is also a valid KV key (nats-py allows `-/_=.A-Za-z0-9` there).

A view key may name several tokens on purpose (`east.H100`): `key_subject` keeps its dots and
encodes each part. A token longer than `MAX_TOKEN` after encoding (only a value the edge would
have refused) keeps a prefix of its encoding and ends in `==` and a digest of the whole value:
still a stable, distinct token that keeps the subject within the server's protocol limits, but
no longer reversible (`==` never occurs in a reversible token). The message body always holds
the value itself.
"""

from __future__ import annotations

import hashlib
import re

from wingsmith.domain.names import EVENTS

SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
ESCAPE = "="
EMPTY = "="  # the token of the empty value: `=` is otherwise always followed by two hex digits
DIGEST = "=="  # ends the prefix of an over-long value's token; a digest of the value follows
MAX_TOKEN = 512
_DIGEST_HEX = 32
_ESCAPED = re.compile(r"=([0-9A-F]{2})")
_ALL_SAFE = re.compile(r"[-_A-Za-z0-9]+")
_SAFE_KEY = re.compile(r"[-_A-Za-z0-9]+(?:\.[-_A-Za-z0-9]+)*")


def token(value: str) -> str:
    """One subject token standing for `value` (its dots included)."""
    if _ALL_SAFE.fullmatch(value):  # every valid id: nothing to do
        return value if len(value) <= MAX_TOKEN else _digest(value, value)
    if not value:
        return EMPTY
    raw = value.encode("utf-8", "surrogatepass")
    encoded = "".join(chr(b) if chr(b) in SAFE else f"={b:02X}" for b in raw)
    return encoded if len(encoded) <= MAX_TOKEN else _digest(value, encoded)


def _digest(value: str, encoded: str) -> str:
    keep = MAX_TOKEN - len(DIGEST) - _DIGEST_HEX
    cut = encoded[:keep]
    if "=" in cut[-2:]:  # never cut an escape in half
        cut = cut[: cut.rindex("=")]
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_HEX]
    return f"{cut}{DIGEST}{digest}"


def value(encoded: str) -> str:
    """The value a token stands for; an over-long value's token is returned as it is."""
    if encoded == EMPTY:
        return ""
    if ESCAPE not in encoded or DIGEST in encoded:
        return encoded
    raw = _ESCAPED.sub(lambda m: chr(int(m[1], 16)), encoded).encode("latin-1")
    return raw.decode("utf-8", "surrogatepass")


def key_subject(key: str) -> str:
    """A view key as subject tokens: each dot-separated part encoded, the dots kept."""
    if len(key) <= MAX_TOKEN and _SAFE_KEY.fullmatch(key):  # every valid key: nothing to do
        return key
    return ".".join(token(part) for part in key.split("."))


def key_value(subject: str) -> str:
    """The view key that `key_subject` encoded."""
    return ".".join(value(part) for part in subject.split("."))


def filter_tokens(pattern: str) -> str:
    """A subject filter over view keys: each part encoded, except the wildcards `*` and `>`."""
    return ".".join(p if p in ("*", ">") else token(p) for p in pattern.split("."))


def event_subject(aggregate: str, aggregate_id: str, event_type: str) -> str:
    """`wingsmith.evt.<aggregate>.<id>.<EventType>`, each part one token."""
    return f"{EVENTS}.{token(aggregate)}.{token(aggregate_id)}.{token(event_type)}"


def event_msg_id(aggregate: str, aggregate_id: str, version: int) -> str:
    """The `Nats-Msg-Id` of an event: `<aggregate>:<id>:<version>`. NATS rewrites a header
    value's line breaks and outer spaces, so the id goes in encoded, as in the subject."""
    return f"{token(aggregate)}:{token(aggregate_id)}:{version}"
