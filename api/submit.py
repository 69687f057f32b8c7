"""The API's side of admission: who is asking (the API key, its priority, its rate and concurrency
limits), then common/admission.py does the rest. Shared by the jobs API and the OpenAI endpoints."""
from __future__ import annotations

from flask import g

from api.auth import allowed_priority, current_key
from api.services import Services
from common.admission import Admitted
from common.schemas import JobRequest


def submit_job(svc: Services, req: JobRequest, extra: dict | None = None, place: bool = False) -> Admitted:
    """The HTTP status (200 for a cache hit, 202 for a queued job) and the job record, with the
    jobs ahead of it when `place` is asked for. The caller's API key (if auth is on) owns the job
    and is held to its rate limits. `extra`: more fields for the job record (see
    `Admission.submit`)."""
    key = current_key()
    priority = allowed_priority(req.priority)
    webhook = svc.admission.webhook_fields(req)
    svc.limits.check_rate(key)
    admitted = svc.admission.submit(req, owner=key.id if key else None, priority=priority,
                                    weight=key.weight if key else 1.0, webhook=webhook, extra=extra, place=place,
                                    hold=lambda job_id: svc.limits.concurrency_slot(key, job_id))
    g.setdefault("llmq_job_id", admitted.record["id"])  # the access log names it (api/metrics.py); n choices: the first
    return admitted
