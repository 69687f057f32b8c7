"""Webhooks: signed HTTP callbacks when a subject (a job, a batch) reaches an event.

The public API is subject-agnostic; a job and a batch use it alike:
- `validate_webhook_url(url, settings) -> url`, raising `WebhookUrlError` (a 422/400 at the API);
- `Webhooks(settings, redis).enqueue(subject_id, event_type, data, url)` records a delivery on the
  subject and queues it for `python -m worker.control`, once per (subject, event type);
- `Webhooks.view(subject_id, url, events)`: what a client sees (attempts, last outcome, state).

A delivery is a Redis hash (`Keys.webhook`) holding the signed body, fixed when the event happens
so every retry sends the same bytes under the same `webhook-id`; a subject's deliveries are
indexed by event type (`Keys.webhooks_of`). Both live as long as a job record (`job_ttl_s`).
Enqueuing is all the model worker and the API do: sending happens on the control queue, so
generation never waits on a slow receiver. The attempt number fences writes: a delivery message
that Redis hands out twice records (and schedules) at most one outcome per attempt.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import redis

from common.keys import Keys
from common.lua import script
from common.openai_models import Usage
from common.settings import Settings
from common.webhook_rules import WebhookUrlError, validate_webhook_url as _validate_url

log = logging.getLogger(__name__)

WEBHOOK_QUEUE = "webhooks"  # the control queue deliveries travel on (Keys.control_queue)
JOB_EVENTS = ("start", "completed")  # a worker began the job; the job ended, in any final status
DEFAULT_JOB_EVENTS = ("completed",)
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
_INT, _FLOAT = ("attempts", "last_status_code"), ("created_at", "last_attempt_at", "next_attempt_at")

__all__ = ["WebhookUrlError", "validate_webhook_url", "Webhooks", "job_webhook_hook", "JOB_EVENTS",
           "DEFAULT_JOB_EVENTS", "WEBHOOK_QUEUE"]


def validate_webhook_url(url: str, settings: Settings) -> str:
    """The URL, if a webhook may be sent to it under these settings; else WebhookUrlError (whose
    message tells the client why). Webhooks are off without a signing secret."""
    if not settings.webhook_secrets.strip():
        raise WebhookUrlError("webhooks are not enabled on this server (no signing secret is set)")
    return _validate_url(url, settings.webhook_allow_networks, settings.webhook_dns_timeout_s)


class Webhooks:
    """Deliveries in Redis, and the one way to queue one."""

    def __init__(self, settings: Settings, client: redis.Redis, celery=None):
        self.settings = settings
        self.r = client
        self.keys = Keys(settings.namespace)
        self._celery = celery
        self._create = script(client, "webhook_create")
        self._record = script(client, "webhook_record_attempt")

    @property
    def celery(self):
        if self._celery is None:
            from common.celery_app import make_celery

            self._celery = make_celery(self.settings)
        return self._celery

    def enqueue(self, subject_id: str, event_type: str, data: dict[str, Any], url: str) -> str | None:
        """Record a delivery of `event_type` (e.g. 'job.completed', 'batch.completed') carrying
        `data` to `url`, on the subject `subject_id`, and queue its first attempt. Returns the
        delivery id (its `webhook-id`), or None when this subject already has that event (a
        repeated call is harmless). The body is Standard Webhooks' `{type, timestamp, data}`."""
        delivery_id = f"msg_{uuid.uuid4().hex}"
        now = time.time()
        body = json.dumps({"type": event_type, "timestamp": _iso(now), "data": data})
        fields = {"id": delivery_id, "subject": subject_id, "type": event_type, "url": url,
                  "body": body, "created_at": now, "state": PENDING, "attempts": 0,
                  "next_attempt_at": now}
        created = self._create(keys=[self.keys.webhooks_of(subject_id), self.keys.webhook(delivery_id)],
                               args=[event_type, delivery_id, self.settings.job_ttl_s, *_flat(fields)])
        if not created:
            return None
        from common.celery_app import TASK_DELIVER_WEBHOOK

        try:
            self.celery.send_task(TASK_DELIVER_WEBHOOK, args=[delivery_id, 1], task_id=delivery_id,
                                  queue=self.keys.control_queue(WEBHOOK_QUEUE))
        except Exception as exc:  # the broker is away: say so on the subject rather than hang
            log.warning("webhook %s for %s could not be queued: %s", event_type, subject_id, exc)
            self.r.hset(self.keys.webhook(delivery_id), mapping={
                "state": FAILED, "last_error": "could not be queued (broker unreachable)"})
        return delivery_id

    def get(self, delivery_id: str) -> dict[str, Any] | None:
        raw = self.r.hgetall(self.keys.webhook(delivery_id))
        return _decode(raw) if raw else None

    def record_attempt(self, delivery_id: str, attempt: int, **fields: Any) -> bool:
        """Write attempt `attempt`'s outcome (state, last_status_code, last_error, next_attempt_at);
        False if that attempt was already recorded or the delivery has ended."""
        return self._record(keys=[self.keys.webhook(delivery_id)],
                            args=[attempt, self.settings.job_ttl_s, *_flat(fields)]) == 1

    def deliveries(self, subject_id: str) -> list[dict[str, Any]]:
        """The subject's deliveries, oldest first, without their bodies."""
        ids = self.r.hvals(self.keys.webhooks_of(subject_id))
        pipe = self.r.pipeline(transaction=False)
        for delivery_id in ids:
            pipe.hgetall(self.keys.webhook(delivery_id))
        found = [_decode(raw) for raw in pipe.execute() if raw]
        for delivery in found:
            delivery.pop("body", None)
            delivery.pop("subject", None)
        return sorted(found, key=lambda d: d.get("created_at", 0))

    def view(self, subject_id: str, url: str, events: list[str]) -> dict[str, Any]:
        """The subject's `webhook` object: the latest delivery's state, attempts and last outcome
        on top (state 'waiting' before any event happened), every delivery below."""
        deliveries = self.deliveries(subject_id)
        last = deliveries[-1] if deliveries else {}
        return {"url": url, "events": events, "state": last.get("state", "waiting"),
                "attempts": last.get("attempts", 0), "last_status_code": last.get("last_status_code"),
                "last_error": last.get("last_error"), "deliveries": deliveries}


