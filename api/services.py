"""What request handlers need (Redis, job store, Celery, the model's prompt builder), built once
per app and kept in `app.extensions['llmq']`."""
from __future__ import annotations

import threading
import time

from celery import Celery
from flask import current_app
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from api.errors import ApiError
from api.queue_places import QueuePlaces
from api.ratelimit import RateLimiter
from api.stream_limits import StreamLimits
from api.wakeups import JobWakeups
from common.batches import BatchStore
from common.files import FileStore
from common.jobs import JobStore
from common.keys import Keys
from common.models import ModelRef, ModelUnavailable, resolve_model
from common.prompting import PromptBuilder
from common.redis_client import redis_client
from common.settings import Settings
from common.webhooks import Webhooks, job_webhook_hook


class Services:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.keys = Keys(settings.namespace)
        # Few, short retries: a blip is absorbed, but while Redis is down or a Sentinel failover is
        # under way a request gets its 503 + Retry-After within a second instead of hanging.
        # Under gevent thousands of requests share the process: past 512 connections a caller waits
        # for one (a few seconds at most, then 503) rather than opening a socket each.
        self.redis = redis_client(settings, wait_for_connection_s=5, decode_responses=True,
                                  socket_connect_timeout=2, socket_timeout=30, health_check_interval=30,
                                  max_connections=512,
                                  retry=Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.05), 3))
        self.webhooks = Webhooks(settings, self.redis)
        self.store = JobStore(self.redis, self.keys, settings.job_ttl_s, settings.events_maxlen,
                              on_event=job_webhook_hook(self.webhooks))
        self.limits = RateLimiter(self.redis, self.keys, settings)
        self.wakeups = JobWakeups(self.redis, self.keys)
        self.places = QueuePlaces(self.store, settings.queue_place_interval_s, settings.queue_place_every_s)
        self.streams = StreamLimits(self.redis, self.keys, settings)
        self.files = FileStore(self.redis, self.keys, settings.file_ttl_s)
        self.batches = BatchStore(self.redis, self.keys, settings.batch_ttl_s)
        self._lock = threading.Lock()
        self._model: tuple[ModelRef, PromptBuilder] | None = None
        self._swept_at = 0.0

    def sweep_expired(self) -> None:
        """Expire queued jobs past their deadline, at most once a second per process: a burst of
        thousands of submissions needs one sweep, not one each (workers sweep on their own too)."""
        now = time.monotonic()
        if now - self._swept_at >= 1.0:
            self._swept_at = now
            self.store.sweep_expired()

    @property
    def celery(self) -> Celery:
        return self.webhooks.celery  # one Celery app per process, built on first use

    def model(self) -> tuple[ModelRef, PromptBuilder]:
        """The served model and its prompt builder; 503 until a worker has prepared the model."""
        with self._lock:
            if self._model is None:
                try:
                    ref = resolve_model(self.settings, prepare=False)
                except ModelUnavailable as exc:
                    raise ApiError(503, "model_unavailable", str(exc), {"Retry-After": "10"})
                self._model = (ref, PromptBuilder(ref.path, self.settings.max_model_len))
            return self._model


def services() -> Services:
    return current_app.extensions["llmq"]
