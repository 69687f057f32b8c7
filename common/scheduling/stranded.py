"""Queued jobs left without a ticket get spare ones.

Every job is admitted with one Celery message, its ticket (common/admission.py). A ticket can be
lost outside llmq's records: a Sentinel failover loses the writes the old master had not yet
replicated (the job's record and place may have made it and its ticket not), or an API process
dies between creating a job and sending its ticket. Such a job would wait in the fair queue until
its queue deadline, and its streams would send keep-alives for as long.

Each heartbeat, a worker with free slots looks at its model's queue: interactive jobs waiting, and
no ticket on the broker to pick them. A ticket between the broker and a worker, or a job between
its creation and its ticket, looks the same for an instant, so only what is seen on two heartbeats
in a row counts: the worker then sends as many spare tickets as jobs wait, at most its free slots.
A spare ticket that finds nothing to run does nothing (batch lines have spare tickets of their
own: common/batches.py).
"""
from __future__ import annotations


class StrandedJobs:
    """How many spare tickets a worker sends on this heartbeat (pure: the runtime reads Redis)."""

    def __init__(self) -> None:
        self._seen = False

    def spare_tickets(self, waiting: int, tickets_waiting: int, free_slots: int) -> int:
        """`waiting`: interactive jobs queued for the model; `tickets_waiting`: tickets on the
        broker for its queue; `free_slots`: jobs this worker could start now."""
        stranded = waiting > 0 and tickets_waiting == 0 and free_slots > 0
        if not stranded:
            self._seen = False
            return 0
        if not self._seen:
            self._seen = True
            return 0
        self._seen = False  # the next ones must be seen twice again
        return min(waiting, free_slots)
