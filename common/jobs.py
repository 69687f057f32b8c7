"""Job records, token logs and the result cache in Redis.

A job is a Redis hash; its token log is a Redis Stream (replayable, `Last-Event-ID` friendly) and
every append also PUBLISHes a wake-up on the job's channel (a chunk with its content). State
changes that race (start, cancel, finish, expiry) are single Lua scripts, so a job is never
half-written or finished twice.

Redelivery: each claim of a job is an attempt, numbered in the record. A worker writes
chunks and the end of its attempt only while that attempt still owns the job (the number is the
fence), and holds a lease its heartbeat renews; a redelivered copy of a job whose lease is alive is
a duplicate and is not run.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from common.coalescing import ATTACH, LUA_HELPERS
from common.fair_queue import ENQUEUE_LUA, REMOVE_LUA, FairQueue, fair_place
from common.keys import Keys
from common.schemas import PRIORITY_LEVELS, JobStatus

log = logging.getLogger(__name__)

# Every script below gets the coalescing and fair-queue Lua helpers; each ARGV layout is noted.
_HELPERS = LUA_HELPERS + REMOVE_LUA + ENQUEUE_LUA

# KEYS: job, queued, fair owners, fair list, fair meta, inflight.
# ARGV: 1 queue limit, 2 now, 3 id, 4 ttl, 5 owner, 6 cost, 7 register inflight ('1'/'0'), 8.. fields
_CREATE = _HELPERS + """
if tonumber(ARGV[1]) > 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
fair_enqueue(KEYS[3], KEYS[4], KEYS[5], ARGV[5], ARGV[6], ARGV[3])
if ARGV[7] == '1' then redis.call('SET', KEYS[6], ARGV[3], 'NX', 'EX', ARGV[4]) end
return 1
"""

# A claim, for the job and its followers. A carrier (a primary whose client cancelled while
# followers ride on it) is claimed like a running job but its own record is left as it is.
# KEYS: job, queued, lease, log. ARGV: 1 id, 2 now, 3 worker, 4 max attempts, 5 lease ttl,
# 6 job ttl, 7 log maxlen, 8 job prefix
_START = _HELPERS + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing', 0} end
local carrier = is_carrier(KEYS[1])
if st ~= 'queued' and st ~= 'running' and not carrier then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {st, 0}
end
if (st == 'running' or carrier) and redis.call('EXISTS', KEYS[3]) == 1 then
  return {'duplicate', tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0')}
end
redis.call('ZREM', KEYS[2], ARGV[1])
if st == 'queued' then fair_remove() end  -- normally already picked; not when run directly
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return {'cancel', attempts} end
if attempts > tonumber(ARGV[4]) then return {'poison', attempts} end
redis.call('HSET', KEYS[1], 'chunks_written', 0)  -- this attempt's chunks count from 0
local targets = live_followers(KEYS[1], ARGV[8])
if not carrier then table.insert(targets, 1, ARGV[1]) end
local restart = cjson.encode({attempt = attempts, reason = 'the previous attempt lost its worker'})
for _, id in ipairs(targets) do
  local key = ARGV[8] .. id
  redis.call('HSET', key, 'status', 'running', 'started_at', ARGV[2], 'worker', ARGV[3],
             'text', '', 'completion_tokens', '0')
  redis.call('EXPIRE', key, ARGV[6])
  if st ~= 'queued' then log_event(key, ARGV[7], ARGV[6], 'restart', restart) end
end
redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[5])
if st == 'queued' then return {'start', attempts} end
return {'restart', attempts}
"""

# KEYS: job, queued. ARGV: 1 id, 2 now, 3 ttl, 4 job prefix, 5 inflight prefix
_CANCEL = _HELPERS + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
local primary = redis.call('HGET', KEYS[1], 'coalesced_into')
local function mark_cancelled()
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finish_reason', 'cancelled',
             'finished_at', ARGV[2], 'cancel_requested', '1')
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
if primary and (st == 'queued' or st == 'running') then
  detach_follower(ARGV[4], primary, ARGV[1])
  mark_cancelled()
  return 'cancelled'
end
if st == 'queued' then
  if not promote(KEYS[1], ARGV[1], ARGV[4], KEYS[2], ARGV[5]) then fair_remove() end
  redis.call('ZREM', KEYS[2], ARGV[1])
  mark_cancelled()
  return 'cancelled'
