"""Batch lines (OpenAI's /v1/batches) hold at most their share of a worker's slots while
interactive jobs are about.

Batch lines are picked only after every interactive job, but a line that
started keeps its slot until it ends: with every slot held by the batch, an interactive job waits
for a line to finish, and then shares each step with all the others. So while interactive jobs
run or wait on this worker (one was held here within `batch_yield_window_s`), batch lines may hold
at most `batch_max_share` of its slots, and the tickets beyond that wait in the worker with their
slot free: an interactive job that comes takes one at once, with no hop through the queue. With no
interactive job for the window, the batch has every slot again; it always keeps at least one.
When interactive jobs then come and wait while the batch holds more than its share, the lines
beyond it that started last are preempted: stopped, and put back at the head of the batch's queue
to start over (common/scheduling/picker.py), so the first interactive burst after a quiet spell does not
wait for lines to end.

A ticket that finds only batch work and no room is not consumed (that would lose a line's turn):
it waits for room, one waiting ticket looking again at a time, so a worker of many slots does not
poll Redis once per slot.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable


class BatchLineShare:
    """The share of this worker's slots that batch lines may hold now, kept per pick."""

    def __init__(self, slots: int, max_share: float, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.batch_slots = max(1, math.floor(slots * max_share))
        self.uncapped = max_share >= 1
        self.window_s = window_s
        self.clock = clock
        self._batch_held = 0
        self._interactive_held = 0
        self._interactive_seen_at = -math.inf
        self._room = threading.Condition()
        self.waiting_line = threading.Lock()  # one capped ticket looks again at a time

    def batch_room(self) -> int | None:
        """How many more batch lines this worker may take now; None: as many as it has slots."""
        with self._room:
            return self._room_now()

    def before_pick(self) -> int | None:
        """The batch room to pick with. A room is kept for this pick until `after_pick`, so that
        tickets picking at the same moment cannot together take more than there is."""
        with self._room:
            room = self._room_now()
            if room:
                self._batch_held += 1
            return room

    def after_pick(self, room: int | None, priority: str | None) -> None:
        """What the pick took (`priority` None: nothing): a batch line keeps the room kept for
        it, anything else gives it back."""
        batch = priority == "batch"
        with self._room:
            if room and not batch:
                self._batch_held -= 1
                self._room.notify_all()
            if batch and not room:
                self._batch_held += 1
            if priority is not None and not batch:
                self._interactive_held += 1

    def done(self, priority: str) -> None:
        """A picked job ended here."""
        with self._room:
            if priority == "batch":
                self._batch_held -= 1
            else:
                self._interactive_held -= 1
                self._interactive_seen_at = self.clock()
            self._room.notify_all()

    def batch_over_share(self) -> int:
        """How many more batch lines run here than their share of the slots (0 when the share
        is every slot): lines to preempt if interactive jobs are waiting."""
        with self._room:
            return 0 if self.uncapped else max(0, self._batch_held - self.batch_slots)

    def _room_now(self) -> int | None:
        interactive = self._interactive_held or self.clock() - self._interactive_seen_at < self.window_s
        if self.uncapped or not interactive:
            return None
        return max(0, self.batch_slots - self._batch_held)

    def wait_for_room(self, timeout: float) -> None:
        """Until a job held here ends, or `timeout` (interactive work may arrive meanwhile, and
        the window may lapse)."""
        with self._room:
            self._room.wait(timeout)
