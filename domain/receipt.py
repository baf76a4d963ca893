"""A command receipt: proof that a command_id was handled, and what it answered.

It is saved in the same transaction as the command's events, so a command_id is applied at most
once even across hub restarts and several hubs: a second save of the same receipt conflicts.
"""

from __future__ import annotations

from typing import Any

from wingsmith.domain.base import Aggregate, Cause, Created


class CommandReceipt(Aggregate):
    kind = "command"
    subject: str
    payload_digest: str
    result: dict[str, Any]

    @classmethod
    def record(
        cls, cause: Cause, *, subject: str, payload_digest: str, result: dict[str, Any]
    ) -> CommandReceipt:
        return cls._start(
            CommandHandled,
            cause.command_id,
            cause,
            subject=subject,
            payload_digest=payload_digest,
            result=result,
        )


class CommandHandled(Created):
    aggregate_class = CommandReceipt
    subject: str
    payload_digest: str
    result: dict[str, Any]

    def apply(self, receipt: Any) -> None:
        receipt.subject = self.subject
        receipt.payload_digest = self.payload_digest
        receipt.result = self.result
