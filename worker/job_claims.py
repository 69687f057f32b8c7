"""A worker's hold on a job, from its claim to its end, as the job record sees it.

Each claim is an attempt, numbered in the record (common/jobs.py): every later write of this
attempt (a restart, a requeue, the end, and its chunks: worker/text_relay.py) is fenced by that
number, so an attempt that was given up on stops (`Superseded`) instead of interleaving with its
successor. Each write rides out a Redis outage of up to `redis_retry_s` (common/redis_retry.py).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from common.jobs import Claim, Claimed, JobStore
from common.redis_retry import retrying
from common.schemas import JobStatus
from common.settings import Settings
from worker.lease import lease_ttl
from worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)
T = TypeVar("T")


class Superseded(Exception):
    """Another attempt has taken the job over; this one must stop writing."""


class JobClaims:
    def __init__(self, store: JobStore, worker_name: str, settings: Settings,
                 metrics: WorkerMetrics | None = None):
        self.store = store
        self.worker_name = worker_name
        self.settings = settings
        self.metrics = metrics
        self.lease_ttl_s = lease_ttl(settings)

    def retrying(self, call: Callable[[], T]) -> T:
        """`call()` through a Redis outage of up to `redis_retry_s` (then its error)."""
        return retrying(call, self.settings.redis_retry_s)

    def expire_if_overdue(self, job_id: str) -> bool:
        """True when the job waited past its queue deadline and has now ended `expired`."""
        return self.retrying(lambda: self.store.expire_if_overdue(job_id))

    def claim(self, job_id: str) -> Claim:
        """Claim the job. A duplicate delivery (another live worker holds the job) waits for that
        worker to finish it, or to die and let its lease lapse, in which case this one restarts it."""
        while True:
            claim = self.retrying(lambda: self.store.claim(
                job_id, self.worker_name, self.settings.max_attempts, self.lease_ttl_s))
            if claim.outcome is not Claimed.DUPLICATE:
                return claim
            time.sleep(self.settings.heartbeat_s)

    def restart(self, job_id: str, attempt: int, reason: str) -> None:
        """The job starts over (its log gets a `restart` event saying why)."""
        if not self.retrying(lambda: self.store.restart(job_id, attempt, reason)):
            raise Superseded(job_id)

    def requeue(self, job_id: str, attempt: int) -> bool:
        """A preempted batch line goes back to the head of its queue (its text so far is dropped:
        the next attempt writes its own, after a `restart` event; a preempted line is not
        continued, as a lost worker's job is). False when it ended or moved on meanwhile."""
        return self.retrying(lambda: self.store.requeue(job_id, attempt, self.worker_name))

    def end(self, job_id: str, attempt: int | None, status: JobStatus, **fields) -> dict:
        """Terminal record first, then the `done` event, so a client that sees `done` and reads
        the job gets the final state; coalesced followers end with it. Fenced by `attempt` (None:
        whatever attempt holds it)."""
        ended = self.retrying(lambda: self.store.finish(job_id, status, attempt=attempt, **fields))
        if ended is not None:
            for ended_id in ended:
                self.retrying(lambda: self.store.token_log.publish_done(ended_id))
            if self.metrics:
                self.metrics.job_finished(status.value)
            log.info("job %s %s (%s)", job_id, status.value, fields.get("finish_reason"),
                     extra={"job_id": job_id, "status": status.value,
                            "completion_tokens": fields.get("completion_tokens")})
        elif attempt is not None and self.store.status(job_id) is JobStatus.RUNNING:
            return {"job_id": job_id, "status": "superseded"}
        return {"job_id": job_id, "status": status.value, "finish_reason": fields.get("finish_reason")}
