"""How llmq's background work rides out a Redis outage: one policy for every retry loop.

The Redis client itself retries a few times within a fraction of a second (common/redis_client.py)
and then fails fast, so that the API can answer 503 at once. Work that must not be dropped (a
running job's writes) or that must come back by itself (a listener) waits longer, on this
policy: a delay that doubles from a short first wait up to a cap, so a blip costs little and a
long outage costs Redis a few calls a second at most.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_DELAY_S = 0.2  # the first wait after a failed call
MAX_DELAY_S = 2.0  # the wait stops doubling here


class Backoff:
    """The waits between tries: `first_s`, doubling up to `MAX_DELAY_S`; `reset` once Redis answers."""

    def __init__(self, first_s: float = FIRST_DELAY_S):
        self.first_s = first_s
        self._delay = first_s

    def next(self) -> float:
        """The wait before the next try (each call doubles the one after)."""
        delay = self._delay
        self._delay = min(delay * 2, MAX_DELAY_S)
        return delay

    def reset(self) -> None:
        self._delay = self.first_s


def retrying(call: Callable[[], T], within_s: float) -> T:
    """`call()`, tried again on a Redis error for up to `within_s` seconds (`LLMQ_REDIS_RETRY_S`
    for a worker's writes); the last error is raised when the next wait would pass that."""
    give_up = time.monotonic() + within_s
    backoff = Backoff()
    while True:
        try:
            return call()
        except redis.RedisError as exc:
            delay = backoff.next()
            if time.monotonic() + delay > give_up:
                raise
            log.warning("Redis unavailable (%s); retrying in %.1f s", exc, delay)
            time.sleep(delay)
