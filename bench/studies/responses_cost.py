"""What the Responses surface costs next to chat completions, on one llmq stack.

    python -m bench.studies.responses_cost [--levels 1,16] [--rounds 3] [--max-tokens 128]

One stack (worker + gunicorn API, fresh namespace, result cache off, prefix cache off so a prompt
that the other surface ran first gains nothing), driven by the harness's closed-loop streaming
clients: streamed chat completions (`/v1/chat/completions`) and streamed responses
(`/v1/responses`, foreground, as a chat stream is), in turns, `--rounds` times, each round's order
the reverse of the last, so the machine's drift is shared. Both surfaces get the same prompts each
round, at temperature 0: the same tokens to generate. Reports tokens/s and p50 TTFT per surface
(pooled over the rounds), the responses/chat ratios, and the CPU time the API process and the
worker spent per 1,000 generated tokens on each surface (on a 2-core machine the API's CPU is
taken from the model's).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.harness.clients import openai_request, responses_request
from bench.harness.load import drive, requests_per_client, turns
from bench.harness.measures import cpu_seconds
from bench.harness.results import args_dict, levels, save
from bench.harness.servers import Stack
from bench.harness.stats import summarize

SURFACES = {"chat": openai_request, "responses": responses_request}


def interleaved(stack: Stack, args) -> dict[str, list[dict]]:
    """Per level, `args.rounds` rounds of both surfaces in turn, the same prompts for both; with
    each surface's API and worker CPU time per 1,000 generated tokens (where the cost goes)."""
    results: dict[str, list[dict]] = {name: [] for name in SURFACES}
    api, workers = stack.api_proc.pid, [stack.procs[name].pid for name in stack.worker_names()]
    for clients in args.levels:
        per_client = requests_per_client(clients, args.requests_per_client, args.min_requests)
        pooled = {name: ([], 0.0, 0.0, 0.0) for name in SURFACES}
        for round_, name in turns(list(SURFACES), args.rounds):
            api0, worker0 = cpu_seconds(api), sum(map(cpu_seconds, workers))
            samples, wall = drive(SURFACES[name], stack.url, clients, per_client, args.max_tokens,
                                  first_prompt=round_ * clients * per_client)
            api_cpu, worker_cpu = cpu_seconds(api) - api0, sum(map(cpu_seconds, workers)) - worker0
            print(f"{clients:>2} clients {name:9s} round {round_ + 1} {json.dumps(summarize(clients, samples, wall))}"
                  f" api_cpu_s {api_cpu:.2f} worker_cpu_s {worker_cpu:.2f}", flush=True)
            old = pooled[name]
            pooled[name] = (old[0] + samples, old[1] + wall, old[2] + api_cpu, old[3] + worker_cpu)
            time.sleep(args.settle_s)
        for name, (samples, wall, api_cpu, worker_cpu) in pooled.items():
            row = summarize(clients, samples, wall)
            tokens = sum(s.tokens for s in samples if s.ok) / 1000
            row.update(api_cpu_ms_per_ktok=round(1000 * api_cpu / tokens), worker_cpu_ms_per_ktok=round(1000 * worker_cpu / tokens))
            results[name].append(row)
    return results


def print_table(results: dict[str, list[dict]], levels: list[int]) -> None:
    head = (f"{'clients':>7} | {'chat tok/s':>10} {'resp tok/s':>10} {'ratio':>6} | "
            f"{'chat TTFT p50':>13} {'resp TTFT p50':>13} {'ratio':>6} | API CPU ms/1k tok chat, resp | failed")
    print("\n" + head + "\n" + "-" * len(head))
    for i, clients in enumerate(levels):
        chat, resp = results["chat"][i], results["responses"][i]
        print(f"{clients:>7} | {chat['tokens_per_s']:10.1f} {resp['tokens_per_s']:10.1f} "
              f"{resp['tokens_per_s'] / chat['tokens_per_s']:6.3f} | {chat['ttft_p50']:12.3f}s "
              f"{resp['ttft_p50']:12.3f}s {resp['ttft_p50'] / chat['ttft_p50']:6.3f} | "
              f"{chat['api_cpu_ms_per_ktok']:>16}, {resp['api_cpu_ms_per_ktok']:<10} | {chat['failed']}/{resp['failed']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=levels, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=8, help="at least this many requests per turn")
    parser.add_argument("--settle-s", type=float, default=2.0, help="pause between turns")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)

    stack = Stack(args.redis_url, args.model, args.out / "logs" / "responses-cost",
                  {"LLMQ_MAX_BATCH_SIZE": str(max(args.levels)), "LLMQ_PREFIX_CACHE_MB": "0"})
    try:
        stack.wait_ready(600)
        for request_fn in SURFACES.values():  # warm-up at the largest batch, both surfaces
            drive(request_fn, stack.url, max(args.levels), 1, 16, first_prompt=10_000)
        results = interleaved(stack, args)
    finally:
        stack.stop()
    print_table(results, args.levels)
    path = save(args.out, "responses-cost", {"args": args_dict(args), "results": results})
    print(f"written {path}")


if __name__ == "__main__":
    main()
