"""Who runs in the next step. Pure Python: no torch, no I/O.

Policy (continuous batching): waiting requests are admitted, oldest first, while the batch has room
(`max_batch_size`) and the KV budget allows; a step that admits requests prefills them, otherwise
all running sequences decode one token. The KV cache gives every running sequence a row as long as
the longest one needs (see kv_cache.py), so the budget is checked as rows x the longest reservation
(prompt + max_tokens): a sequence admitted can always finish, nobody is preempted.
A prefill step computes at most `max_prefill_tokens` padded tokens (rows x the longest prompt
part not served by the prefix cache), so a burst of long prompts is spread over several steps and
short prompts are not padded to the length of long ones. Finished or aborted sequences leave at once, so nobody waits for the longest member.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from common.schemas import FinishReason
from worker.engine.sequence import Sequence, SeqState


@dataclass
class ScheduledBatch:
    prefill: list[Sequence] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, max_batch_size: int, kv_budget_tokens: int, max_prefill_tokens: int = 1 << 30,
                 prefill_cost: Callable[[list[int]], int] = len):
        self.max_batch_size = max_batch_size
        self.kv_budget_tokens = kv_budget_tokens
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_cost = prefill_cost
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        if seq.reserved_tokens > self.kv_budget_tokens:
            raise ValueError(f"request needs {seq.reserved_tokens} KV tokens; "
                             f"the engine budget is {self.kv_budget_tokens}")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def kv_tokens_needed(self, extra: list[Sequence] = ()) -> int:
        """KV the running batch (plus `extra`) may need: rows x the longest reservation."""
        seqs = [*self.running, *extra]
        return len(seqs) * max((s.reserved_tokens for s in seqs), default=0)

    def schedule(self) -> ScheduledBatch:
        admitted = self._admit()
        if admitted:
            return ScheduledBatch(prefill=admitted)
        return ScheduledBatch(decode=list(self.running))

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        longest = 0
        while self.waiting and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            if self.kv_tokens_needed([seq]) > self.kv_budget_tokens:
                break  # oldest first: do not let small requests overtake it forever
            longest = max(longest, self.prefill_cost(seq.request.prompt_token_ids))
            if admitted and (len(admitted) + 1) * longest > self.max_prefill_tokens:
                break
            self.waiting.popleft()
            seq.state = SeqState.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
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
