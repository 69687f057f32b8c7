"""Which catalog models a worker loads and unloads: a pure decision over what the fleet looks like
at one moment, so that it can be read and tested without Redis or engines. The worker gathers the
state, asks `decide`, and carries out what it says (worker/held_models.py).

A cold model (queued jobs, no live worker holds it, none loads it, and it did not just fail to
load here) is loaded here if it fits the worker's budget. A worker without room may unload the
model it wanted least (the longest without a queued or running job, at least `idle_s`); when
another worker says in its heartbeat that it has room, only if the need is still there a pass
later, so that the worker with room takes it first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Room(NamedTuple):
    """What another worker says it could still load (its heartbeat): models, and memory when it
    has a budget (None: it has none)."""
    models: int
    memory_mb: float | None = None


@dataclass(frozen=True)
class Budget:
    max_models: int  # models held at once
    memory_mb: float  # for all of them; 0: only max_models bounds them
    idle_s: float  # how long a model must have been idle before it is unloaded for another


@dataclass(frozen=True)
class FleetState:
    now: float
    queued: dict[str, int]  # every catalog model, in catalog order: its jobs not yet picked
    held: dict[str, float]  # models held here: when each last had a queued or running job
    served: frozenset[str] = frozenset()  # models some live worker holds
    loading: frozenset[str] = frozenset()  # models some worker is loading now
    failed_at: dict[str, float] = field(default_factory=dict)  # models that failed to load here: when
    passed: frozenset[str] = frozenset()  # models left to a worker with room at the last pass
    room_elsewhere: tuple[Room, ...] = ()  # the other live workers' room
    memory_mb: dict[str, float] = field(default_factory=dict)  # what each model takes (with a memory budget)
    retry_failed_s: float = 30.0  # a model that failed to load here is not tried again for this long


@dataclass(frozen=True)
class Step:
    """Something to try, in order: load `load`, after unloading `unload` if set (only under the
    model's load lock: if another worker has it, try the next step). `leave_to_others`: not this
    pass, another worker has room for it."""
    load: str
    unload: str | None = None
    leave_to_others: bool = False


def decide(state: FleetState, budget: Budget) -> list[Step]:
    """The steps of one pass, the cold model with the most queued jobs first. A load that needs no
    unload ends the list: at most one model is loaded per pass."""
    cold = sorted((m for m, n in state.queued.items() if n and m not in state.served and m not in state.loading
                   and state.now - state.failed_at.get(m, -state.retry_failed_s) >= state.retry_failed_s),
                  key=lambda m: -state.queued[m])
    victim = least_wanted(state, budget)
    steps = []
    for model in cold:
        if fits(state, budget, model, unloading=None):
            steps.append(Step(model))
            break
        if victim is None or not fits(state, budget, model, unloading=victim):
            continue
        if model not in state.passed and room_elsewhere(state, budget, model):
            steps.append(Step(model, leave_to_others=True))  # give that worker a pass to take it first
            continue
        steps.append(Step(model, unload=victim))
    return steps


def least_wanted(state: FleetState, budget: Budget) -> str | None:
    """The held model idle longest, if it has been idle `idle_s` at least."""
    idle = [(busy_at, m) for m, busy_at in state.held.items() if state.now - busy_at >= budget.idle_s]
    return min(idle)[1] if idle else None


def fits(state: FleetState, budget: Budget, model: str, unloading: str | None) -> bool:
    """Whether `model` fits the budget beside what is held (less `unloading`)."""
    kept = [m for m in state.held if m != unloading]
    if len(kept) + 1 > budget.max_models:
        return False
    if not budget.memory_mb:
        return True
    return sum(state.memory_mb[m] for m in kept) + state.memory_mb[model] <= budget.memory_mb


def room_elsewhere(state: FleetState, budget: Budget, model: str) -> bool:
    """Whether another live worker says it has room for `model` (no unload needed there)."""
    need = state.memory_mb[model] if budget.memory_mb else 0
    return any(room.models > 0 and (need if room.memory_mb is None else room.memory_mb) >= need
               for room in state.room_elsewhere)
