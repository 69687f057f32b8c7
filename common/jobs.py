"""Job records, token logs and the result cache in Redis.

A job is a Redis hash; its token log is a Redis Stream (replayable, `Last-Event-ID` friendly) and
every append also PUBLISHes a wake-up on the job's channel. State changes that race (start,
cancel, finish, expiry) are single Lua scripts, so a job is never half-written or finished twice.

Redelivery (issue 4): each claim of a job is an attempt, numbered in the record. A worker writes
chunks and the end of its attempt only while that attempt still owns the job (the number is the
fence), and holds a lease its heartbeat renews; a redelivered copy of a job whose lease is alive is
a duplicate and is not run.
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
if st ~= 'queued' and st ~= 'running' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {st, 0}
end
if st == 'running' and redis.call('EXISTS', KEYS[3]) == 1 then
  return {'duplicate', tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0')}
end
redis.call('ZREM', KEYS[2], ARGV[1])
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return {'cancel', attempts} end
if attempts > tonumber(ARGV[4]) then return {'poison', attempts} end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[2], 'worker', ARGV[3],
           'text', '', 'completion_tokens', '0')
redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[6])
if st == 'queued' then return {'start', attempts} end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'event', 'restart', 'data',
           cjson.encode({attempt = attempts, reason = 'the previous attempt lost its worker'}))
redis.call('EXPIRE', KEYS[4], ARGV[6])
redis.call('PUBLISH', ARGV[8], 'restart')
return {'restart', attempts}
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
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[3] then return 'superseded' end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[4])
return 'ok'
"""

# A chunk of one attempt: written only while that attempt still owns the running job, so a worker
# that was given up on (and replaced) can never interleave its tokens with the new attempt's.
_APPEND_FENCED = """
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if #ARGV > 6 then redis.call('HSET', KEYS[1], unpack(ARGV, 7)) end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[2], 'data', ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('PUBLISH', ARGV[6], ARGV[2])
return 1
"""

_RENEW_LEASE = """
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1
"""

