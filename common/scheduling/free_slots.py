"""How many more jobs this worker can start now, kept in Redis for the other workers' picks: a job
is left for a worker that caches its prompt's start only while that worker has room
(common/scheduling/prefix_affinity.py)."""
from __future__ import annotations

import logging
import threading

import redis

log = logging.getLogger(__name__)


class FreeSlots:
    """A hint, not a reservation: a write that fails is logged and skipped (the next change or
    heartbeat writes it again), and a worker that died leaves a value that lapses with `ttl_s`."""

    def __init__(self, client: redis.Redis, key: str, slots: int, ttl_s: int):
        self.r, self.key, self.slots, self.ttl_s = client, key, slots, ttl_s
        self._held = 0
        self._lock = threading.Lock()

    def taken(self) -> None:
        self._change(+1)

    def released(self) -> None:
        self._change(-1)

    def publish(self) -> None:
        """Write the number again (each heartbeat, so an idle worker's does not lapse)."""
        self._change(0)

    def forget(self) -> None:
        """On a clean shutdown: other workers stop leaving jobs for this one at once."""
        try:
            self.r.delete(self.key)
        except redis.RedisError as exc:
            log.warning("could not clear the free-slot count: %s", exc)

    def _change(self, by: int) -> None:
        with self._lock:
            self._held += by
            free = max(0, self.slots - self._held)
            try:
                self.r.set(self.key, free, ex=self.ttl_s)
            except redis.RedisError as exc:
                log.warning("could not publish the free-slot count: %s", exc)
