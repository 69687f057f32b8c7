"""One pub/sub listener per API process, waking the SSE relays of the jobs they watch.

A job's log growth is announced on its channel (`Keys.channel`; the format: common/token_log.py).
Rather than one Redis connection and subscription per open stream (a connect, a subscribe and a
disconnect per request, and a socket per stream to wait on), one thread subscribes to the pattern
of every job channel of the namespace and wakes whichever relays watch the job named in each
message.

A worker's chunk is announced with its content and the id of the entry before it; each watcher
keeps what it heard, so its relay sends the chunk without reading it back from Redis (one round
trip less per event, in the API and in Redis). Whatever was not heard with its content is read from
the log: what came before the relay watched, a message that only wakes, a gap in the chain of ids
(a message missed, or more than `max_heard` piled up).

A relay registers before it reads the log and clears its wake-up before each read, so a chunk
written in between is never waited for in vain. Anything published while the listener is not
subscribed (starting, or reconnecting after Redis went away) is missed, so each time it has
subscribed it wakes every relay to read again. The thread ends once no relay has watched a job
for `linger_s`, and the next relay starts a new one.
"""
from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
import redis

from common.keys import Keys
from common.redis_retry import Backoff
from common.token_log import Announcement, parse_announcement

log = logging.getLogger(__name__)


class JobWatcher(threading.Event):
    """One SSE relay's watch on a job. Set whenever the job's log may have grown; also keeps the
    entries heard with their content since the relay last took them, and whether anything was
    heard without (then the log must be read). The relay clears it before taking, so nothing heard
    in between goes unnoticed. While the job waits in the queue it is also set with the job's place
    in line (`tell_place`)."""

    def __init__(self, max_heard: int, read_log: bool = True):
        super().__init__()
        self._lock = threading.Lock()
        self._heard: collections.deque[Announcement] = collections.deque(maxlen=max_heard)
        self._read_log = read_log  # what was logged before it watched was not heard
        self._place: dict | None = None

    def tell_place(self, place: dict) -> None:
        """The job's `queue_position` and ETAs, for the relay to send (api/queue_places.py)."""
        with self._lock:
            self._place = place
        self.set()

    def take_place(self) -> dict | None:
        """The place told since the relay last took it, if any."""
        with self._lock:
            place, self._place = self._place, None
        return place

    def hear(self, entry: Announcement | None) -> None:
        with self._lock:
            if entry is None:
                self._read_log = True
            else:
                self._heard.append(entry)  # past `max_heard` the oldest go: the relay sees a gap
        self.set()

    def take(self) -> tuple[bool, list[Announcement]]:
        """(whether the log must be read, the entries heard with their content), oldest first."""
        with self._lock:
            read_log, self._read_log = self._read_log, False
            heard = list(self._heard)
            self._heard.clear()
        return read_log, heard


class JobWakeups:
    def __init__(self, client: redis.Redis, keys: Keys, linger_s: float = 10.0, poll_s: float = 1.0,
                 max_heard: int = 256):
        self._client = client
        head, _, tail = keys.channel("\0").partition("\0")
        self._pattern = _glob_escape(head) + "*" + _glob_escape(tail)
        self._head, self._tail = head, tail
        self._linger_s, self._poll_s, self._max_heard = linger_s, poll_s, max_heard
        self._watchers: dict[str, set[JobWatcher]] = {}
        self._lock = threading.Lock()
        self._listening = False

    @contextmanager
    def watch(self, job_id: str, before_created: bool = False) -> Iterator[JobWatcher]:
        """What is heard of the job's log until the block ends (see `JobWatcher`). A watch that
        begins `before_created` (the job does not exist yet) hears every entry its log will hold,
        so its relay need not read the log first; while the listener is not subscribed, its
        subscribing wakes every relay to read, as it does for the others."""
        woken = JobWatcher(self._max_heard, read_log=not before_created)
        with self._lock:
            self._watchers.setdefault(job_id, set()).add(woken)
            if not self._listening:
                self._listening = True
                threading.Thread(target=self._listen, name="sse-wakeups", daemon=True).start()
        try:
            yield woken
        finally:
            with self._lock:
                watchers = self._watchers.get(job_id, set())
                watchers.discard(woken)
                if not watchers:
                    self._watchers.pop(job_id, None)

    @property
    def listening(self) -> bool:
        """Whether this process's listener thread runs (for tests and diagnostics)."""
        return self._listening

    def _listen(self) -> None:
        idle_since, backoff = None, Backoff(first_s=0.1)
        while True:
            pubsub = self._client.pubsub()
            try:
                pubsub.psubscribe(self._pattern)
                while True:
                    message = pubsub.get_message(timeout=self._poll_s) or {"type": None}
                    if message["type"] == "pmessage":
                        self._wake(message["channel"][len(self._head):-len(self._tail) or None],
                                   parse_announcement(message["data"]))
                    elif message["type"] == "psubscribe":
                        backoff.reset()
                        self._wake_all()  # what was published before now was not heard
                    if self._watchers:
                        idle_since = None
                        continue
                    idle_since = idle_since or time.monotonic()
                    if self._end_if_unwatched(time.monotonic() - idle_since >= self._linger_s):
                        return
            except Exception as exc:  # never die silently: relays would wait for their heartbeats
                delay = backoff.next()
                if isinstance(exc, redis.RedisError):
                    log.warning("SSE wake-up listener lost Redis (%s); again in %.1f s", exc, delay)
                else:
                    log.exception("SSE wake-up listener failed; again in %.1f s", delay)
                self._wake_all()  # relays read the log themselves, and end if Redis is away
                if self._end_if_unwatched(True):  # nobody left to wake: stop retrying
                    return
                time.sleep(delay)
            finally:
                try:
                    pubsub.close()
                except redis.RedisError:
                    pass

    def _end_if_unwatched(self, may_end: bool) -> bool:
        """End the listener (True) if it may and no relay watches a job; the next `watch` starts
        a new one. Decided under the lock `watch` registers under, so no relay is left unheard."""
        with self._lock:
            if may_end and not self._watchers:
                self._listening = False
                return True
            return False

    def _wake(self, job_id: str, entry: Announcement | None) -> None:
        with self._lock:
            for woken in self._watchers.get(job_id, ()):
                woken.hear(entry)

    def _wake_all(self) -> None:
        """Every relay reads its log: something may have been published unheard."""
        with self._lock:
            for watchers in self._watchers.values():
                for woken in watchers:
                    woken.hear(None)


def _glob_escape(text: str) -> str:
    """`text` matched literally in a Redis glob pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
