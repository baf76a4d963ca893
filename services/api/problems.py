"""RFC 7807 problem details: every error the API returns, naming the field at fault.

The hub's error codes map onto HTTP statuses here, once; a validation failure lists every field
with its problem, and `field` names the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://wingsmith.dev/problems/"

# The hub's error codes (and the API's own), by the HTTP status they answer with.
STATUS: dict[str, int] = {
    "invalid_json": 400,
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "already_exists": 409,
    "ambiguous_reference": 409,
    "illegal_transition": 409,
    "authority_drift": 409,
    "command_id_reused": 409,
    "conflict": 409,
    "stale_placement": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "validation_error": 422,
    "invalid_value": 422,
    "wrong_writer": 403,
    "internal": 500,
    "unavailable": 503,
    "timeout": 504,
}


class Problem(Exception):
    """An error to answer with: a code from STATUS, a sentence, and the field at fault."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        field: str | None = None,
        errors: Sequence[dict[str, Any]] = (),
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.code, self.detail, self.field = code, detail, field
        self.errors, self.extra = list(errors), extra

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 400)

    def body(self, instance: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": TYPE_BASE + self.code,
            "title": self.code.replace("_", " ").capitalize(),
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
            "code": self.code,
        }
        if self.field is not None:
            body["field"] = self.field
        if self.errors:
            body["errors"] = self.errors
        return body | self.extra

    @classmethod
    def from_hub(cls, error: dict[str, Any], fields: dict[str, str] | None = None) -> Problem:
        """The hub's error reply as a problem. `fields` renames command fields to what the
        request called them (a path parameter, say)."""
        details = dict(error.get("details") or {})
        rename = fields or {}
        field = details.pop("field", None)
        errors = [
            e | {"field": rename.get(e["field"], e["field"])} for e in details.pop("errors", [])
        ]
        if field is None and errors:
            field = errors[0]["field"]
        return cls(
            str(error.get("code", "internal")),
            str(error.get("message", "the hub refused the command")),
            field=rename.get(field, field) if field else None,
            errors=errors,
            **details,
        )

    @classmethod
    def from_validation(cls, error: ValidationError, where: str = "") -> Problem:
        """A pydantic error as a problem: `where` prefixes every field (`query.`, say)."""
        errors = [
            {"field": where + (".".join(str(p) for p in e["loc"]) or "(body)"), "problem": e["msg"]}
            for e in error.errors()
        ]
        if any(e["type"] == "json_invalid" for e in error.errors()):
            return cls("invalid_json", f"the body is not valid JSON: {errors[0]['problem']}")
        summary = "; ".join(f"{e['field']}: {e['problem']}" for e in errors[:5])
        return cls("validation_error", summary, field=errors[0]["field"], errors=errors)
