"""Job records and their state changes in Redis.

A job is a Redis hash (common/job_record.py); its token log is common/token_log.py. State changes
that race (create, attach, start, cancel, finish, expiry) are single Lua scripts (common/lua/job_*),
so a job is never half-written or finished twice; each returns a typed outcome.

Redelivery: each claim of a job is an attempt, numbered in the record. A worker writes chunks and
the end of its attempt only while that attempt still owns the job (the number is the fence), and
holds a lease its heartbeat renews; a redelivered copy of a job whose lease is alive is a
duplicate and is not run. A job redelivered after its worker was lost keeps its text and log: the
new attempt continues it (common/continuation.py), or starts it over with `restart`.
"""
from __future__ import annotations

import enum
import json
import time
from typing import Any, NamedTuple, TypeVar

import redis

from common.counters import Counters
from common.scheduling.fair_queue import FairQueue
from common.job_record import decode_record, encode_fields, encode_mapping
from common.keys import Keys
from common.lua import script
from common.new_jobs import Created, NewJob, create_call, created
from common.schemas import JobStatus
from common.tickets import Ticket
from common.token_log import TokenLog

E = TypeVar("E", bound=enum.Enum)


class Claimed(str, enum.Enum):
    """What a worker's claim of a delivered job found (`JobStore.claim`), unless the job had
    already ended: then the claim's outcome is the `JobStatus` it ended in."""
    START = "start"  # it was queued: run it
    REDELIVERED = "redelivered"  # its worker was lost: continue it from its log (or `restart` it)
    DUPLICATE = "duplicate"  # another live worker holds its lease: leave it alone
    CANCEL = "cancel"  # a cancel was asked for before it ran: end it cancelled
    POISON = "poison"  # every attempt so far lost its worker: end it failed
    MISSING = "missing"  # no such job (expired)

    def __str__(self) -> str:
        return self.value


class Claim(NamedTuple):
    outcome: Claimed | JobStatus
    attempt: int


class CancelOutcome(str, enum.Enum):
    """What a client's cancel did (`JobStore.cancel`), unless the job had already ended: then the
    outcome is the `JobStatus` it ended in."""
    CANCELLED = "cancelled"  # it has ended cancelled (it was queued, or rode on another job)
    CANCELLING = "cancelling"  # it is running: its worker stops it and ends it
    MISSING = "missing"  # no such job

    def __str__(self) -> str:
        return self.value


