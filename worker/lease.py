"""Keeping hold of the jobs a worker runs, so that only lost ones are redelivered.

Two claims are renewed by the worker's heartbeat:
- the job's lease in llmq's own records (`Keys.lease`): while it lives, a redelivered copy of
  the job is a duplicate and is not run; it lapses `lease_ttl` seconds after its worker dies;
- the broker's unacked-message entry (kombu's `unacked_index`, delivery tag -> delivery time):
  Redis redelivers a message once that time is older than `visibility_timeout_s`, so bumping it
  keeps a long job on a live worker from being delivered twice (celery/celery#5935), while a
  killed worker's jobs come back after the timeout.
"""
from __future__ import annotations

import logging
import threading
import time


from common.jobs import JobStore
from common.settings import Settings

log = logging.getLogger(__name__)


def lease_ttl(settings: Settings) -> int:
    """Seconds a job lease outlives its worker's last heartbeat (three heartbeats)."""
    return settings.heartbeat_ttl_s


class Leases:
    def __init__(self, store: JobStore, worker_name: str, ttl_s: int):
        self.store = store
        self.worker_name = worker_name
        self.ttl_s = ttl_s
        self._held: dict[str, int] = {}  # job id -> attempt
        self._lock = threading.Lock()

    def hold(self, job_id: str, attempt: int) -> None:
        with self._lock:
            self._held[job_id] = attempt

    def release(self, job_id: str) -> None:
        with self._lock:
            self._held.pop(job_id, None)

    def held(self) -> dict[str, int]:
        with self._lock:
            return dict(self._held)

    def renew(self) -> None:
        """Renew every held job's lease and every held broker message. Called by the heartbeat."""
        for job_id, attempt in self.held().items():
            self.store.renew_lease(job_id, attempt, self.worker_name, self.ttl_s)
        tags = held_delivery_tags()
        if tags:
            now = time.time()
            self.store.r.zadd(self.store.keys.broker_unacked_index, {tag: now for tag in tags}, xx=True)


def held_delivery_tags() -> list[str]:
    """Delivery tags of the messages this worker process has reserved (running or about to)."""
    from celery.worker import state

    for _ in range(5):
        try:
            requests = [*state.reserved_requests, *state.active_requests]
            break
        except RuntimeError:  # a weak set changed size while we copied it; try again
            continue
    else:
        return []
    return sorted({req.message.delivery_tag for req in requests if req.message is not None})

