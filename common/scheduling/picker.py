"""A worker's side of picking: which job a ticket runs, the waits that keep a slot free without
giving the ticket up, and the preemption of batch lines beyond their share.

The job runner asks `pick` for a ticket's job and tells `done` when it ended; around a batch
line's run it calls `line_started` / `line_ended`, so the watcher can stop the lines that started
last when interactive jobs wait (common/scheduling/batch_share.py).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from common.scheduling.batch_share import BatchLineShare
from common.scheduling.fair_queue import CAPPED, FairQueue, Pick
from common.scheduling.free_slots import FreeSlots
from common.scheduling.prefix_affinity import Deferred
from common.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

CAPPED_WAIT_S = 0.1  # a ticket waiting for batch room looks again at least this often
PREEMPT_POLL_S = 0.2  # how often a worker whose batch lines hold more than their share looks for waiting jobs
DEFERRED_WAIT_S = 0.02  # a ticket that left the next job to its prefix's holder looks again this often


class TicketPicker:
    def __init__(self, fair: FairQueue, worker_name: str, settings: Settings,
                 retrying: Callable[[Callable[[], T]], T],
                 send_ticket: Callable[[str | None], None] | None = None,
                 free_slots: FreeSlots | None = None,
                 on_affinity: Callable[[str], None] | None = None):
        """`retrying(read)`: runs a Redis call through an outage. `send_ticket(worker)`: sends a
        spare ticket to that worker's own queue, or with None to the model's queue. `free_slots`:
        where this worker tells the others how many jobs it can start now. `on_affinity(outcome)`:
        counts each pick that prefix affinity routed ('hit', 'miss' or 'new')."""
        self.fair = fair
        self.worker_name = worker_name
        self.settings = settings
        self.retrying = retrying
        self.send_ticket = send_ticket
        self.free_slots = free_slots
        self.on_affinity = on_affinity
        self.batch_share = BatchLineShare(settings.max_batch_size, settings.batch_max_share,
                                          settings.batch_yield_window_s)
        self._batch_lines: dict[str, tuple[float, Callable[[], None]]] = {}  # running here: start, preempt
        self._batch_lines_lock = threading.Lock()
        self._preempt_watch: threading.Thread | None = None
        self._deferred_line = threading.Lock()  # one deferring ticket looks again at a time
        self._stopping = threading.Event()

    def pick(self, ticket: str, queue: str) -> Pick | None:
        """The ticket's job (common/scheduling/fair_queue.py). Two waits keep the slot free without
        giving the ticket up: while only batch lines wait and batch work may take no more of this
        worker's slots, until that changes; while the next job is left for the worker that caches
        its prompt's start (common/scheduling/prefix_affinity.py), until that worker takes it or
        the affinity wait ends. CAPPED only when the worker stops meanwhile."""
        self._watch_for_preemption(queue)
        picked = self._pick_once(ticket, queue)
        while picked is CAPPED or isinstance(picked, Deferred):
            if self._stopping.is_set():
                return CAPPED
            if picked is CAPPED:
                with self.batch_share.waiting_line:
                    self.batch_share.wait_for_room(CAPPED_WAIT_S)
                    picked = self._pick_once(ticket, queue)
                continue
            if picked.first:
                self.spare_ticket(picked.holder)
            with self._deferred_line:
                self._stopping.wait(DEFERRED_WAIT_S)
                picked = self._pick_once(ticket, queue)
        return picked

    def _pick_once(self, ticket: str, queue: str) -> Pick | Deferred | None:
        room, picked = self.batch_share.before_pick(), None
        try:
            picked = self.retrying(lambda: self.fair.pick(
                queue, ticket, self.worker_name, room, self.settings.prefix_affinity_wait_s))
            return picked
        finally:
            took = isinstance(picked, Pick) and picked.job_id
            self.batch_share.after_pick(room, picked.priority if took else None)
            if took and self.free_slots is not None:
                self.free_slots.taken()
            if took and picked.affinity and self.on_affinity is not None:
                self.on_affinity(picked.affinity)

    def done(self, picked: Pick) -> None:
        """The picked job ended here (or moved on): its slot is free again."""
        self.batch_share.done(picked.priority)
        if self.free_slots is not None:
            self.free_slots.released()
        try:
            self.fair.release(picked.job_id, self.worker_name)
        except redis.RedisError:
            log.warning("could not record that job %s was let go", picked.job_id, exc_info=True)

    def spare_ticket(self, worker: str | None) -> None:
        """A spare ticket: on a prefix holder's own queue (it may have a free slot and no ticket
        in hand), or on the model's queue for a preempted line. Never raises: the holder still
        gets its job by any ticket it has, or ours takes it."""
        if self.send_ticket is None:
            return
        try:
            self.send_ticket(worker)
        except Exception:
            log.warning("could not send a ticket (to %s)", worker or "the model's queue", exc_info=True)

    def line_started(self, job_id: str, preempt: Callable[[], None]) -> None:
        """A batch line runs here; `preempt()` asks it to stop and start over later."""
        with self._batch_lines_lock:
            self._batch_lines[job_id] = (time.monotonic(), preempt)

    def line_ended(self, job_id: str) -> None:
        with self._batch_lines_lock:
            self._batch_lines.pop(job_id, None)

    def stop(self) -> None:
        """The worker stops: tickets waiting for batch room or for another worker's pick go back
        to the queue, and the preemption watcher ends."""
        self._stopping.set()

    def _watch_for_preemption(self, queue: str) -> None:
        """Started with the first ticket: while batch lines hold more than their share of this
        worker's slots and interactive jobs wait for the model, preempt the lines beyond the
        share."""
        with self._batch_lines_lock:
            if self._preempt_watch is not None or self.batch_share.uncapped:
                return
            self._preempt_watch = threading.Thread(target=self._preempt_forever, args=(queue,),
                                                   name="batch-preemption", daemon=True)
            self._preempt_watch.start()

    def _preempt_forever(self, queue: str) -> None:
        while not self._stopping.wait(PREEMPT_POLL_S):
            try:
                over = self.batch_share.batch_over_share()
                if over and (waiting := self.fair.interactive_waiting(queue)):
                    self._preempt_batch_lines(min(over, waiting))
            except redis.RedisError:
                pass  # Redis is away: nothing can start meanwhile anyway
            except Exception:  # never let the watcher die: the next look may succeed
                log.exception("batch preemption check failed")

    def _preempt_batch_lines(self, count: int) -> None:
        """Stop the `count` batch lines that started here last; they start over later. A line
        asked again before it has stopped is the same line: asking twice changes nothing."""
        with self._batch_lines_lock:
            youngest = sorted(self._batch_lines.items(), key=lambda item: item[1][0], reverse=True)[:count]
        for job_id, (_, preempt) in youngest:
            log.info("preempting batch line %s for interactive work", job_id, extra={"job_id": job_id})
            preempt()
