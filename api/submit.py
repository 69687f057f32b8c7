"""The API's side of admission: who is asking (the API key, its priority, its rate and concurrency
limits), then common/admission.py does the rest. Shared by the jobs API and the OpenAI endpoints."""
from __future__ import annotations

import uuid
from typing import NamedTuple

from flask import g

from api.auth import allowed_priority, current_key
from api.services import Services
from api.stream_limits import StreamSlot
from api.wakeups import JobWatcher
from common.admission import Admitted
from common.schemas import JobRequest, JobStatus


def submit_job(svc: Services, req: JobRequest, extra: dict | None = None, place: bool = False,
               job_id: str | None = None) -> Admitted:
    """The HTTP status (200 for a cache hit, 202 for a queued job) and the job record, with the
    jobs ahead of it when `place` is asked for. The caller's API key (if auth is on) owns the job
    and is held to its rate limits. `extra`: more fields for the job record, `job_id` the new
    job's id (see `Admission.submit`)."""
    key = current_key()
    priority = allowed_priority(req.priority)
    webhook = svc.admission.webhook_fields(req)
    svc.limits.check_rate(key)
    admitted = svc.admission.submit(req, owner=key.id if key else None, priority=priority,
                                    weight=key.weight if key else 1.0, webhook=webhook, extra=extra, place=place,
                                    hold=lambda new_id: svc.limits.concurrency_slot(key, new_id), job_id=job_id)
    g.setdefault("llmq_job_id", admitted.record["id"])  # the access log names it (api/metrics.py); n choices: the first
    return admitted


class Followed(NamedTuple):
    """A job a request has just created and follows to its end (`submit_followed`): its record as
    created, and the watch on its log."""
    record: dict
    woken: JobWatcher


def submit_followed(svc: Services, req: JobRequest, slot: StreamSlot, extra: dict | None = None) -> Followed:
    """`submit_job` for a request that follows its job from the start (a stream, or a wait for
    the whole answer), with a watch on the job's log that began before the job existed and lasts
    as long as `slot`. Such a watch hears every entry, so the relay does not read the empty log
    of a job it has just queued, nor read back the record it has (for its place in line): round
    trips a burst of thousands feels. A job answered from the cache or riding on another's
    generation may have entries already: its relay reads them."""
    job_id = uuid.uuid4().hex
    woken = slot.hold(svc.wakeups.watch(job_id, before_created=True))
    record = submit_job(svc, req, extra, job_id=job_id).record
    if record["status"] != JobStatus.QUEUED or record.get("coalesced_into"):
        woken.hear(None)
    return Followed(record, woken)
