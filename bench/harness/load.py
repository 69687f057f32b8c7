"""Load: closed-loop clients driving one server, and several servers taking turns.

These shared machines drift by several percent within minutes; servers (or settings) compared in
one run take turns, each round's order the reverse of the last, so the drift is spread over all
of them instead of handed to whichever ran last."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from bench.harness.clients import Sample
from bench.harness.prompts import WORKLOADS

RequestFn = Callable[[str, str, int], Sample]


def drive(request_fn: RequestFn, url: str, clients: int, per_client: int, max_tokens: int,
          first_prompt: int = 0, workload: str = "stories") -> tuple[list[Sample], float]:
    """`clients` closed-loop clients, `per_client` requests each (each submits, reads its answer
    to the end, and submits again), distinct prompts of `workload` (bench/harness/prompts.py)
    from `first_prompt` on: the samples and the wall time."""
    prompt = WORKLOADS[workload]

    def client(index: int) -> list[Sample]:
        numbers = range(first_prompt + index * per_client, first_prompt + (index + 1) * per_client)
        return [request_fn(url, prompt(n), max_tokens) for n in numbers]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        samples = [s for batch in pool.map(client, range(clients)) for s in batch]
    return samples, time.perf_counter() - start


def drive_server(server, clients: int, per_client: int, max_tokens: int,
                 first_prompt: int = 0, workload: str = "stories") -> tuple[list[Sample], float]:
    """`drive` with the OpenAI streaming chat client against `server.url`, or the server's own
    `drive` where it has one (an engine driven in process: bench/harness/engine_app.py)."""
    if hasattr(server, "drive"):
        return server.drive(clients, per_client, max_tokens, first_prompt, workload)
    from bench.harness.clients import openai_request

    return drive(openai_request, server.url, clients, per_client, max_tokens, first_prompt, workload)


def turns(names: list[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, name): every name each round, each round's order the reverse of the last."""
    for round_ in range(rounds):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            yield round_, name


def requests_per_client(clients: int, per_client: int, min_requests: int) -> int:
    """At least `per_client`, and enough that a turn has `min_requests` requests however few the
    clients (a single client's two requests are too few to measure)."""
    return max(per_client, -(-min_requests // clients))
