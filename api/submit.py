"""Admission: a validated request becomes a cached answer or a queued job.

Shared by the jobs API and the OpenAI-compatible endpoints.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid

from api.auth import allowed_priority, current_key
from api.errors import ApiError
from api.offload import off_the_loop
from api.services import Services
from common.celery_app import TASK_GENERATE, task_options
from common.prompting import TemplateError
from common.schemas import JobRequest, JobStatus
from common.webhooks import DEFAULT_JOB_EVENTS, WebhookUrlError, validate_webhook_url


def submit_job(svc: Services, req: JobRequest) -> tuple[int, dict]:
    """Returns (HTTP status, job record): 200 for a cache hit, 202 for a queued job.
    The caller's API key (if auth is on) owns the job and is held to its rate limits."""
    key = current_key()
    priority = allowed_priority(req.priority)
    webhook = _webhook_fields(svc, req)
    svc.limits.check_rate(key)
    fields, digest = prepare_job(svc, req, key.id if key else None, priority)
    fields.update(webhook)
    hit = svc.store.cache_get(digest) if digest and svc.settings.cache_ttl_s > 0 else None
    if hit is not None:
        return 200, _answer_from_cache(svc, fields, hit)

    fields.update(status=JobStatus.QUEUED.value, cache_key=digest,
                  **_deadlines(svc, req, fields["created_at"]))
    job_id = fields["id"]
    coalesce = digest if svc.settings.coalesce else None
    svc.sweep_expired()
    with svc.limits.concurrency_slot(key, job_id):
        if coalesce and svc.store.attach(job_id, fields, coalesce):
            return 202, svc.store.get(job_id)  # rides on an identical queued or running job

        def create() -> bool:
            return svc.store.create(job_id, fields, svc.settings.max_queue,
                                    weight=key.weight if key else 1.0, digest=coalesce)
        # a full queue may be full of jobs past their deadline: they leave it, and we count again
        if not create() and not (svc.store.sweep_expired() and create()):
            raise ApiError(429, "queue_full", f"{svc.settings.max_queue} jobs are already waiting; "
                                              "retry later", {"Retry-After": str(_retry_after(svc))})
        _send_ticket(svc, job_id, fields)
    return 202, svc.store.get(job_id)


def prepare_job(svc: Services, req: JobRequest, owner: str | None, priority: str) -> tuple[dict, str | None]:
    """Everything a job record needs from a validated request: the model check, the prompt's
    tokens, sampling within the context (ApiError otherwise). Returns (fields, digest); the
    digest names identical requests, for the result cache and for coalescing (None: not
    deterministic or cache off)."""
    model, builder = svc.model()
    if req.model not in (None, model.name):
        raise ApiError(404, "model_not_found", f"model {req.model!r} is not served here; "
                                               f"this deployment serves {model.name!r}")
    messages = [m.model_dump() for m in req.messages] if req.messages else None
    try:
        _, prompt_ids = off_the_loop(builder.build, messages, req.prompt)
    except TemplateError as exc:
        raise ApiError(422, "validation_error", f"messages: {exc}")
    sampling = _sampling_within_context(svc, req, len(prompt_ids), builder.context_length)
    digest = _cache_key(model.name, prompt_ids, sampling) if req.cache and req.deterministic else None
    fields = {
        "id": uuid.uuid4().hex, "model": model.name, "created_at": time.time(),
        "prompt_tokens": len(prompt_ids), "queue": svc.keys.queue(model.name),
        "request": {"prompt_token_ids": prompt_ids, "sampling": sampling},
        "owner": owner, "priority": priority,
        "max_tokens": sampling["max_tokens"],  # read on its own by the ETAs (common/eta.py)
    }
    return fields, digest


def submit_batch_line(svc: Services, job_id: str, fields: dict, digest: str | None, *,
                      weight: float, queued_key: str, deadline: float) -> None:
    """Admit one line of a batch as job `job_id` (see common/batches.py): like `submit_job`
    (cache, coalescing, the fair queue, the same workers) but at the "batch" level, outside the
    interactive admission bound and per-key limits, and never as the job others coalesce onto
    (an interactive request must not wait at batch priority). Idempotent: a job that exists is
    left as it is, except that a queued one gets another ticket (one may have been lost when the
    caller died between creating the job and sending it; a spare ticket does nothing)."""
    record = svc.store.get(job_id)
    if record is not None:
        if record.get("status") == JobStatus.QUEUED.value and not record.get("coalesced_into"):
            _send_ticket(svc, job_id, record, spare=True)
        return
    fields = {**fields, "id": job_id, "created_at": time.time(), "priority": "batch"}
    hit = svc.store.cache_get(digest) if digest and svc.settings.cache_ttl_s > 0 else None
    if hit is not None:
        _answer_from_cache(svc, fields, hit)
        return
    fields.update(status=JobStatus.QUEUED.value, cache_key=digest, queue_deadline=deadline,
                  run_timeout_s=svc.settings.run_timeout_s or None)
    if digest and svc.settings.coalesce and svc.store.attach(job_id, fields, digest):
        return
    svc.store.create(job_id, fields, 0, weight=weight, queued_key=queued_key)
    _send_ticket(svc, job_id, fields, spare=True)


