"""Job records, token logs and the result cache in Redis.

A job is a Redis hash; its token log is a Redis Stream (replayable, `Last-Event-ID` friendly) and
every append also PUBLISHes a wake-up on the job's channel. State changes that race (start,
cancel, finish) are single Lua scripts, so a job is never half-written or finished twice.
"""
from __future__ import annotations

import json
import time
from typing import Any

import redis

from common.keys import Keys
from common.schemas import JobStatus

_CREATE = """
if tonumber(ARGV[1]) > 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

_START = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing', 0} end
redis.call('ZREM', KEYS[2], ARGV[1])
if st ~= 'queued' and st ~= 'running' then return {st, 0} end
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return {'cancel', attempts} end
if attempts > tonumber(ARGV[4]) then return {'poison', attempts} end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[2], 'worker', ARGV[3],
           'text', '', 'completion_tokens', '0')
if st == 'running' then return {'restart', attempts} end
return {'start', attempts}
"""

_CANCEL = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finish_reason', 'cancelled',
             'finished_at', ARGV[2], 'cancel_requested', '1')
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return 'cancelled'
end
if st == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'cancelling'
end
return 'ended:' .. st
"""

_FINISH = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'running' and st ~= 'queued' then return st or 'missing' end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 'ok'
"""

_INT_FIELDS = ("prompt_tokens", "completion_tokens", "attempts", "batch_size_max")
_FLOAT_FIELDS = ("created_at", "started_at", "finished_at")
_JSON_FIELDS = ("request", "error")


def _encode(fields: dict[str, Any]) -> list[str]:
    flat: list[str] = []
    for name, value in fields.items():
        if value is None:
            continue
        if name in _JSON_FIELDS:
            value = json.dumps(value)
        elif isinstance(value, bool):
            value = int(value)
        flat += [name, str(value)]
    return flat


def decode_record(raw: dict[str, str]) -> dict[str, Any]:
    """Hash fields (strings) to typed values."""
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
    record["cached"] = record.get("cached") == "1"
    record["cancel_requested"] = record.get("cancel_requested") == "1"
    return record


