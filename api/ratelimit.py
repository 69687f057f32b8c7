"""Per-key rate limits, kept in Redis so that every API process shares them.

- Submissions per minute: a sliding-window log (one sorted-set member per submission in the last
  60 s); a submission over the limit gets 429 with `Retry-After` = when the oldest one leaves.
- Concurrent jobs: a sorted set of the key's job ids that may still be queued or running; when it
  looks full, members whose job has ended (or whose record never appeared) are dropped first.
Each check is one Lua script, so concurrent API processes cannot both take the last slot.
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
from common.settings import Settings

WINDOW_S = 60
CONCURRENT_RETRY_AFTER_S = 5

_HIT = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tostring(tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('EXPIRE', KEYS[1], window)
return false
"""

_ACQUIRE = """
local limit, now = tonumber(ARGV[1]), tonumber(ARGV[5])
if redis.call('ZCARD', KEYS[1]) >= limit then
  local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #members, 2 do
    local id, since = members[i], tonumber(members[i + 1])
    local st = redis.call('HGET', ARGV[3] .. id, 'status')
    if (st and st ~= 'queued' and st ~= 'running') or (not st and since < now - 60) then
      redis.call('ZREM', KEYS[1], id)
    end
  end
  if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


class RateLimiter:
    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings):
        self.keys = keys
        self.settings = settings
        self._hit = client.register_script(_HIT)
        self._acquire = client.register_script(_ACQUIRE)
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
