"""Per-key rate limits, kept in Redis so that every API process shares them.

- Submissions per minute: a sliding-window log (one sorted-set member per submission in the last
  60 s); a submission over the limit gets 429 with `Retry-After` = when the oldest one leaves.
- Concurrent jobs: a sorted set of the key's job ids that may still be queued or running; when it
  looks full, members whose job has ended (or whose record never appeared) are dropped first.
Each check is one Lua script (common/lua/rate_*.lua), so concurrent API processes cannot both
take the last slot.
"""
from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from common.api_keys import ApiKey
from common.errors import ApiError
from common.keys import Keys
from common.lua import script
from common.settings import Settings

WINDOW_S = 60
CONCURRENT_RETRY_AFTER_S = 5


class RateLimiter:
    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings):
        self.keys = keys
        self.settings = settings
        self._hit = script(client, "rate_hit")
        self._acquire = script(client, "rate_acquire_job_slot")
        self.r = client

    def check_rate(self, key: ApiKey | None) -> None:
        """Count one submission of `key`; 429 if it made `rpm` in the last minute."""
        limit = self._limit(key, "rpm")
        if not limit:
            return
        wait = self._hit(keys=[self.keys.rate(key.id)],
                         args=[time.time(), WINDOW_S, limit, uuid.uuid4().hex])
        if wait is not None:
            raise ApiError(429, "rate_limited", f"this key may submit {limit} jobs per minute",
                           {"Retry-After": str(max(1, math.ceil(float(wait))))})

    @contextmanager
    def concurrency_slot(self, key: ApiKey | None, job_id: str) -> Iterator[None]:
        """Hold one of `key`'s concurrent-job slots for `job_id` (429 if none is free); the slot
        is given back if the body raises (the job was not queued), else when the job ends."""
        limit = self._limit(key, "concurrent")
        if not limit:
            yield
            return
        acquired = self._acquire(keys=[self.keys.active(key.id)],
                                 args=[limit, job_id, self.keys.job(""), self.settings.job_ttl_s,
                                       time.time()])
        if not acquired:
            raise ApiError(429, "too_many_concurrent_jobs",
                           f"this key already has {limit} jobs queued or running; wait for one to end",
                           {"Retry-After": str(CONCURRENT_RETRY_AFTER_S)})
        try:
            yield
        except BaseException:
            self.r.zrem(self.keys.active(key.id), job_id)
            raise

    def _limit(self, key: ApiKey | None, name: str) -> int:
        if key is None:
            return 0
        own = getattr(key, name)
        return own if own is not None else getattr(self.settings, f"rate_limit_{name}")
