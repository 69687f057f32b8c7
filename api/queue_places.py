"""Every waiting stream hears its place in line while its job is queued.

One thread per API process (a greenlet under gevent) works out, every `queue_place_interval_s`,
the queue position and ETAs of every queued job its streams watch, and tells a stream (through
its `JobWatcher`) when its position changed or it was last told `queue_place_every_s` ago. The
work of a pass does not grow with round trips per stream: each fair list and each priority level
is read once (`FairQueue.positions`), and the workers' slots are simulated once per model for the
whole queue (`common.eta.start_slots`). A stream that starts watching is placed within
`GATHER_S`, so the first place of a burst of new streams is computed once for all of them.

Where a job waits is read once: its own record, or its primary's when it rides on an identical
job. Once a job has left the queue (started, cancelled, expired) it is told nothing more; its
stream carries on with the job's log. The thread ends when no stream has waited for `linger_s`,
and the next watch starts a new one.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from api.wakeups import JobWatcher
from common.eta import estimate_at, fleet_loads, max_tokens_of, place_fields, start_slots
from common.jobs import JobStore
from common.model_loads import ModelLoads
from common.schemas import JobStatus
from common.worker_registry import WorkerRegistry

log = logging.getLogger(__name__)
GATHER_S = 0.02  # after a new stream wakes the thread: let the rest of a burst arrive


@dataclass(eq=False)
class _Waiting:
    job_id: str
    watcher: JobWatcher
    where: dict | None = None  # the record it waits as; {} once it is not (or no longer) queued
    told_position: int | None = None
    told_at: float = 0.0
    max_tokens: int = 0


class QueuePlaces:
    def __init__(self, store: JobStore, registry: WorkerRegistry, model_loads: ModelLoads,
                 interval_s: float = 1.0, every_s: float = 5.0, linger_s: float = 10.0):
        self._store = store
        self._registry = registry
        self._model_loads = model_loads
        self._interval_s, self._every_s, self._linger_s = interval_s, every_s, linger_s
        self._waiting: set[_Waiting] = set()
        self._lock = threading.Lock()
        self._kick = threading.Event()
        self._running = False

    @contextmanager
    def watch(self, job_id: str, watcher: JobWatcher, record: dict | None = None) -> Iterator[None]:
        """Tell `watcher` the job's place while it is queued, until the block ends. `record`: the
        job's record as the caller has it from creating the job, so that it is not read back (a
        burst of new streams would read a thousand)."""
        waiting = _Waiting(job_id, watcher)
        if record is not None and not record.get("coalesced_into"):  # else where it rides is read
            waiting.where, waiting.max_tokens = _queued(record), max_tokens_of(record)
        with self._lock:
            self._waiting.add(waiting)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="queue-places", daemon=True).start()
        self._kick.set()
        try:
            yield
        finally:
            with self._lock:
                self._waiting.discard(waiting)

    @property
    def watched(self) -> int:
        """Streams whose job this process is watching (queued, or not read yet)."""
        with self._lock:
            return sum(1 for w in self._waiting if w.where != {})

    def _run(self) -> None:
        idle_since = None
        while True:
            if self._kick.wait(self._interval_s):
                time.sleep(GATHER_S)
            self._kick.clear()
            with self._lock:
                waiting = [w for w in self._waiting if w.where != {}]
                if not waiting:
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since >= self._linger_s:
                        self._running = False
                        return
                    continue
            idle_since = None
            try:
                self.place(waiting)
            except Exception as exc:  # Redis away: streams keep their heartbeats; try next pass
                log.warning("queue places not computed this pass: %s", exc)

    def place(self, waiting: list[_Waiting]) -> None:
        """One pass: read where new streams' jobs wait, compute every place, tell who needs it."""
        self._read_where([w for w in waiting if w.where is None])
        queued = [w for w in waiting if w.where]
        if not queued:
            return
        positions = self._store.fair.positions(list({w.where["id"]: w.where for w in queued}.values()))
        loads = fleet_loads(self._registry.live(), self._model_loads.last())
        starts: dict[str, list[tuple[float, int]]] = {}
        for model, workers in loads.items():
            most = max((positions.get(w.where["id"], 0) for w in queued
                        if w.where.get("model") == model), default=0)
            starts[model] = start_slots(most, workers)
        now = time.monotonic()
        for w in queued:
            ahead = positions.get(w.where["id"])
            if ahead is None:  # it has left the queue
                w.where = {}
                continue
            if ahead + 1 == w.told_position and now - w.told_at < self._every_s:
                continue
            model = w.where.get("model")
            guess = (estimate_at(starts[model][ahead], w.max_tokens, loads[model])
                     if model in starts else None)
            w.told_position, w.told_at = ahead + 1, now
            w.watcher.tell_place(place_fields(ahead, guess))

    def _read_where(self, new: list[_Waiting]) -> None:
        """Each new stream's job record, or its primary's when it is coalesced; {} when it is
        not queued (running, ended, unknown): it is never placed."""
        if not new:
            return
        records = self._store.get_many([w.job_id for w in new])
        primaries = {r["coalesced_into"] for r in records if r and r.get("coalesced_into")}
        by_id = dict(zip(primaries, self._store.get_many(list(primaries)))) if primaries else {}
        for w, record in zip(new, records):
            if record is None or record.get("status") != JobStatus.QUEUED:
                w.where = {}
                continue
            where = by_id.get(record["coalesced_into"]) if record.get("coalesced_into") else record
            w.where = _queued(where)
            w.max_tokens = max_tokens_of(record)


def _queued(record: dict | None) -> dict:
    """Where a job waits: its record while it is queued, else {} (it is never placed)."""
    return record if record is not None and record.get("status") == JobStatus.QUEUED else {}
