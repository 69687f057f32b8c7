"""llmq's Redis-backed state, built once per process: job records, token logs, the fair queue, the
worker registry, where models are loaded, the result cache, counters, files, batches, webhook deliveries, and the Celery
app that sends tickets and deliveries. The API, the model workers and the control worker each
build one `Stores`, so every process talks to Redis with one client and one set of timeouts
(common/redis_client.py)."""
from __future__ import annotations

from celery import Celery

from common.batches import BatchStore
from common.counters import Counters
from common.files import FileStore
from common.jobs import JobStore
from common.keys import Keys
from common.model_loads import ModelLoads
from common.redis_client import redis_client
from common.result_cache import ResultCache
from common.scheduling.fair_queue import FairQueue
from common.settings import Settings
from common.token_log import TokenLog
from common.webhooks import Webhooks, job_webhook_hook
from common.worker_registry import WorkerRegistry


class Stores:
    def __init__(self, settings: Settings, celery: Celery | None = None, **redis_options):
        """`celery`: the process's own app where it has one (a worker's); otherwise one is built on
        first use. `redis_options`: pool sizing for this process (see `redis_client`)."""
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.redis = redis_client(settings, **redis_options)
        self.webhooks = Webhooks(settings, self.redis, celery=celery)
        self.counters = Counters(self.redis, self.keys)
        self.fair = FairQueue(self.redis, self.keys, settings.job_ttl_s)
        self.token_log = TokenLog(self.redis, self.keys, settings.job_ttl_s, settings.events_maxlen,
                                  on_event=job_webhook_hook(self.webhooks))
        self.jobs = JobStore(self.redis, self.keys, settings.job_ttl_s, self.token_log, self.fair, self.counters)
        self.registry = WorkerRegistry(self.redis, self.keys, self.fair)
        self.model_loads = ModelLoads(self.redis, self.keys)
        self.cache = ResultCache(self.redis, self.keys, self.counters, settings.cache_ttl_s)
        self.files = FileStore(self.redis, self.keys, settings.file_ttl_s)
        self.batches = BatchStore(self.redis, self.keys, settings.batch_ttl_s)

    @property
    def celery(self) -> Celery:
        return self.webhooks.celery