class JobStore:
    """All reads and writes of job state. Both the API and the workers go through it."""

    def __init__(self, client: redis.Redis, keys: Keys, job_ttl_s: int, events_maxlen: int):
        self.r = client
        self.keys = keys
        self.job_ttl_s = job_ttl_s
        self.events_maxlen = events_maxlen
        self._create = client.register_script(_CREATE)
        self._start = client.register_script(_START)
        self._cancel = client.register_script(_CANCEL)
        self._finish = client.register_script(_FINISH)

    # --- lifecycle -----------------------------------------------------------------------
    def create(self, job_id: str, fields: dict[str, Any], queue_limit: int) -> bool:
        """Insert a queued job unless `queue_limit` queued jobs already wait. False when full."""
        now = fields.get("created_at", time.time())
        result = self._create(
            keys=[self.keys.job(job_id), self.keys.queued],
            args=[queue_limit, now, job_id, self.job_ttl_s, *_encode(fields)],
        )
        if result == -1:
            raise ValueError(f"job {job_id} exists")
        return result == 1

    def create_finished(self, job_id: str, fields: dict[str, Any]) -> None:
        """Insert a job that is already done (a cache hit), with its whole token log."""
        pipe = self.r.pipeline()
        pipe.hset(self.keys.job(job_id), mapping=dict(zip(*[iter(_encode(fields))] * 2)))
        pipe.expire(self.keys.job(job_id), self.job_ttl_s)
        pipe.execute()

    def start(self, job_id: str, worker: str, max_attempts: int) -> tuple[str, int]:
        """Claim a delivered job. Returns (outcome, attempts); outcome is 'start', 'restart'
        (a redelivery after a lost worker), 'cancel', 'poison', 'missing' or a terminal status."""
        outcome, attempts = self._start(
            keys=[self.keys.job(job_id), self.keys.queued],
            args=[job_id, time.time(), worker, max_attempts],
        )
        return outcome, int(attempts)

    def request_cancel(self, job_id: str) -> str:
        """'cancelled' (was queued), 'cancelling' (running: the worker stops it), 'missing',
        or 'ended:<status>' when it had already ended."""
        outcome = self._cancel(
            keys=[self.keys.job(job_id), self.keys.queued],
            args=[job_id, time.time(), self.job_ttl_s],
        )
        if outcome == "cancelled":
            self.count(f"finished:{JobStatus.CANCELLED.value}")
        return outcome

    def finish(self, job_id: str, status: JobStatus, **fields: Any) -> bool:
        """Write the terminal state once; False if the job had already ended."""
        fields = {"status": status.value, "finished_at": time.time(), **fields}
        result = self._finish(
            keys=[self.keys.job(job_id), self.keys.events(job_id), self.keys.queued],
            args=[job_id, self.job_ttl_s, *_encode(fields)],
        )
        if result == "ok":
            self.count(f"finished:{status.value}")
        return result == "ok"

    # --- reads ------------------------------------------------------------------------------
    def get(self, job_id: str) -> dict[str, Any] | None:
        raw = self.r.hgetall(self.keys.job(job_id))
        return decode_record(raw) if raw else None

    def status(self, job_id: str) -> JobStatus | None:
        value = self.r.hget(self.keys.job(job_id), "status")
        return JobStatus(value) if value else None

    def cancel_requested(self, job_id: str) -> bool:
        return self.r.hget(self.keys.job(job_id), "cancel_requested") == "1"

    def queue_depth(self) -> int:
        return self.r.zcard(self.keys.queued)

    # --- token log --------------------------------------------------------------------------
    def append_event(self, job_id: str, event: str, data: dict[str, Any], **record: Any) -> None:
        """Add one event to the job's log, wake its listeners, and optionally update the record."""
        pipe = self.r.pipeline(transaction=False)
        if record:
            pipe.hset(self.keys.job(job_id), mapping=dict(zip(*[iter(_encode(record))] * 2)))
        stream = self.keys.events(job_id)
        pipe.xadd(stream, {"event": event, "data": json.dumps(data)},
                  maxlen=self.events_maxlen, approximate=True)
        pipe.expire(stream, self.job_ttl_s)
        pipe.publish(self.keys.channel(job_id), event)
        pipe.execute()

    def publish_done(self, job_id: str) -> None:
        """Close the job's log with a `done` event built from its (terminal) record."""
        self.append_event(job_id, "done", done_payload(self.get(job_id) or {}))

    def read_events(self, job_id: str, after: str = "0") -> list[tuple[str, str, dict[str, Any]]]:
        """Events strictly after stream id `after`, as (id, event, data)."""
        entries = self.r.xrange(self.keys.events(job_id), min=f"({after}" if after != "0" else "-")
        return [(entry_id, f["event"], json.loads(f["data"])) for entry_id, f in entries]

    # --- result cache -----------------------------------------------------------------------
    def cache_get(self, digest: str) -> dict[str, Any] | None:
        value = self.r.get(self.keys.cache(digest))
        self.count("cache_hits" if value else "cache_misses")
        return json.loads(value) if value else None

    def cache_put(self, digest: str, result: dict[str, Any], ttl_s: int) -> None:
        if ttl_s > 0:
            self.r.set(self.keys.cache(digest), json.dumps(result), ex=ttl_s)

    # --- counters (issue 5: metrics) --------------------------------------------------------
    def count(self, name: str, by: int = 1) -> None:
        """Bump a cluster-wide counter (read by the API's /metrics)."""
        self.r.hincrby(self.keys.stats, name, by)

    def counters(self) -> dict[str, int]:
        return {name: int(value) for name, value in self.r.hgetall(self.keys.stats).items()}


def done_payload(record: dict[str, Any]) -> dict[str, Any]:
    """The `done` event body: final status, finish reason, usage, error."""
    prompt, completion = record.get("prompt_tokens", 0), record.get("completion_tokens", 0)
    return {"status": record.get("status"), "finish_reason": record.get("finish_reason"),
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
            "error": record.get("error"), "cached": record.get("cached", False)}
