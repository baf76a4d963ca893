"""Checking JSON against a contract's schema, closed: a key the contract does not name fails,
as does a missing or mistyped one (pydantic leaves unknown keys open)."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import orjson
from pydantic import TypeAdapter


def closed(schema: Any) -> Any:
    """`schema` with every object that lists its properties allowing no others."""
    if isinstance(schema, dict):
        schema = {k: closed(v) for k, v in schema.items()}
        if "properties" in schema:
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [closed(v) for v in schema]
    return schema


@functools.cache
def _validator(contract: Any) -> jsonschema.protocols.Validator:
    schema = closed(TypeAdapter(contract).json_schema())
    validator: jsonschema.protocols.Validator = jsonschema.Draft202012Validator(schema)
    return validator


def check(contract: Any, document: Any) -> None:
    """Fail unless `document`, as JSON, is exactly what `contract` describes."""
    _validator(contract).validate(orjson.loads(orjson.dumps(document)))
