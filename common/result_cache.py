"""The result cache: the answer to a deterministic request, by request digest (model, prompt
token ids, sampling; common/admission.py computes it), kept `cache_ttl_s` so an identical request
is answered without a worker."""
from __future__ import annotations

import json
from typing import Any

import redis

from common.counters import Counters
from common.keys import Keys


class ResultCache:
    def __init__(self, client: redis.Redis, keys: Keys, counters: Counters, ttl_s: int):
        self.r = client
        self.keys = keys
        self.counters = counters
        self.ttl_s = ttl_s

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def get(self, digest: str) -> dict[str, Any] | None:
        """The cached answer (text, finish_reason, token counts), or None; counted as a hit or miss."""
        value = self.r.get(self.keys.cache(digest))
        self.counters.count("cache_hits" if value else "cache_misses")
        return json.loads(value) if value else None

    def put(self, digest: str, result: dict[str, Any]) -> None:
        if self.enabled:
            self.r.set(self.keys.cache(digest), json.dumps(result), ex=self.ttl_s)
