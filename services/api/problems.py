"""RFC 7807 problem details: every error the API returns, naming the field at fault.

The hub's error codes map onto HTTP statuses here, once; a validation failure lists every field
with its problem, and `field` names the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from wingsmith.domain.contracts.replies import HubError

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
    "request_timeout": 408,  # the request head or body came too slowly
    "already_exists": 409,
    "ambiguous_reference": 409,
    "illegal_transition": 409,
    "authority_drift": 409,
    "command_id_reused": 409,
    "stale_placement": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "validation_error": 422,
    "invalid_value": 422,
    "internal": 500,
    "conflict": 503,  # too many writers at once: nothing was stored; retry
    "unavailable": 503,
    "busy": 503,  # the hub is behind: nothing was stored; retry after `retry_after_ms`
}


class ProblemDocument(BaseModel):
    """RFC 7807 problem details; `field` names the field at fault, `errors` lists every one."""

    model_config = ConfigDict(extra="allow", title="Problem")
    type: str
    title: str
    status: int
    detail: str
    instance: str
    code: str
    field: str | None = None
    errors: list[dict[str, str]] | None = None


class Problem(Exception):
    """An error to answer with: a code from STATUS, a sentence, the field at fault, and any
    details (`candidates`, `limit`, …) beside them."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        field: str | None = None,
        errors: Sequence[dict[str, Any]] = (),
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.code, self.detail, self.field = code, detail, field
        self.errors, self.details = list(errors), dict(details or {})

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
        return self.details | body  # a detail never hides a member of the problem itself

    @classmethod
    def from_hub(cls, error: HubError, renamed: Mapping[str, str]) -> Problem:
        """The hub's error reply as a problem; `renamed` gives command fields the name the
        request used for them (a path parameter, say)."""
        details = dict(error.get("details") or {})
        field = details.pop("field", None)
        errors = [
            e | {"field": renamed.get(e["field"], e["field"])} for e in details.pop("errors", [])
        ]
        if field is None and errors:
            field = errors[0]["field"]
        return cls(
            str(error.get("code", "internal")),
            str(error.get("message", "the hub refused the command")),
            field=renamed.get(field, field) if field else None,
            errors=errors,
            details=details,
        )

    @classmethod
    def invalid(cls, errors: Iterable[tuple[Sequence[int | str], str]]) -> Problem:
        """A validation failure from (location, message) pairs; the first names the field."""
        listed = [
            {"field": ".".join(str(p) for p in loc) or "(body)", "problem": message}
            for loc, message in errors
        ]
        summary = "; ".join(f"{e['field']}: {e['problem']}" for e in listed[:5])
        return cls("validation_error", summary, field=listed[0]["field"], errors=listed)

    @classmethod
    def from_validation(cls, error: ValidationError) -> Problem:
        if any(e["type"] == "json_invalid" for e in error.errors()):
            return cls("invalid_json", f"the body is not valid JSON: {error.errors()[0]['msg']}")
        return cls.invalid((e["loc"], e["msg"]) for e in error.errors())
