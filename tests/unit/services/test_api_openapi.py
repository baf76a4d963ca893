"""The API's OpenAPI document says what every endpoint answers: a schema for each success, and
a problem document for everything else."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from wingsmith.services.api.app import Tokens, create_app
from wingsmith.services.api.problems import PROBLEM_JSON


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(SimpleNamespace(nc=None), Tokens({}, {}))  # type: ignore[arg-type]
    return app.openapi()


def operations(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{verb.upper()} {path}", operation)
        for path, verbs in document["paths"].items()
        for verb, operation in verbs.items()
    ]


def resolved(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    found: dict[str, Any] = document
    for part in ref.removeprefix("#/").split("/"):
        found = found[part]
    return resolved(document, found)


def says_something(document: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether the schema describes an object's properties, or is a choice of such."""
    schema = resolved(document, schema)
    choices = schema.get("anyOf") or schema.get("oneOf")
    if choices:
        return all(says_something(document, choice) for choice in choices)
    return bool(schema.get("properties"))


def test_the_document_lists_the_endpoints(document: dict[str, Any]) -> None:
    assert len(operations(document)) >= 25


def test_every_operation_has_a_success_with_a_schema(document: dict[str, Any]) -> None:
    for name, operation in operations(document):
        successes = {s: r for s, r in operation["responses"].items() if s.startswith("2")}
        assert successes, f"{name} declares no success"
        for status, response in successes.items():
            schema = response.get("content", {}).get("application/json", {}).get("schema")
            assert schema, f"{name} {status} has no schema"
            assert says_something(document, schema), f"{name} {status}: {schema} is empty"


def test_every_other_answer_is_a_problem(document: dict[str, Any]) -> None:
    problem = {"$ref": "#/components/schemas/ProblemDocument"}
    for name, operation in operations(document):
        others = {s: r for s, r in operation["responses"].items() if not s.startswith("2")}
        assert "default" in others, name
        for status, response in others.items():
            assert response["content"] == {PROBLEM_JSON: {"schema": problem}}, (name, status)
    assert "properties" in document["components"]["schemas"]["ProblemDocument"]


def test_a_write_says_it_may_be_accepted_before_the_views_show_it(
    document: dict[str, Any],
) -> None:
    for name, operation in operations(document):
        if not name.startswith("GET"):
            schema = operation["responses"]["202"]["content"]["application/json"]["schema"]
            assert "Accepted" in str(schema), name