end
if st == 'running' then
  if #live_followers(KEYS[1], ARGV[4]) > 0 then
    redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finish_reason', 'cancelled',
               'finished_at', ARGV[2], 'detached', '1')
    hand_over_inflight(KEYS[1], ARGV[1], ARGV[5], false)
    return 'cancelled'
  end
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'cancelling'
end
return 'ended:' .. st
"""

# The end of a generation, written to the job (unless it is a carrier) and its live followers.
# KEYS: job, log, queued, lease. ARGV: 1 id, 2 ttl, 3 attempt or '', 4 job prefix,
# 5 inflight prefix, 6.. fields. Returns {outcome, '1' if the job's own log needs its done
# event, followers that need theirs...}.
_FINISH = _HELPERS + """
local st = redis.call('HGET', KEYS[1], 'status')
local carrier = is_carrier(KEYS[1])
if st ~= 'running' and st ~= 'queued' and not carrier then return {st or 'missing'} end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[3] then return {'superseded'} end
local result = {'ok', carrier and '0' or '1'}
if not carrier then redis.call('HSET', KEYS[1], unpack(ARGV, 6)) end
if st == 'queued' then fair_remove() end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[4])
for _, f in ipairs(live_followers(KEYS[1], ARGV[4])) do
  redis.call('HSET', ARGV[4] .. f, unpack(ARGV, 6))
  redis.call('EXPIRE', ARGV[4] .. f, ARGV[2])
  table.insert(result, f)
end
redis.call('DEL', KEYS[1] .. ':followers')
hand_over_inflight(KEYS[1], ARGV[1], ARGV[5], false)
return result
"""

# A chunk of one attempt: written only while that attempt still owns the running job, so a worker
# that was given up on (and replaced) can never interleave its tokens with the new attempt's.
# Written to the job (unless it is a carrier) and to each of its running followers. Idempotent by
# chunk index: a chunk index already written (the reply to that write was lost, Redis going down
# right after running the script) is refused with 2, never logged twice. A written chunk returns 3
# instead of 1 when a client asked to cancel the job, so a writer learns of a cancel without a
# read of its own while tokens flow.
# KEYS: job. ARGV: 1 attempt, 2 event, 3 data, 4 log maxlen, 5 ttl, 6 job prefix, 7 chunk index,
# 8.. fields
_APPEND_FENCED = _HELPERS + """
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1] then return 0 end
local running = redis.call('HGET', KEYS[1], 'status') == 'running'
if not running and not is_carrier(KEYS[1]) then return 0 end
local index = tonumber(ARGV[7])
if index then
  if index < tonumber(redis.call('HGET', KEYS[1], 'chunks_written') or '0') then return 2 end
  redis.call('HSET', KEYS[1], 'chunks_written', index + 1)
end
local targets = {}
if running then table.insert(targets, KEYS[1]) end
for _, f in ipairs(followers_of(KEYS[1])) do
  if redis.call('HGET', ARGV[6] .. f, 'status') == 'running' then table.insert(targets, ARGV[6] .. f) end
end
for _, key in ipairs(targets) do
  if #ARGV > 7 then redis.call('HSET', key, unpack(ARGV, 8)) end
  log_event(key, ARGV[4], ARGV[5], ARGV[2], ARGV[3])
