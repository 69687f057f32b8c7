"""Batch records in Redis (OpenAI's `/v1/batches` objects) and the accounting of their lines.

A batch is a hash (`Keys.batch`) plus working keys (`Keys.batch_part`): `requests` (line number ->
the prepared job), `pending` (lines not yet accounted for), `results` (line number -> its output
or error line). A line is accounted for exactly once: `record_result` is one Lua script that
writes the line's result only if it has none (HSETNX), and in the same step takes it out of
`pending` and adds to the counts and usage. Status changes are compare-and-set scripts, so the
API (cancel) and the control worker (progress) never overwrite each other; each terminal change is
made by exactly one caller, which then calls `on_batch_ended`.

Status machine (OpenAI's): validating -> in_progress -> finalizing -> completed; validating ->
failed (the input file has errors); validating | in_progress -> cancelling -> cancelled;
validating | in_progress -> expired (the completion window passed).
"""
from __future__ import annotations

import json
import time
import uuid
from enum import Enum
from typing import TYPE_CHECKING, Any

import redis

from common.files import page_of_index
from common.keys import Keys
from common.lua import script
from common.openai_models import Batch, BatchUsage, RequestCounts
from common.scheduling.fair_queue import ANONYMOUS

if TYPE_CHECKING:
    from common.webhooks import Webhooks



class BatchStatus(str, Enum):
    """A batch's status, OpenAI's words. A str, so Redis fields and JSON see the word."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


TERMINAL = frozenset({BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})
CANCELLABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
TASK_BATCH_ADVANCE = "llmq.batch.advance"
_TIMESTAMPS = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
               "failed_at", "expired_at", "cancelling_at", "cancelled_at")
_INTS = _TIMESTAMPS + ("total", "completed", "failed", "input_tokens", "output_tokens")
_JSON = ("errors", "metadata")
_WORKING_PARTS = ("requests", "pending", "results", "queued")


def on_batch_ended(webhooks: Webhooks, batch: dict[str, Any]) -> None:
    """Called once, by the one process that moved `batch` into a terminal state (completed,
    failed, expired or cancelled), right after the change: tells the batch's `webhook`, if it
    named one, with a signed `batch.<status>` event carrying the batch object. The event's
    `webhook` is the URL itself: the delivery state the API shows there is this event's own."""
    if batch.get("webhook"):
        data = {**batch_object(batch).model_dump(mode="json"), "webhook": batch["webhook"]}
        webhooks.enqueue(batch["id"], f"batch.{batch['status']}", data, batch["webhook"])


def batch_object(record: dict[str, Any], webhook: dict[str, Any] | None = None) -> Batch:
    """The batch as OpenAI's API shows it, from its record (`BatchStore.get`); `webhook`: the
    state of the webhook it named (`Webhooks.view`), where shown."""
    input_tokens, output_tokens = record.get("input_tokens", 0), record.get("output_tokens", 0)
    return Batch(
        id=record["id"], object="batch", endpoint=record["endpoint"], errors=record.get("errors"),
        input_file_id=record["input_file_id"], completion_window=record["completion_window"],
        status=record["status"], output_file_id=record.get("output_file_id"),
        error_file_id=record.get("error_file_id"), **{name: record.get(name) for name in _TIMESTAMPS},
        request_counts=RequestCounts(total=record.get("total", 0), completed=record.get("completed", 0),
                                     failed=record.get("failed", 0)),
        metadata=record.get("metadata"), model=record.get("model"),
        usage=BatchUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                         total_tokens=input_tokens + output_tokens, input_tokens_details={"cached_tokens": 0},
                         output_tokens_details={"reasoning_tokens": 0}),
        webhook=webhook)


def line_job_id(batch_id: str, line: int) -> str:
    """The job that runs line `line` of a batch: fixed, so that every step can be retried."""
    return f"{batch_id.removeprefix('batch_')}-{line}"


class BatchStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int):
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._transition = script(client, "batch_transition")
        self._record = script(client, "batch_record_result")

    def create(self, owner: str | None, fields: dict[str, Any]) -> dict[str, Any]:
        batch_id = f"batch_{uuid.uuid4().hex}"
        owner = owner or ANONYMOUS
        record = {**fields, "id": batch_id, "owner": owner, "status": BatchStatus.VALIDATING,
                  "total": 0, "completed": 0, "failed": 0, "input_tokens": 0, "output_tokens": 0}
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self.keys.batch(batch_id), mapping=_encode(record))
        pipe.expire(self.keys.batch(batch_id), self.ttl_s + int(fields["expires_at"] - time.time()))
        pipe.zadd(self.keys.batches_of(owner), {batch_id: fields["created_at"]})
        pipe.sadd(self.keys.batches_active, batch_id)
        pipe.execute()
        return self.get(batch_id)

    def get(self, batch_id: str) -> dict[str, Any] | None:
        raw = self.r.hgetall(self.keys.batch(batch_id))
        if not raw:
            return None
        record: dict[str, Any] = dict(raw)
        record["status"] = BatchStatus(record["status"])
        for name in _INTS:
            if name in record:
                record[name] = int(float(record[name]))
        for name in _JSON:
            if name in record:
                record[name] = json.loads(record[name])
        return record

    def list(self, owner: str | None, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """An owner's batches, newest first, starting after batch `after`; (batches, has_more)."""
        return page_of_index(self.r, self.keys.batches_of(owner or ANONYMOUS), self.get, after, limit)

    def transition(self, batch_id: str, allowed: tuple[BatchStatus, ...], status: BatchStatus,
                   **fields: Any) -> bool:
        """Move to `status` only from one of `allowed`; True if this call made the change."""
        return self._transition(keys=[self.keys.batch(batch_id)],
                                args=[",".join(allowed), status, *_flat(_encode(fields))]) == 1

    def update(self, batch_id: str, **fields: Any) -> None:
        self.r.hset(self.keys.batch(batch_id), mapping=_encode(fields))

    # --- lines ------------------------------------------------------------------------------
    def part(self, batch_id: str, name: str) -> str:
        return self.keys.batch_part(batch_id, name)

    def pending(self, batch_id: str) -> list[int]:
        return sorted(int(line) for line in self.r.smembers(self.part(batch_id, "pending")))

    def record_result(self, batch_id: str, line: int, ok: bool, result: dict[str, Any],
                      input_tokens: int = 0, output_tokens: int = 0) -> bool:
        """Account for a line once: True if this call did (its result was not yet recorded)."""
        return self._record(
            keys=[self.keys.batch(batch_id), self.part(batch_id, "results"), self.part(batch_id, "pending")],
            args=[line, "completed" if ok else "failed", ("o" if ok else "e") + json.dumps(result),
                  input_tokens if ok else 0, output_tokens if ok else 0]) == 1

    def results(self, batch_id: str) -> tuple[list[str], list[str]]:
        """(output lines, error lines) as JSON text, in line order."""
        raw = self.r.hgetall(self.part(batch_id, "results"))
        output, errors = [], []
        for _, value in sorted(raw.items(), key=lambda item: int(item[0])):
            (output if value[0] == "o" else errors).append(value[1:])
        return output, errors

    def forget(self, batch_id: str) -> None:
        """After the batch ended: drop its working keys and let its record expire."""
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(*(self.part(batch_id, name) for name in _WORKING_PARTS))
        pipe.srem(self.keys.batches_active, batch_id)
        pipe.expire(self.keys.batch(batch_id), self.ttl_s)
        pipe.execute()


def kick(client: redis.Redis, celery, keys: Keys, batch_id: str, countdown: float = 0) -> None:
    """Schedule the batch's next step (`llmq.batch.advance`) on the batch queue. Each batch has
    one live chain of steps: the step whose task id is in the batch's `tick` key; a step that
    finds another id there was superseded (a newer kick) and does nothing, so kicking again
    (create, cancel, the watchdog) never multiplies the work."""
    task_id = f"{batch_id}:{uuid.uuid4().hex}"
    client.set(keys.batch_part(batch_id, "tick"), task_id, ex=86400)
    celery.send_task(TASK_BATCH_ADVANCE, args=[batch_id], queue=keys.batch_queue, task_id=task_id,
                     countdown=countdown or None)


def _encode(fields: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in fields.items():
        if value is None:
            continue
        out[name] = json.dumps(value) if name in _JSON else str(value)
    return out


def _flat(mapping: dict[str, str]) -> list[str]:
    return [item for pair in mapping.items() for item in pair]
