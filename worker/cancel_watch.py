"""One watcher per worker for the cancels asked of the jobs it runs.

A client cancels a job by setting a flag on its record. A running job learns of it from its own
chunk writes (each write reads the flag), but a job that writes nothing for a while (a long
prefill, a slow step of a big batch) must look. One thread looks for all of them, with one
pipelined read per interval, so the cost does not grow with the jobs a worker holds: with a
thread of its own polling per job, a worker holding 256 jobs spent twice the CPU relaying their
text that it spends without (docs/benchmarks.md).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import redis

from common.jobs import JobStore

log = logging.getLogger(__name__)


class CancelWatch:
    def __init__(self, store: JobStore, interval_s: float):
        self.store = store
        self.interval_s = interval_s
        self._on_cancel: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        """The model this watcher served is unloaded: its thread ends."""
        self._stop.set()

    def watch(self, job_id: str, on_cancel: Callable[[], None]) -> None:
        """Call `on_cancel` (once, from the watcher's thread) when a cancel of `job_id` is asked."""
        with self._lock:
            self._on_cancel[job_id] = on_cancel
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cancel-watch", daemon=True)
                self._thread.start()

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._on_cancel.pop(job_id, None)

    def look(self) -> None:
        """One look at every watched job; Redis away: next time."""
        with self._lock:
            job_ids = list(self._on_cancel)
        if not job_ids:
            return
        try:
            asked = self.store.cancels_requested(job_ids)
        except redis.RedisError:
            return
        for job_id in asked:
            with self._lock:
                on_cancel = self._on_cancel.pop(job_id, None)
            if on_cancel is not None:
                on_cancel()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.look()
            except Exception:  # never let the thread die: cancels depend on it
                log.exception("looking for cancels failed")