end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 3 end
return 1
"""

_RENEW_LEASE = _HELPERS + """
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'running' and not is_carrier(KEYS[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1
"""

# KEYS: job, queued, deadlines. ARGV: 1 id, 2 now, 3 ttl, 4 error, 5 job prefix, 6 inflight prefix
_EXPIRE_OVERDUE = _HELPERS + """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return st or 'missing'
end
local deadline = tonumber(redis.call('HGET', KEYS[1], 'queue_deadline') or '')
if not deadline or deadline > tonumber(ARGV[2]) then return 'queued' end
local primary = redis.call('HGET', KEYS[1], 'coalesced_into')
if primary then
  detach_follower(ARGV[5], primary, ARGV[1])
elseif not promote(KEYS[1], ARGV[1], ARGV[5], KEYS[2], ARGV[6]) then
  fair_remove()
end
redis.call('HSET', KEYS[1], 'status', 'expired', 'finish_reason', 'timeout', 'finished_at', ARGV[2],
           'error', ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 'expired'
"""

_INT_FIELDS = ("prompt_tokens", "completion_tokens", "attempts", "batch_size_max", "priority_level",
               "max_tokens")
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

    def __init__(self, client: redis.Redis, keys: Keys, job_ttl_s: int, events_maxlen: int,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None):
        """`on_event(event, record)` hears 'start' (a worker began the job: once, not on a
        restart) and 'completed' (the job ended, in any status); it is how webhooks are queued
        (common/webhooks.py). Its failures are logged and never stop the job's own writes."""
        self.r = client
        self.on_event = on_event
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
        self._attach = client.register_script(ATTACH)
        self.fair = FairQueue(client, keys, job_ttl_s)
        self.job_prefix = keys.job("")
        self.inflight_prefix = keys.inflight("")

    # --- lifecycle -----------------------------------------------------------------------
    def create(self, job_id: str, fields: dict[str, Any], queue_limit: int, weight: float = 1.0,
               digest: str | None = None, queued_key: str | None = None) -> bool:
        """Insert a queued job, in its key's fair-queue list, unless `queue_limit` queued jobs
        already wait. False when full. The key's `weight` sets its fair share (see
        common/fair_queue.py). With a request `digest` the job becomes the one identical
        requests attach to (`attach`). A `queue_deadline` field also indexes the job for the
        expiry sweep (first, so no queued job is ever missing from the index; an index entry
        without a job is dropped by the sweep). `queued_key` files the job in another queued set
        than the interactive one whose size is the admission bound (a batch's lines)."""
        now = fields.get("created_at", time.time())
        if fields.get("queue_deadline"):
            self.r.zadd(self.keys.deadlines, {job_id: fields["queue_deadline"]})
        level = PRIORITY_LEVELS[fields.get("priority") or "normal"]
        place = fair_place(self.keys, fields.get("queue") or "default", level, fields.get("owner"), weight)
        fields = {**fields, "fair_list": place.jobs, "fair_owner": place.owner, "priority_level": level}
        result = self._create(
            keys=[self.keys.job(job_id), queued_key or self.keys.queued, place.owners, place.jobs, place.meta,
                  self.keys.inflight(digest or "")],
            args=[queue_limit, now, job_id, self.job_ttl_s, place.owner, place.cost,
                  "1" if digest else "0", *_encode(fields)],
        )
        if result == -1:
            raise ValueError(f"job {job_id} exists")
        return result == 1

    def attach(self, job_id: str, fields: dict[str, Any], digest: str) -> str | None:
        """Create this job as a follower of the queued or running job generating the same
        request (see common/coalescing.py). Returns that job's id, or None: nothing to attach to."""
        if fields.get("queue_deadline"):
            self.r.zadd(self.keys.deadlines, {job_id: fields["queue_deadline"]})
        primary = self._attach(
            keys=[self.keys.inflight(digest), self.keys.job(job_id), self.keys.events(job_id)],
            args=[job_id, self.job_ttl_s, self.job_prefix, self.events_maxlen, *_encode(fields)],
        )
        if primary is None:
            self.r.zrem(self.keys.deadlines, job_id)
            return None
        self.count("coalesced")
        self._notify("start", [job_id])  # sent only if it joined a generation under way
        return primary

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
                  self.events_maxlen, self.job_prefix],
        )
        if outcome == "start" and self.on_event is not None:  # the job and its followers began
            self._notify("start", [job_id], followers_of=job_id)
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
            args=[job_id, time.time(), self.job_ttl_s, error, self.job_prefix, self.inflight_prefix],
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
            args=[job_id, time.time(), self.job_ttl_s, self.job_prefix, self.inflight_prefix],
        )
        if outcome == "cancelled":
            self.count(f"finished:{JobStatus.CANCELLED.value}")
        return outcome

    def finish(self, job_id: str, status: JobStatus, attempt: int | None = None,
               **fields: Any) -> list[str] | None:
        """Write the terminal state once, to the job and to the followers riding on it. Returns
        the jobs whose logs now need their `done` event (`publish_done`): the job itself unless
        its client already left (a carrier), and its followers. None if the job had already
        ended, or if `attempt` is given and another attempt has since taken the job over."""
        fields = {"status": status.value, "finished_at": time.time(), **fields}
        outcome, *rest = self._finish(
            keys=[self.keys.job(job_id), self.keys.events(job_id), self.keys.queued,
                  self.keys.lease(job_id)],
            args=[job_id, self.job_ttl_s, "" if attempt is None else attempt, self.job_prefix,
                  self.inflight_prefix, *_encode(fields)],
        )
        if outcome != "ok":
            return None
        ended = ([job_id] if rest[0] == "1" else []) + rest[1:]
        self.count(f"finished:{status.value}", len(ended))
        return ended

    # --- reads ------------------------------------------------------------------------------
    def get(self, job_id: str) -> dict[str, Any] | None:
        raw = self.r.hgetall(self.keys.job(job_id))
        return decode_record(raw) if raw else None

    def get_many(self, job_ids: list[str]) -> list[dict[str, Any] | None]:
        """`get` of each job, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(self.keys.job(job_id))
        return [decode_record(raw) if raw else None for raw in pipe.execute()]

    def status(self, job_id: str) -> JobStatus | None:
        value = self.r.hget(self.keys.job(job_id), "status")
        return JobStatus(value) if value else None

    def cancel_requested(self, job_id: str) -> bool:
        return self.r.hget(self.keys.job(job_id), "cancel_requested") == "1"

    def heartbeat(self, info: dict[str, Any], ttl_s: int) -> None:
        """Record a worker's heartbeat; it counts as live for `ttl_s` seconds (`live_workers`)."""
        pipe = self.r.pipeline()
        pipe.hset(self.keys.workers, info["name"], json.dumps(info))
        pipe.set(self.keys.worker_alive(info["name"]), "1", ex=ttl_s)
        pipe.execute()

    def forget_worker(self, name: str) -> None:
        pipe = self.r.pipeline()
        pipe.hdel(self.keys.workers, name)
        pipe.delete(self.keys.worker_alive(name))
        pipe.execute()

    def live_workers(self) -> list[dict[str, Any]]:
        """Heartbeat info of every worker whose heartbeat is still fresh. Entries of workers whose
        heartbeat has expired are removed, so the hash does not grow with every worker ever run."""
        infos = [json.loads(v) for v in self.r.hvals(self.keys.workers)]
        if not infos:
            return []
        pipe = self.r.pipeline(transaction=False)
        for info in infos:
            pipe.exists(self.keys.worker_alive(info["name"]))
        alive = pipe.execute()
        live = [info for info, up in zip(infos, alive) if up]
        dead = [info["name"] for info, up in zip(infos, alive) if not up]
        if dead:
            self.r.hdel(self.keys.workers, *dead)
        held = self.fair.held()  # fresher than the heartbeat's count of running jobs
        for info in live:
            if info["name"] in held:
                info["held_jobs"] = held[info["name"]]
                info["running"] = len(held[info["name"]])
        return live

    def queue_position(self, record: dict[str, Any]) -> int | None:
        """Queued jobs that will start before this one, in the fair queue's order (a coalesced
        job waits where its primary does); None if it is not queued."""
        primary = record.get("coalesced_into")
        if primary:
            record = self.get(primary) or {}
        return self.fair.position(record) if record.get("status") == "queued" else None


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

    def append_chunk(self, job_id: str, attempt: int, data: dict[str, Any], **record: Any) -> int:
        """Add a `chunk` of attempt `attempt` (and update the record) atomically, only if that
        attempt still owns the running job: 1, or 3 if a cancel of the job was asked for. 0: it
        was superseded or the job ended. 2: a chunk with this `index` was already written (see
        `chunks_written`); nothing was written."""
        return self._append_fenced(
            keys=[self.keys.job(job_id)],
            args=[attempt, "chunk", json.dumps(data), self.events_maxlen, self.job_ttl_s,
                  self.job_prefix, data.get("index", ""), *_encode(record)],
        )

    def chunks_written(self, job_id: str) -> int:
        """Chunks the job's current attempt has written, for a writer that lost a reply."""
        return int(self.r.hget(self.keys.job(job_id), "chunks_written") or 0)

    def publish_done(self, job_id: str) -> None:
        """Close the job's log with a `done` event built from its (terminal) record."""
        record = self.get(job_id) or {}
        self.append_event(job_id, "done", done_payload(record))
        if record.get("webhook"):
            self._notify("completed", [job_id], record)

    def _notify(self, event: str, job_ids: list[str], record: dict[str, Any] | None = None,
                followers_of: str | None = None) -> None:
        """Tell `on_event` about jobs that asked for a webhook (and about the followers of
        `followers_of`); 'start' only for jobs now running. Never raises: a caller may be a
        write that must not be retried. Jobs without a webhook cost one HMGET each."""
        if self.on_event is None:
            return
        try:
            if followers_of:
                job_ids = [*job_ids, *self.r.smembers(self.keys.followers(followers_of))]
            if record is None:
                pipe = self.r.pipeline(transaction=False)
                for job_id in job_ids:
                    pipe.hmget(self.keys.job(job_id), "webhook", "status")
                job_ids = [job_id for job_id, (url, status) in zip(job_ids, pipe.execute())
                           if url and (event != "start" or status == JobStatus.RUNNING.value)]
        except redis.RedisError:
            log.warning("could not read jobs %s for their %s webhooks", job_ids, event)
            return
        for job_id in job_ids:
            try:
                job = record or self.get(job_id)
                if job and job.get("webhook"):
                    self.on_event(event, job)
            except Exception:
                log.exception("job %s: could not queue its %s webhook", job_id, event)

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

    # --- counters (metrics) ----------------------------------------------------------------
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
