"""Cluster-wide counters in one Redis hash (jobs finished by status, coalesced jobs, cache hits
and misses): every process bumps them, the API's /metrics reads them."""
from __future__ import annotations

import redis

from common.keys import Keys


class Counters:
    def __init__(self, client: redis.Redis, keys: Keys):
        self.r = client
        self.keys = keys

    def count(self, name: str, by: int = 1) -> None:
        self.r.hincrby(self.keys.stats, name, by)

    def read(self) -> dict[str, int]:
        return {name: int(value) for name, value in self.r.hgetall(self.keys.stats).items()}