def send_spare_ticket(svc: Services, record: dict) -> None:
    """One more ticket for a queued job's model queue (see `_send_ticket`)."""
    _send_ticket(svc, record["id"], record, spare=True)


def _send_ticket(svc: Services, job_id: str, fields: dict, spare: bool = False) -> None:
    """The Celery message: a ticket for the model's fair queue (common/fair_queue.py). A spare
    ticket (a batch line's, possibly sent twice) gets a task id of its own, since a ticket's id
    maps to the job it took; and its failure leaves the job queued for the batch's next pass."""
    options = task_options(svc.settings, job_id, fields["model"])
    if spare:
        options["task_id"] = uuid.uuid4().hex
    try:
        svc.celery.send_task(TASK_GENERATE, args=[job_id, fields["model"]], queue=fields["queue"],
                             **options)
    except Exception:
        if not spare:
            svc.store.finish(job_id, JobStatus.FAILED, finish_reason="error",
                             error={"type": "enqueue_failed", "message": "could not reach the broker"})
        raise


def _webhook_fields(svc: Services, req: JobRequest) -> dict:
    """The job record's webhook fields, once the URL is known to be allowed (a 422 naming the
    field otherwise; the OpenAI endpoints answer it as a 400 with `param`)."""
    if req.webhook is None:
        return {}
    try:
        url = validate_webhook_url(req.webhook, svc.settings)
    except WebhookUrlError as exc:
        raise ApiError(422, "validation_error", f"webhook: {exc}", param="webhook",
                       details=[{"field": "webhook", "message": str(exc)}])
    events = list(dict.fromkeys(req.webhook_events or DEFAULT_JOB_EVENTS))
    return {"webhook": url, "webhook_events": ",".join(events)}


def _deadlines(svc: Services, req: JobRequest, now: float) -> dict:
    """The job's queue deadline (epoch s) and run limit (s): the request may only shorten the
    server's limits (0 there: none)."""
    queue_s = min(filter(None, (req.queue_timeout, svc.settings.queue_timeout_s)), default=None)
    run_s = min(filter(None, (req.run_timeout, svc.settings.run_timeout_s)), default=None)
    return {"queue_deadline": now + queue_s if queue_s else None, "run_timeout_s": run_s}


def _sampling_within_context(svc: Services, req: JobRequest, prompt_tokens: int, context: int) -> dict:
    settings = svc.settings
    if req.max_tokens > settings.max_tokens_cap:
        raise ApiError(422, "validation_error",
                       f"max_tokens: at most {settings.max_tokens_cap} (got {req.max_tokens})")
    room = context - prompt_tokens
    if room < 1:
        raise ApiError(413, "context_length_exceeded",
                       f"the prompt has {prompt_tokens} tokens; the model's context is {context}")
    max_tokens = req.max_tokens if "max_tokens" in req.model_fields_set else settings.default_max_tokens
    if max_tokens > room:
        if "max_tokens" in req.model_fields_set:
            raise ApiError(413, "context_length_exceeded",
                           f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the "
                           f"model's context of {context}; lower max_tokens to {room} or less")
        max_tokens = room
    sampling = req.sampling().model_dump()
    sampling["max_tokens"] = max_tokens
    return sampling


def _cache_key(model: str, prompt_ids: list[int], sampling: dict) -> str:
    blob = json.dumps({"model": model, "prompt": prompt_ids, "sampling": sampling}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _answer_from_cache(svc: Services, fields: dict, hit: dict) -> dict:
    now = time.time()
    fields.update(status=JobStatus.SUCCEEDED.value, cached=True, started_at=now, finished_at=now,
                  text=hit["text"], finish_reason=hit["finish_reason"],
                  completion_tokens=hit["completion_tokens"])
    job_id = fields["id"]
    svc.store.create_finished(job_id, fields)
    svc.store.append_event(job_id, "chunk", {"index": 0, "text": hit["text"]})
    svc.store.publish_done(job_id)
    return svc.store.get(job_id)


def _retry_after(svc: Services) -> int:
    """Seconds until the queue has likely drained below its limit, from measured worker rates."""
    from api.eta import queue_retry_after

    return queue_retry_after(svc)