class JobStore:
    """All reads and writes of job records. Both the API and the workers go through it."""

    def __init__(self, client: redis.Redis, keys: Keys, job_ttl_s: int, token_log: TokenLog, fair: FairQueue,
                 counters: Counters):
        self.r = client
        self.keys = keys
        self.job_ttl_s = job_ttl_s
        self.token_log = token_log  # the `done` events of the jobs a change ends, and their webhooks
        self.fair = fair
        self.counters = counters
        self._create = script(client, "job_create")
        self._attach = script(client, "job_attach")
        self._start = script(client, "job_start")
        self._restart = script(client, "job_restart")
        self._renew_lease = script(client, "job_renew_lease")
        self._requeue = script(client, "job_requeue")
        self._cancel = script(client, "job_cancel")
        self._finish = script(client, "job_finish")
        self._expire = script(client, "job_expire")

    # --- lifecycle -----------------------------------------------------------------------
    def create(self, job_id: str, fields: dict[str, Any], queue_limit: int, weight: float = 1.0,
               digest: str | None = None, queued_key: str | None = None, ticket: Ticket | None = None,
               place: bool = False) -> Created | None:
        """Insert a queued job, in its key's fair-queue list, unless `queue_limit` queued jobs
        already wait (None: full). The key's `weight` sets its fair share (see
        common/scheduling/fair_queue.py). With a request `digest` the job becomes the one identical
        requests attach to (`attach`). A `queue_deadline` field also indexes the job for the
        expiry sweep. `queued_key` files the job in another queued set than the interactive one
        whose size is the admission bound (a batch's lines). All in one step (one Lua call), with
        the job's `ticket` pushed to the broker when given, and, with `place`, the jobs ahead of
        it read as they stand (`Created.ahead`)."""
        call = create_call(self.keys, self.job_ttl_s, NewJob(job_id, fields, weight, digest, ticket), queue_limit,
                           queued_key, place)
        return created(call, self._create(keys=call.keys, args=call.args))

    def create_many(self, jobs: list[NewJob], queue_limit: int, queued_key: str | None = None) -> list[Created | None]:
        """`create` of each job, in order, in one pipeline: a burst (a batch's lines) in one
        round trip, or two when Redis must first be told the script."""
        calls = [create_call(self.keys, self.job_ttl_s, job, queue_limit, queued_key, False) for job in jobs]
        pipe = self.r.pipeline(transaction=False)
        for call in calls:
            self._create(keys=call.keys, args=call.args, client=pipe)
        return [created(call, reply) for call, reply in zip(calls, pipe.execute())]

    def attach(self, job_id: str, fields: dict[str, Any], digest: str) -> str | None:
        """Create this job as a follower of the queued or running job generating the same
        request (see common/coalescing.py). Returns that job's id, or None: nothing to attach to."""
        if fields.get("queue_deadline"):
            self.r.zadd(self.keys.deadlines, {job_id: fields["queue_deadline"]})
        primary = self._attach(
            keys=[self.keys.inflight(digest), self.keys.job(job_id), self.keys.events(job_id)],
            args=[*self.keys.job_layout(), job_id, self.job_ttl_s, self.token_log.maxlen, *encode_fields(fields)],
        )
        if primary is None:
            self.r.zrem(self.keys.deadlines, job_id)
            return None
        self.counters.count("coalesced")
        self.token_log.notify("start", [job_id])  # sent only if it joined a generation under way
        return primary

    def create_finished(self, job_id: str, fields: dict[str, Any]) -> None:
        """Insert a job that is already done (a cache hit); its log is written by the caller."""
        pipe = self.r.pipeline()
        pipe.hset(self.keys.job(job_id), mapping=encode_mapping(fields))
        pipe.expire(self.keys.job(job_id), self.job_ttl_s)
        pipe.execute()

    def claim(self, job_id: str, worker: str, max_attempts: int, lease_ttl_s: int = 15) -> Claim:
        """Claim a delivered job (see `Claimed`). A claim takes the job's lease, which its worker
        renews (`renew_lease`) and which lapses if that worker dies. A redelivered job keeps its
        text and log, for the new attempt to continue (or to `restart`)."""
        outcome, attempts, *ended_as = self._start(
            keys=[self.keys.job(job_id), self.keys.queued, self.keys.lease(job_id)],
            args=[*self.keys.job_layout(), job_id, time.time(), worker, max_attempts, lease_ttl_s,
                  self.job_ttl_s],
        )
        claim = Claim(_outcome(Claimed, outcome, *ended_as), int(attempts))
        if claim.outcome is Claimed.START:  # the job and its followers began
            self.token_log.notify("start", [job_id], followers_of=job_id)
        return claim

    def restart(self, job_id: str, attempt: int, reason: str) -> bool:
        """Start a redelivered job over: its text (and its followers') is reset and a `restart`
        event logged, in one step (common/lua/job_restart.lua). False when this attempt no longer
        holds it."""
        return self._restart(keys=[self.keys.job(job_id)],
                             args=[*self.keys.job_layout(), job_id, attempt, self.job_ttl_s,
                                   self.token_log.maxlen, reason]) == 1

    def requeue(self, job_id: str, attempt: int, worker: str) -> bool:
        """Put a running job its worker stopped back at the head of its queue, to start over
        (common/lua/job_requeue.lua). False when this attempt no longer holds it."""
        record = self.r.hmget(self.keys.job(job_id), "queue", "priority_level")
        if None in record:
            return False
        queue, level = record[0], int(record[1])
        return self._requeue(
            keys=[self.keys.job(job_id), self.keys.lease(job_id), self.keys.fair_owners(queue, level),
                  self.keys.fair_meta(queue, level), self.keys.held],
            args=[*self.keys.job_layout(), job_id, attempt, worker, self.job_ttl_s, self.token_log.maxlen]) == 1

    def renew_lease(self, job_id: str, attempt: int, worker: str, lease_ttl_s: int) -> bool:
        """Extend this attempt's lease; False once the job ended or another attempt took it."""
        return self._renew_lease(keys=[self.keys.job(job_id), self.keys.lease(job_id)],
                                 args=[*self.keys.job_layout(), attempt, worker, lease_ttl_s]) == 1

    def expire_if_overdue(self, job_id: str) -> bool:
        """Mark a job that waited in the queue past its deadline `expired` (finish reason
        'timeout') and close its log. True if this call expired it."""
        error = json.dumps({"type": "queue_timeout",
                            "message": "the job waited in the queue past its deadline and was not run"})
        expired = self._expire(
            keys=[self.keys.job(job_id), self.keys.queued, self.keys.deadlines],
            args=[*self.keys.job_layout(), job_id, time.time(), self.job_ttl_s, error],
        ) == 1
        if expired:
            self.token_log.publish_done(job_id)
        return expired

    def sweep_expired(self, limit: int = 100) -> list[str]:
        """Expire up to `limit` queued jobs whose deadline has passed (and drop index entries of
        jobs that left the queue). Cheap when nothing is due: one ZRANGEBYSCORE."""
        due = self.r.zrangebyscore(self.keys.deadlines, "-inf", time.time(), start=0, num=limit)
        return [job_id for job_id in due if self.expire_if_overdue(job_id)]

    def cancel(self, job_id: str) -> CancelOutcome | JobStatus:
        """A client's cancel, whole: a job it ends at once (it was queued, or rode on another
        job) gets its `done` event here; a running one ends when its worker stops it."""
        outcome = self.request_cancel(job_id)
        if outcome is CancelOutcome.CANCELLED:
            self.token_log.publish_done(job_id)
        return outcome

    def request_cancel(self, job_id: str) -> CancelOutcome | JobStatus:
        """The record's side of `cancel` alone: a job it ends still needs its `done` event."""
        outcome = _outcome(CancelOutcome, *self._cancel(
            keys=[self.keys.job(job_id), self.keys.queued],
            args=[*self.keys.job_layout(), job_id, time.time(), self.job_ttl_s],
        ))
        if outcome is CancelOutcome.CANCELLED:
            self.counters.count(f"finished:{JobStatus.CANCELLED}")
        return outcome

    def finish(self, job_id: str, status: JobStatus, attempt: int | None = None,
               **fields: Any) -> list[str] | None:
        """Write the terminal state once, to the job and to the followers riding on it. Returns
        the jobs whose logs now need their `done` event (`TokenLog.publish_done`): the job itself
        unless its client already left (a carrier), and its followers. None if nothing was
        written: the job had already ended (or is gone), or `attempt` is given and another
        attempt has since taken the job over."""
        fields = {"status": status, "finished_at": time.time(), **fields}
        outcome, *rest = self._finish(
            keys=[self.keys.job(job_id), self.keys.events(job_id), self.keys.queued, self.keys.lease(job_id),
                  self.keys.followers(job_id)],
            args=[*self.keys.job_layout(), job_id, self.job_ttl_s, "" if attempt is None else attempt,
                  *encode_fields(fields)],
        )
        if outcome != "written":  # 'ended', 'missing' or 'superseded' (common/lua/job_finish.lua)
            return None
        ended = ([job_id] if rest[0] == "1" else []) + rest[1:]
        self.counters.count(f"finished:{status}", len(ended))
        return ended

    def delete(self, job_id: str) -> None:
        """Forget an ended job: its record and its log (a deleted response)."""
        self.r.delete(self.keys.job(job_id), self.keys.events(job_id))

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

    def cancels_requested(self, job_ids: list[str]) -> list[str]:
        """Those of `job_ids` whose cancel was asked for (one round trip for all)."""
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.job(job_id), "cancel_requested")
        return [job_id for job_id, flag in zip(job_ids, pipe.execute()) if flag == "1"]

    def queue_position(self, record: dict[str, Any]) -> int | None:
        """Queued jobs that will start before this one, in the fair queue's order (a coalesced
        job waits where its primary does); None if it is not queued."""
        primary = record.get("coalesced_into")
        if primary:
            record = self.get(primary) or {}
        return self.fair.position(record) if record.get("status") == JobStatus.QUEUED else None

    def queue_depth(self) -> int:
        return self.r.zcard(self.keys.queued)


def _outcome(outcomes: type[E], word: str, ended_as: str | None = None) -> E | JobStatus:
    """A script's outcome as one of `outcomes`, or ('ended', status) as the status the job had
    already ended in."""
    return JobStatus(ended_as) if word == "ended" else outcomes(word)