# --- jobs ------------------------------------------------------------------------------------
def webhook_events_of(record: dict[str, Any]) -> list[str]:
    """The events a job's webhook is sent for, as stored in its record."""
    return (record.get("webhook_events") or ",".join(DEFAULT_JOB_EVENTS)).split(",")


def job_event_data(record: dict[str, Any]) -> dict[str, Any]:
    """A job as a webhook carries it: final status, text, usage and timestamps."""
    return {"id": record["id"], "object": "job", "status": record.get("status"),
            "model": record.get("model"), "created_at": record.get("created_at"),
            "started_at": record.get("started_at"), "finished_at": record.get("finished_at"),
            "text": record.get("text", ""), "finish_reason": record.get("finish_reason"),
            "error": record.get("error"), "cached": record.get("cached", False),
            "usage": Usage.of(record).model_dump()}


def job_webhook_hook(webhooks: Webhooks):
    """The token log's hook (`on_event(event, record)`, common/token_log.py) that queues a job's
    webhook deliveries."""
    def on_event(event: str, record: dict[str, Any]) -> None:
        url = record.get("webhook")
        if url and event in webhook_events_of(record):
            webhooks.enqueue(record["id"], f"job.{event}", job_event_data(record), url)
    return on_event


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def _flat(fields: dict[str, Any]) -> list[str]:
    flat: list[str] = []
    for name, value in fields.items():
        flat += [name, "" if value is None else str(value)]
    return flat


def _decode(raw: dict[str, str]) -> dict[str, Any]:
    record: dict[str, Any] = {k: (v if v != "" else None) for k, v in raw.items()}
    for name in _INT:
        if record.get(name) is not None:
            record[name] = int(record[name])
    for name in _FLOAT:
        if record.get(name) is not None:
            record[name] = float(record[name])
    return record
