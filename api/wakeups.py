"""One pub/sub listener per API process, waking the SSE relays of the jobs they follow.

A job's log growth is announced on its channel (`Keys.channel`). Rather than one Redis connection
and subscription per open stream (a connect, a subscribe and a disconnect per request, and a
socket per stream to wait on), one thread subscribes to the pattern of every job channel of the
namespace and wakes whichever relays follow the job named in each message.

A relay registers before it reads the log and clears its wake-up before each read, so a chunk
written in between is never waited for in vain. Anything published while the listener is not
subscribed (starting, or reconnecting after Redis went away) is missed, so each time it has
subscribed it wakes every relay to read again. The thread ends once no relay has followed a job
for `linger_s`, and the next relay starts a new one.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from common.keys import Keys

log = logging.getLogger(__name__)


class JobWakeups:
    def __init__(self, client: redis.Redis, keys: Keys, linger_s: float = 10.0, poll_s: float = 1.0):
        self._client = client
        head, _, tail = keys.channel("\0").partition("\0")
        self._pattern = _glob_escape(head) + "*" + _glob_escape(tail)
        self._head, self._tail = head, tail
        self._linger_s, self._poll_s = linger_s, poll_s
        self._followers: dict[str, set[threading.Event]] = {}
        self._lock = threading.Lock()
        self._listening = False

    @contextmanager
    def follow(self, job_id: str) -> Iterator[threading.Event]:
        """An event set whenever the job's log may have grown (and when the listener was away)."""
        woken = threading.Event()
        with self._lock:
            self._followers.setdefault(job_id, set()).add(woken)
            if not self._listening:
                self._listening = True
                threading.Thread(target=self._listen, name="sse-wakeups", daemon=True).start()
        try:
            yield woken
        finally:
            with self._lock:
                followers = self._followers.get(job_id, set())
                followers.discard(woken)
                if not followers:
                    self._followers.pop(job_id, None)

    @property
    def listening(self) -> bool:
        """Whether this process's listener thread runs (for tests and diagnostics)."""
        return self._listening

    def _listen(self) -> None:
        idle_since, delay = None, 0.1
        while True:
            pubsub = self._client.pubsub()
            try:
                pubsub.psubscribe(self._pattern)
                while True:
                    message = pubsub.get_message(timeout=self._poll_s) or {"type": None}
                    if message["type"] == "pmessage":
                        self._wake(message["channel"][len(self._head):-len(self._tail) or None])
                    elif message["type"] == "psubscribe":
                        delay = 0.1
                        self._wake_all()  # what was published before now was not heard
                    if self._followers:
                        idle_since = None
                        continue
                    idle_since = idle_since or time.monotonic()
                    if self._end_if_unfollowed(time.monotonic() - idle_since >= self._linger_s):
                        return
            except Exception as exc:  # never die silently: relays would wait for their heartbeats
                if isinstance(exc, redis.RedisError):
                    log.warning("SSE wake-up listener lost Redis (%s); again in %.1f s", exc, delay)
                else:
                    log.exception("SSE wake-up listener failed; again in %.1f s", delay)
                self._wake_all()  # relays read the log themselves, and end if Redis is away
                if self._end_if_unfollowed(True):  # nobody left to wake: stop retrying
                    return
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            finally:
                try:
                    pubsub.close()
                except redis.RedisError:
                    pass

    def _end_if_unfollowed(self, may_end: bool) -> bool:
        """End the listener (True) if it may and no relay follows a job; the next `follow` starts
        a new one. Decided under the lock `follow` registers under, so no relay is left unheard."""
        with self._lock:
            if may_end and not self._followers:
                self._listening = False
                return True
            return False

    def _wake(self, job_id: str) -> None:
        with self._lock:
            for woken in self._followers.get(job_id, ()):
                woken.set()

    def _wake_all(self) -> None:
        with self._lock:
            for followers in self._followers.values():
                for woken in followers:
                    woken.set()


def _glob_escape(text: str) -> str:
    """`text` matched literally in a Redis glob pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
