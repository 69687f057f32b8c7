"""A request llmq refuses, wherever the refusal is decided (the API's routes, admission, a batch's
lines): its HTTP status, a machine-readable type and a message for people. The API turns it into
`{"error": {"type", "message", ...}}` (api/errors.py); a batch turns it into a line's error."""
from __future__ import annotations

from pydantic import ValidationError


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, headers: dict | None = None, **extra):
        super().__init__(message)
        self.status, self.type, self.message = status, type_, message
        self.headers = headers or {}
        self.extra = extra


def describe_validation(exc: ValidationError) -> tuple[str, list[dict]]:
    """A pydantic error as one message and a `[{"field", "message"}]` list naming each field."""
    details = [{"field": ".".join(str(p) for p in e["loc"]) or "body", "message": e["msg"]}
               for e in exc.errors(include_url=False)]
    return "; ".join(f"{d['field']}: {d['message']}" for d in details), details
