"""Who runs in the next step. Pure Python: no torch, no I/O.

Policy (continuous batching): waiting requests are admitted, oldest first, while the batch has room
(`max_batch_size`) and the KV budget (`max_batch_tokens`, counting each sequence's prompt plus its
max_tokens) allows; a step that admits requests prefills them, otherwise all running sequences
decode one token. Finished or aborted sequences leave at once, so nobody waits for the longest member.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from worker.engine.sequence import Sequence, SeqState


@dataclass
class ScheduledBatch:
    prefill: list[Sequence] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, max_batch_size: int, max_batch_tokens: int):
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        if seq.reserved_tokens > self.max_batch_tokens:
            raise ValueError(f"request needs {seq.reserved_tokens} KV tokens; "
                             f"the engine budget is {self.max_batch_tokens}")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def reserved_tokens(self) -> int:
        return sum(seq.reserved_tokens for seq in self.running)

    def schedule(self) -> ScheduledBatch:
        admitted = self._admit()
        if admitted:
            return ScheduledBatch(prefill=admitted)
        return ScheduledBatch(decode=list(self.running))

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        budget = self.max_batch_tokens - self.reserved_tokens()
        while self.waiting and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            if seq.reserved_tokens > budget:
                break  # oldest first: do not let small requests overtake it forever
            self.waiting.popleft()
            budget -= seq.reserved_tokens
            seq.state = SeqState.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence, waiting or running."""
        seq.state = SeqState.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def find(self, request_id: str) -> Sequence | None:
        for seq in (*self.running, *self.waiting):
            if seq.id == request_id:
                return seq
        return None
