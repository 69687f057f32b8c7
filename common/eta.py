"""Queue position -> estimated start and finish, from what the workers really measure.

Each worker reports, in its heartbeat, its batch capacity, how many jobs it runs now, its decayed
generation rate while busy (tokens/s over the whole batch) and the decayed mean length of the jobs
it finished. The cluster then drains jobs at about  sum(rate) / mean_job_tokens  per second once
every slot is busy, and a job with `ahead` jobs queued before it starts when the first
`ahead - free_slots + 1` of them have been drained. Not a promise: a decayed, honest guess that
tightens as the workers measure more.
"""
from __future__ import annotations

from dataclasses import dataclass

PICKUP_S = 0.05  # broker hop + claim, when a slot is free
DEFAULT_TOKENS_PER_S = 10.0  # before a worker has measured anything
DEFAULT_JOB_TOKENS = 128.0


@dataclass(frozen=True)
class WorkerLoad:
    capacity: int
    running: int
    tokens_per_s: float  # whole-batch generation rate while busy, decayed
    mean_job_tokens: float  # decayed mean completion length of finished jobs

    @classmethod
    def from_heartbeat(cls, info: dict) -> "WorkerLoad":
        return cls(capacity=int(info.get("max_batch_size", 1)), running=int(info.get("running", 0)),
                   tokens_per_s=float(info.get("tokens_per_s") or DEFAULT_TOKENS_PER_S),
                   mean_job_tokens=float(info.get("mean_job_tokens") or DEFAULT_JOB_TOKENS))


@dataclass(frozen=True)
class Estimate:
    start_in_s: float
    finish_in_s: float


def drain_rate(workers: list[WorkerLoad]) -> float:
    """Jobs per second the live workers complete when saturated."""
    return sum(w.tokens_per_s / max(w.mean_job_tokens, 1.0) for w in workers)


def estimate(ahead: int, max_tokens: int, workers: list[WorkerLoad]) -> Estimate | None:
    """ETA for a job with `ahead` queued jobs before it; None when no worker is alive."""
    if not workers:
        return None
    free = sum(max(w.capacity - w.running, 0) for w in workers)
    wait = PICKUP_S if ahead < free else (ahead - free + 1) / drain_rate(workers)
    capacity = sum(w.capacity for w in workers)
    per_sequence = sum(w.tokens_per_s for w in workers) / max(capacity, 1)  # each slot's share
    expected_tokens = min(max_tokens, max(w.mean_job_tokens for w in workers))
    return Estimate(start_in_s=wait, finish_in_s=wait + expected_tokens / max(per_sequence, 1e-6))


def retry_after(excess: int, workers: list[WorkerLoad], floor_s: int = 1, ceiling_s: int = 600) -> int:
    """Seconds until `excess` jobs have drained from a full queue (whole seconds, bounded)."""
    if not workers:
        return 30
    seconds = (excess + 1) / drain_rate(workers)
    return int(min(max(seconds, floor_s), ceiling_s) + 0.999)
