"""A job's record as it lives in Redis: a hash of strings, written from and read back into typed
fields. Every module that reads or writes a job hash goes through these two functions."""
from __future__ import annotations

import enum
import json
import time
from typing import Any

from common.schemas import JobStatus

_INT_FIELDS = ("prompt_tokens", "completion_tokens", "attempts", "batch_size_max", "priority_level",
               "max_tokens")
_FLOAT_FIELDS = ("created_at", "started_at", "finished_at", "queue_deadline", "run_timeout_s")
_JSON_FIELDS = ("request", "error", "tool_calling", "response", "logprobs")


def encode_fields(fields: dict[str, Any]) -> list[str]:
    """Fields as a flat [name, value, ...] list of strings, for HSET or a script's ARGV. None
    values are left out; enums are written as their values."""
    flat: list[str] = []
    for name, value in fields.items():
        if value is None:
            continue
        if name in _JSON_FIELDS:
            value = json.dumps(value)
        elif isinstance(value, bool):
            value = int(value)
        elif isinstance(value, enum.Enum):
            value = value.value
        flat += [name, str(value)]
    return flat


def encode_mapping(fields: dict[str, Any]) -> dict[str, str]:
    """`encode_fields` as a mapping, for HSET's `mapping=`."""
    flat = encode_fields(fields)
    return dict(zip(flat[::2], flat[1::2]))


def decode_record(raw: dict[str, str]) -> dict[str, Any]:
    """Hash fields (strings) to typed values; `status` as a `JobStatus`."""
    record: dict[str, Any] = dict(raw)
    for name in _INT_FIELDS:
        if name in record:
            record[name] = int(record[name])
    for name in _FLOAT_FIELDS:
        if name in record:
            record[name] = float(record[name])
    for name in _JSON_FIELDS:
        if name in record:
            record[name] = json.loads(record[name])
    if "status" in record:
        record["status"] = JobStatus(record["status"])
    record["cached"] = record.get("cached") == "1"
    record["cancel_requested"] = record.get("cancel_requested") == "1"
    return record


def is_overdue(record: dict[str, Any]) -> bool:
    """A queued job whose queue deadline has passed (not yet marked `expired`)."""
    deadline = record.get("queue_deadline")
    return record.get("status") == JobStatus.QUEUED and bool(deadline) and deadline <= time.time()