_EXPIRE_OVERDUE = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return st or 'missing'
end
local deadline = tonumber(redis.call('HGET', KEYS[1], 'queue_deadline') or '')
if not deadline or deadline > tonumber(ARGV[2]) then return 'queued' end
redis.call('HSET', KEYS[1], 'status', 'expired', 'finish_reason', 'timeout', 'finished_at', ARGV[2],
           'error', ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 'expired'
"""

_INT_FIELDS = ("prompt_tokens", "completion_tokens", "attempts", "batch_size_max")
_FLOAT_FIELDS = ("created_at", "started_at", "finished_at", "queue_deadline", "run_timeout_s")
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
        self._append_fenced = client.register_script(_APPEND_FENCED)
        self._renew_lease = client.register_script(_RENEW_LEASE)
        self._expire_overdue = client.register_script(_EXPIRE_OVERDUE)

    # --- lifecycle -----------------------------------------------------------------------
    def create(self, job_id: str, fields: dict[str, Any], queue_limit: int) -> bool:
        """Insert a queued job unless `queue_limit` queued jobs already wait. False when full.
        A `queue_deadline` field also indexes the job for the expiry sweep (first, so no queued
        job is ever missing from the index; an index entry without a job is dropped by the sweep)."""
        now = fields.get("created_at", time.time())
        if fields.get("queue_deadline"):
            self.r.zadd(self.keys.deadlines, {job_id: fields["queue_deadline"]})
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

    def start(self, job_id: str, worker: str, max_attempts: int, lease_ttl_s: int = 15) -> tuple[str, int]:
        """Claim a delivered job. Returns (outcome, attempts); outcome is 'start', 'restart'
        (a redelivery after a lost worker), 'duplicate' (another live worker holds its lease:
        leave it alone), 'cancel', 'poison', 'missing' or a terminal status. A claim takes the
        job's lease, which its worker renews (`renew_lease`) and which lapses if that worker dies.
        A restart resets the record's text and, in the same step, appends a `restart` event to
        the log, so readers of either never see two attempts mixed."""
        outcome, attempts = self._start(
            keys=[self.keys.job(job_id), self.keys.queued, self.keys.lease(job_id),
                  self.keys.events(job_id)],
            args=[job_id, time.time(), worker, max_attempts, lease_ttl_s, self.job_ttl_s,
                  self.events_maxlen, self.keys.channel(job_id)],
        )
        return outcome, int(attempts)

    def renew_lease(self, job_id: str, attempt: int, worker: str, lease_ttl_s: int) -> bool:
        """Extend this attempt's lease; False once the job ended or another attempt took it."""
        return self._renew_lease(keys=[self.keys.job(job_id), self.keys.lease(job_id)],
                                 args=[attempt, worker, lease_ttl_s]) == 1

    def expire_if_overdue(self, job_id: str) -> bool:
        """Mark a job that waited in the queue past its deadline `expired` (finish reason
        'timeout') and close its log. True if this call expired it."""
        error = json.dumps({"type": "queue_timeout",
                            "message": "the job waited in the queue past its deadline and was not run"})
        outcome = self._expire_overdue(
            keys=[self.keys.job(job_id), self.keys.queued, self.keys.deadlines],
            args=[job_id, time.time(), self.job_ttl_s, error],
        )
        if outcome == "expired":
            self.publish_done(job_id)
        return outcome == "expired"

    def sweep_expired(self, limit: int = 100) -> list[str]:
        """Expire up to `limit` queued jobs whose deadline has passed (and drop index entries of
        jobs that left the queue). Cheap when nothing is due: one ZRANGEBYSCORE."""
        due = self.r.zrangebyscore(self.keys.deadlines, "-inf", time.time(), start=0, num=limit)
        return [job_id for job_id in due if self.expire_if_overdue(job_id)]

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

    def finish(self, job_id: str, status: JobStatus, attempt: int | None = None, **fields: Any) -> bool:
        """Write the terminal state once; False if the job had already ended, or if `attempt` is
        given and another attempt has since taken the job over."""
        fields = {"status": status.value, "finished_at": time.time(), **fields}
        result = self._finish(
            keys=[self.keys.job(job_id), self.keys.events(job_id), self.keys.queued,
                  self.keys.lease(job_id)],
            args=[job_id, self.job_ttl_s, "" if attempt is None else attempt, *_encode(fields)],
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

    def live_workers(self) -> list[dict[str, Any]]:
        """Heartbeat info of every worker whose heartbeat is still fresh."""
        infos = [json.loads(v) for v in self.r.hvals(self.keys.workers)]
        if not infos:
            return []
        pipe = self.r.pipeline(transaction=False)
        for info in infos:
            pipe.exists(self.keys.worker_alive(info["name"]))
        return [info for info, alive in zip(infos, pipe.execute()) if alive]

    def queue_position(self, job_id: str) -> int | None:
        """Queued jobs admitted before this one (FIFO; priorities may reorder), None if not queued."""
        return self.r.zrank(self.keys.queued, job_id)

    def queue_depth(self) -> int:
        return self.r.zcard(self.keys.queued)

    # --- token log --------------------------------------------------------------------------
    def append_event(self, job_id: str, event: str, data: dict[str, Any], **record: Any) -> None:
        """Add one event to the job's log, wake its listeners, and optionally update the record
        (all or nothing: MULTI/EXEC, so a dying writer never leaves the record and log apart)."""
        pipe = self.r.pipeline(transaction=True)
        if record:
            pipe.hset(self.keys.job(job_id), mapping=dict(zip(*[iter(_encode(record))] * 2)))
        stream = self.keys.events(job_id)
        pipe.xadd(stream, {"event": event, "data": json.dumps(data)},
                  maxlen=self.events_maxlen, approximate=True)
        pipe.expire(stream, self.job_ttl_s)
        pipe.publish(self.keys.channel(job_id), event)
        pipe.execute()

    def append_chunk(self, job_id: str, attempt: int, data: dict[str, Any], **record: Any) -> bool:
        """Add a `chunk` of attempt `attempt` (and update the record) atomically, only if that
        attempt still owns the running job. False: it was superseded or the job ended."""
        return self._append_fenced(
            keys=[self.keys.job(job_id), self.keys.events(job_id)],
            args=[attempt, "chunk", json.dumps(data), self.events_maxlen, self.job_ttl_s,
                  self.keys.channel(job_id), *_encode(record)],
        ) == 1

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


def is_overdue(record: dict[str, Any]) -> bool:
    """A queued job whose queue deadline has passed (not yet marked `expired`)."""
    deadline = record.get("queue_deadline")
    return record.get("status") == JobStatus.QUEUED.value and bool(deadline) and deadline <= time.time()


def done_payload(record: dict[str, Any]) -> dict[str, Any]:
    """The `done` event body: final status, finish reason, usage, error."""
    prompt, completion = record.get("prompt_tokens", 0), record.get("completion_tokens", 0)
    return {"status": record.get("status"), "finish_reason": record.get("finish_reason"),
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
            "error": record.get("error"), "cached": record.get("cached", False)}
