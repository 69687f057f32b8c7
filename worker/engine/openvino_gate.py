"""Which of the requests waiting in the OpenVINO adapter its core may take now.

OpenVINO GenAI's pipeline takes every request it is given, and then:
- does not wait for KV room: a request its cache cannot grow into is dropped (IGNORED) mid-answer,
  so a burst of long prompts on a small `LLMQ_KV_CACHE_MB` would fail jobs that need only wait;
- looks up its prefix cache only when it takes a request in, so a burst of prompts with one long
  system prompt would compute it once per request, several seconds on one core.

So the adapter holds requests here and hands the core those that `admit` lets through: oldest
first, while each one's prompt and longest answer fit the KV cache beside those the core runs
(counting every request's whole length ignores the blocks prompts share, so it holds back a
little early; one request alone always goes). A request whose prompt starts like one the core is
still prefilling waits for that one's first token (the requests behind it go on); a start
prefilled once is remembered, and later requests with it go at once.

Pure bookkeeping, no OpenVINO: the adapter tells it what the core answered (`heard`).
"""
from __future__ import annotations

import collections
from worker.engine.sequence import EngineRequest

SHARED_START_TOKENS = 256  # prompts that agree on this many first tokens share a prefix worth waiting for
WARM_STARTS = 256  # prompt starts remembered as prefilled (likely still in the prefix cache): none waits on them


def prompt_start(prompt_token_ids) -> tuple[int, ...] | None:
    """A long prompt's first tokens: what a request waits on while another with the same start
    prefills (None: too short to be worth a wait)."""
    if len(prompt_token_ids) <= SHARED_START_TOKENS:
        return None
    return tuple(prompt_token_ids[:SHARED_START_TOKENS])


class AdmissionGate:
    """The requests waiting for the core, and the KV room and prompt starts of those in it."""

    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens  # the core's KV cache; 0: unknown, nothing held back
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._reserved: dict[str, int] = {}  # in the core: request id -> KV tokens it may come to use
        self._prefilling: dict[str, tuple[int, ...]] = {}  # in the core, no token yet: id -> prompt start
        self._warm: collections.OrderedDict[tuple[int, ...], None] = collections.OrderedDict()

    @property
    def in_core(self) -> frozenset[str]:
        """The requests handed to the core that have not ended."""
        return frozenset(self._reserved)

    def wait(self, request: EngineRequest) -> None:
        """Hold a request (its prompt as the core will run it) until `admit` lets it through."""
        self._waiting.append(request)

    def admit(self) -> list[EngineRequest]:
        """The waiting requests the core may take now, oldest first; they count as in the core."""
        admitted = []
        prefilling = set(self._prefilling.values())
        for request in list(self._waiting):
            start = prompt_start(request.prompt_token_ids)
            if start in self._warm:
                start = None  # computed already: nothing to wait for
            elif start is not None and start in prefilling:
                continue
            need = len(request.prompt_token_ids) + request.sampling.max_tokens
            if self._reserved and self.capacity_tokens and sum(self._reserved.values()) + need > self.capacity_tokens:
                break
            self._waiting.remove(request)
            self._reserved[request.request_id] = need
            if start is not None:
                self._prefilling[request.request_id] = start
                prefilling.add(start)
            admitted.append(request)
        return admitted

    def withdraw(self, request_id: str) -> bool:
        """Drop a request still waiting (True); False when it is in the core (or unknown), which
        then has to be told, and the request ends with `heard(..., finished=True)`."""
        waiting = next((r for r in self._waiting if r.request_id == request_id), None)
        if waiting is None:
            return False
        self._waiting.remove(waiting)
        return True

    def heard(self, request_id: str, finished: bool) -> None:
        """The core (or the adapter) answered for a request: its prompt start is prefilled now,
        and when it `finished` its room is free (a waiting request that ended, by an engine
        failure, leaves the line)."""
        start = self._prefilling.pop(request_id, None)
        if start is not None:
            self._warm[start] = None
            self._warm.move_to_end(start)
            if len(self._warm) > WARM_STARTS:
                self._warm.popitem(last=False)
        if finished:
            self._reserved.pop(request_id, None)
            self.withdraw(request_id)

    def clear(self) -> list[str]:
        """Forget every request (the engine failed them all); those the core holds, to cancel there."""
        in_core = list(self._reserved)
        self._waiting.clear()
        self._reserved.clear()
        self._prefilling.clear()
        return in_core
