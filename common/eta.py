"""Queue position -> estimated start and finish, from what the workers really measure.

Each worker reports, in its heartbeat, its batch capacity, its decayed generation rate while busy
(tokens/s over the whole batch), the decayed rate of one sequence (decode steps/s: each step
gives every running sequence one token) and the decayed mean length of the jobs it finished.
The jobs each worker holds right now, and how far along they are, come from Redis at once (see
`FairQueue.held`), not from the heartbeat.

The estimate replays the queue on the slots: every slot frees when its job's expected tokens are
done (a free slot: now); each job ahead takes the slot that frees first and holds it for a mean
job. Jobs of one burst start and finish together, so starts come in steps of a batch, which a
plain "jobs per second" rate would smear. Not a promise: an honest guess that tightens as the
workers measure more.
"""
from __future__ import annotations

import heapq
import time
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
    sequence_tokens_per_s: float | None = None  # one sequence's rate while busy, decayed
    remaining_tokens: tuple[float, ...] = ()  # expected tokens left, jobs it holds
    ready_in_s: float = 0.0  # until its model is loaded (a cold model: its last load's time)

    @classmethod
    def from_heartbeat(cls, info: dict) -> "WorkerLoad":
        mean = float(info.get("mean_job_tokens") or DEFAULT_JOB_TOKENS)
        remaining = tuple(_expected_left(job, mean) for job in info.get("held_jobs", ()))
        return cls(capacity=int(info.get("max_batch_size", 1)), running=int(info.get("running", 0)),
                   tokens_per_s=float(info.get("tokens_per_s") or DEFAULT_TOKENS_PER_S),
                   mean_job_tokens=mean, remaining_tokens=remaining,
                   sequence_tokens_per_s=info.get("sequence_tokens_per_s"))

    @property
    def per_sequence(self) -> float:
        """Tokens/s one job gets: measured, else an even share of the whole batch's rate."""
        return max(self.sequence_tokens_per_s or self.tokens_per_s / max(self.capacity, 1), 1e-6)


def _expected_left(job: dict, mean: float) -> float:
    """Tokens a held job will still generate: up to the mean length, within its max_tokens."""
    done = job.get("completion_tokens", 0)
    expected = min(job.get("max_tokens") or mean, max(mean, done + 1))
    return max(expected - done, 1.0)


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
    return estimate_at(start_slots(ahead, workers)[ahead], max_tokens, workers)


def start_slots(most_ahead: int, workers: list[WorkerLoad]) -> list[tuple[float, int]]:
    """(seconds until a slot frees, the worker's index) for a job with 0, 1, ... `most_ahead`
    queued jobs before it: one simulation of the workers' slots serves a whole queue. Each
    worker's slots free as its held jobs end; every job ahead then takes the earliest slot for
    the mean job's time. Needs at least one worker."""
    slots: list[tuple[float, int]] = []
    for index, w in enumerate(workers):
        known = list(w.remaining_tokens)[:w.capacity]
        unknown = max(min(w.running, w.capacity) - len(known), 0)  # held, progress unknown: half done
        busy = [left / w.per_sequence for left in known] + [w.mean_job_tokens / 2 / w.per_sequence] * unknown
        slots += [(w.ready_in_s + t, index) for t in busy + [0.0] * (w.capacity - len(busy))]
    heapq.heapify(slots)
    starts = []
    for _ in range(most_ahead + 1):
        starts.append(slots[0])
        t, index = heapq.heappop(slots)
        w = workers[index]
        heapq.heappush(slots, (t + w.mean_job_tokens / w.per_sequence, index))
    return starts


def estimate_at(slot: tuple[float, int], max_tokens: int, workers: list[WorkerLoad]) -> Estimate:
    """The ETA of a job that starts in the slot `start_slots` gave it."""
    start, index = slot
    w = workers[index]
    start = max(start, PICKUP_S)
    return Estimate(start_in_s=start, finish_in_s=start + min(max_tokens, w.mean_job_tokens) / w.per_sequence)


def fleet_loads(live: list[dict], last_loads: dict[str, dict]) -> dict[str, list[WorkerLoad]]:
    """The live workers' loads by model; a model no live worker holds but that has been loaded
    before gets one worker that is ready once the model has loaded again (its last load's time),
    so the ETAs of jobs waiting for a cold model count the load."""
    loads: dict[str, list[WorkerLoad]] = {}
    for info in live:
        loads.setdefault(info.get("model"), []).append(WorkerLoad.from_heartbeat(info))
    for model, last in last_loads.items():
        if model not in loads:
            loads[model] = [WorkerLoad(capacity=int(last.get("slots") or 1), running=0,
                                       tokens_per_s=float(last.get("tokens_per_s") or DEFAULT_TOKENS_PER_S),
                                       mean_job_tokens=DEFAULT_JOB_TOKENS, ready_in_s=float(last["load_s"]))]
    return loads


def retry_after(excess: int, workers: list[WorkerLoad], floor_s: int = 1, ceiling_s: int = 600) -> int:
    """Seconds until `excess` jobs have drained from a full queue (whole seconds, bounded)."""
    if not workers:
        return 30
    seconds = (excess + 1) / drain_rate(workers)
    return int(min(max(seconds, floor_s), ceiling_s) + 0.999)


def max_tokens_of(record: dict) -> int:
    return (record.get("request") or {}).get("sampling", {}).get("max_tokens", 256)


def place_fields(ahead: int, guess: Estimate | None) -> dict:
    """A queued job's place as the API shows it: `queue_position` (1: next) and, when a worker
    is alive to estimate from, `estimated_start` / `estimated_finish` (epoch s)."""
    place = {"queue_position": ahead + 1}
    if guess is not None:
        now = time.time()
        place.update(estimated_start=round(now + guess.start_in_s, 2),
                     estimated_finish=round(now + guess.finish_in_s, 2))
    return place
