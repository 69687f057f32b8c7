"""Bounds on open streams, so that a client over them hears so at once instead of waiting.

A stream is anything that holds a connection while it follows a job: an SSE event stream, an
OpenAI stream, an OpenAI request waiting for its whole answer. Two bounds, checked before a job is
queued:
- per API process (`max_streams_per_process`): a counter in the process; over it, 503 with
  Retry-After, since the server, not the client, is out of room;
- per API key (`max_streams_per_key`, or the key's `streams=N`), across every API process: a
  sorted set of leases in Redis, one per open stream, scored by when it lapses. An open stream
  renews its lease as it relays (at least every heartbeat), so the leases of an API process that
  died lapse on their own. Over it, 429 with Retry-After. Anonymous callers (auth off) have only
  the per-process bound.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import ContextManager, TypeVar

import redis

from common.api_keys import ApiKey
from common.errors import ApiError
from common.keys import Keys
from common.lua import script
from common.settings import Settings

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
T = TypeVar("T")

class StreamSlot:
    """One open stream's place under the bounds, and what else the stream holds until it ends
    (`hold`); `release` (idempotent) gives it all back."""

    def __init__(self, limits: "StreamLimits", lease_key: str | None, token: str):
        self._limits, self._lease_key, self._token = limits, lease_key, token
        self._renewed_at = time.monotonic()
        self._released = False
        self._held = ExitStack()

    def hold(self, context: ContextManager[T]) -> T:
        """Enter `context` now and leave it when the slot is released (the stream's response
        closes, or the request fails before it opens)."""
        return self._held.enter_context(context)

    def held(self, events: Iterator[T]) -> Iterator[T]:
        """`events`, renewing the key's lease as they pass (a relay yields at least a
        heartbeat every `sse_heartbeat_s`, well inside the lease)."""
        for item in events:
            if self._lease_key and time.monotonic() - self._renewed_at > self._limits.lease_s / 3:
                self._renewed_at = time.monotonic()
                self._limits.renew(self._lease_key, self._token)
            yield item

    @contextmanager
    def guard(self) -> Iterator["StreamSlot"]:
        """This slot, given back if the block raises (no stream was opened after all)."""
        try:
            yield self
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if not self._released:
            self._released = True
            try:
                self._held.close()
            finally:
                self._limits.release(self._lease_key, self._token)


class StreamLimits:
    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings):
        self.r, self.keys, self.settings = client, keys, settings
        self.lease_s = max(3 * settings.sse_heartbeat_s, 30.0)
        self._acquire = script(client, "stream_lease_acquire")
        self._lock = threading.Lock()
        self._open = 0

    @property
    def open(self) -> int:
        """Streams this process holds now."""
        return self._open

    def acquire(self, key: ApiKey | None) -> StreamSlot:
        """A slot for one more stream of `key`; ApiError 503 or 429 (with Retry-After) if a bound
        is reached. Give it back with `release` (a Flask response: `call_on_close`)."""
        with self._lock:
            if self._open >= self.settings.max_streams_per_process:
                raise ApiError(503, "too_many_streams", f"this API process holds its limit of "
                               f"{self.settings.max_streams_per_process} open streams; retry shortly",
                               {"Retry-After": str(RETRY_AFTER_S)})
            self._open += 1
        token, lease_key = uuid.uuid4().hex, None
        try:
            limit = self._key_limit(key)
            if limit:
                lease_key = self.keys.stream_leases(key.id)
                if not self._acquire(keys=[lease_key], args=[time.time(), limit, self.lease_s, token]):
                    raise ApiError(429, "too_many_streams", f"this key already has {limit} open "
                                   "streams; close one or retry shortly", {"Retry-After": str(RETRY_AFTER_S)})
        except BaseException:
            with self._lock:
                self._open -= 1
            raise
        return StreamSlot(self, lease_key, token)

    def renew(self, lease_key: str, token: str) -> None:
        try:
            self.r.zadd(lease_key, {token: time.time() + self.lease_s}, xx=True)
            self.r.expire(lease_key, int(self.lease_s) + 1)
        except redis.RedisError as exc:  # the stream goes on; at worst its lease lapses early
            log.warning("could not renew a stream lease: %s", exc)

    def release(self, lease_key: str | None, token: str) -> None:
        with self._lock:
            self._open -= 1
        if lease_key:
            try:
                self.r.zrem(lease_key, token)
            except redis.RedisError as exc:  # it lapses on its own
                log.warning("could not release a stream lease: %s", exc)

    def _key_limit(self, key: ApiKey | None) -> int:
        if key is None:
            return 0
        return key.streams if key.streams is not None else self.settings.max_streams_per_key
