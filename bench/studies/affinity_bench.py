"""Prefix caching and prefix affinity: time to first token when prompts share long system prompts,
each of the two off against on.

    python -m bench.studies.affinity_bench [--tenants 8] [--requests 64] [--clients 8 16] [--engine auto]
    python -m bench.studies.affinity_bench --prefix-cache [--requests 40] [--clients 8]

Prefix affinity (the default): two workers (one CPU each), tenants with ~1,000-token system
prompts of their own, `LLMQ_PREFIX_AFFINITY_WAIT_S` 0 against the setting's default. Each run
starts the stack, sends each tenant's first request once (as a running server would already have
seen them), then the measured requests, tenants interleaved, streamed by `--clients` threads.
Reported per run:

- `served_before`: share of measured jobs that ran on a worker that had already started a job of
  the same tenant in this run (read from the job records): where an engine's prefix cache can hit;
- `engine_hit_rate`: the engines' own prefix-cache hit rate over the measured requests, where the
  engine reports it (the reference engine does; OpenVINO's pipeline does not say);
- TTFT p50/p95 as the client sees it, and completion tokens/s over the measured phase;
- affinity outcomes (hit / miss / new) as the pick script recorded them.

`--prefix-cache`: one worker, `LLMQ_PREFIX_CACHE_MB` 0 against 256, on a workload where 80% of
prompts share one ~300-token system prompt (the rest have system prompts of their own); the same
requests in the same order. Reported: TTFT p50/p95 each way, the prefix cache's hit rate, and the
prompt tokens sent against those the cache looked up (a cross-check).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
import requests

from bench.harness.clients import Sample, llmq_job
from bench.harness.prompts import support_question, system_prompt
from bench.harness.results import save
from bench.harness.servers import Stack
from bench.harness.stats import percentile, rounded
from common.keys import Keys
from common.models import resolve_model
from common.prompting import PromptBuilder
from common.settings import Settings

HEARTBEAT_S = 1.0


def engine_prefix_stats(stack: Stack) -> list[dict]:
    """Each model worker's prefix-cache counters, from a fresh heartbeat."""
    time.sleep(HEARTBEAT_S * 2)
    workers = requests.get(f"{stack.url}/health", timeout=10).json()["workers_detail"]
    return [w["prefix_cache"] for w in workers if "prefix_cache" in w]


def ttft_row(samples: list[Sample]) -> dict:
    ttft = [s.ttft for s in samples if s.ok]
    return {"ok": len(ttft), "failed": len(samples) - len(ttft),
            "ttft_p50": rounded(percentile(ttft, 50)), "ttft_p95": rounded(percentile(ttft, 95))}


# --- prefix affinity: two workers -----------------------------------------------------------------

def affinity_run(stack: Stack, systems: list[str], requests_n: int, clients: int, max_tokens: int) -> dict:
    stack.wait_ready(timeout=600)  # a first OpenVINO run exports the model
    deadline = time.monotonic() + 120  # both consumers answer (a heartbeat comes before the consumer)
    while len(requests.get(f"{stack.url}/health?deep=1", timeout=10).json().get("celery_workers") or []) < 2:
        assert time.monotonic() < deadline, "two workers did not come up"
        time.sleep(1)
    ask = lambda i: llmq_job(stack.url, support_question(systems, i), max_tokens)  # noqa: E731
    warm = [ask(t)[0] for t in range(len(systems))]
    before = engine_prefix_stats(stack)
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(ask, range(len(systems), len(systems) + requests_n)))
    wall = time.perf_counter() - started
    after = engine_prefix_stats(stack)

    client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    keys = Keys(stack.namespace)
    records = {}
    for n, job_id in enumerate(warm + [job_id for job_id, _ in done]):
        if job_id is not None:
            worker, started_at, outcome = client.hmget(keys.job(job_id), "worker", "started_at", "prefix_affinity")
            records[job_id] = (n % len(systems), worker, float(started_at or 0), outcome or "")
    seen: set[tuple[int, str]] = set()
    served_before = 0
    for job_id, (tenant, worker, _, _) in sorted(records.items(), key=lambda item: item[1][2]):
        if job_id not in warm and (tenant, worker) in seen:
            served_before += 1
        seen.add((tenant, worker))
    measured = [(job_id, sample) for job_id, sample in done if job_id in records]
    samples = [sample for _, sample in done]
    workers = {records[job_id][1] for job_id, _ in measured}
    result = {
        "clients": clients, **ttft_row(samples),
        "served_before": round(served_before / requests_n, 3),
        "tokens_per_s": round(sum(s.tokens for s in samples) / wall, 1),
        "outcomes": dict(Counter(records[job_id][3] for job_id, _ in measured)),
        "jobs_per_worker": dict(Counter(records[job_id][1] for job_id, _ in measured)),
        "ttft_p50_per_worker": {worker: rounded(percentile([s.ttft for job_id, s in measured
                                                            if s.ok and records[job_id][1] == worker], 50))
                                for worker in workers},
        "warmed_on": [records[job_id][1] for job_id in warm if job_id in records],
    }
    hits = [sum(s[k] for s in stats) for stats in (before, after) for k in ("hit_tokens", "queried_tokens")]
    if before and after and hits[3] > hits[1]:
        result["engine_hit_rate"] = round((hits[2] - hits[0]) / (hits[3] - hits[1]), 3)
    return result


def affinity(args, builder: PromptBuilder) -> list[dict]:
    systems = [system_prompt(builder, args.system_tokens, seed=t) for t in range(args.tenants)]
    results = []
    for clients in args.clients:
        for label, wait_s in (("off", "0"), ("on", str(Settings().prefix_affinity_wait_s))):
            stack = Stack(args.redis_url, args.model, args.out / "logs",
                          {"LLMQ_PREFIX_AFFINITY_WAIT_S": wait_s, "LLMQ_HEARTBEAT_S": str(HEARTBEAT_S),
                           "LLMQ_ENGINE": args.engine, "LLMQ_MAX_BATCH_SIZE": str(args.slots),
                           **({"LLMQ_KV_CACHE_MB": str(args.kv_cache_mb)} if args.kv_cache_mb else {})},
                          workers=2, worker_cpus=["0", "1"])
            try:
                result = {"affinity": label, **affinity_run(stack, systems, args.requests, clients, args.max_tokens)}
            finally:
                stack.stop()
            results.append(result)
            print(json.dumps(result), flush=True)
    print()
    for clients in args.clients:
        off, on = (next(r for r in results if r["clients"] == clients and r["affinity"] == label)
                   for label in ("off", "on"))
        print(f"{clients} clients: served where cached {off['served_before']:.0%} -> {on['served_before']:.0%}; "
              f"TTFT p50 {off['ttft_p50']:.2f}s -> {on['ttft_p50']:.2f}s ({1 - on['ttft_p50'] / off['ttft_p50']:.0%} "
              f"lower), p95 {off['ttft_p95']:.2f}s -> {on['ttft_p95']:.2f}s; tokens/s {off['tokens_per_s']} -> "
              f"{on['tokens_per_s']}")
    return results


# --- the prefix cache: one worker -----------------------------------------------------------------

def shared_prefix_workload(builder: PromptBuilder, count: int, shared_share: float = 0.8) -> list[list[dict]]:
    """`count` tickets, `shared_share` of them under one shared system prompt, the rest each
    under one of its own."""
    rng = random.Random(7)
    shared = system_prompt(builder, 300, seed=0)
    systems = [shared if rng.random() < shared_share else system_prompt(builder, 300, seed=1000 + i)
               for i in range(count)]
    return [support_question([system], i) for i, system in enumerate(systems)]


def prefix_cache_run(stack: Stack, jobs: list[list[dict]], clients: int, max_tokens: int) -> tuple[list[Sample], dict]:
    stack.wait_ready()
    ask = lambda messages: llmq_job(stack.url, messages, max_tokens)[1]  # noqa: E731
    ask(jobs[0])  # warm-up (also seeds the prefix cache once, as any running server would have)
    with ThreadPoolExecutor(clients) as pool:
        samples = list(pool.map(ask, jobs))
    (stats,) = engine_prefix_stats(stack) or [{}]  # one worker, so its stats are the run's
    return samples, stats


def prefix_cache(args, builder: PromptBuilder) -> dict:
    jobs = shared_prefix_workload(builder, args.requests)
    results = {}
    for label, mb in (("off", "0"), ("on", "256")):
        stack = Stack(args.redis_url, args.model, args.out / "logs",
                      {"LLMQ_PREFIX_CACHE_MB": mb, "LLMQ_HEARTBEAT_S": str(HEARTBEAT_S)})
        try:
            samples, stats = prefix_cache_run(stack, jobs, args.clients[0], args.max_tokens)
        finally:
            stack.stop()
        results[label] = {**ttft_row(samples), "prefix_cache": stats}
        print(label, json.dumps(results[label]), flush=True)
    off, on = results["off"], results["on"]
    # cross-check: the worker looked up every prompt token of the run (warm-up included) once
    sent = sum(len(builder.build(messages, None)[1]) for messages in [jobs[0], *jobs])
    print(f"prompt tokens sent {sent}, looked up by the prefix cache "
          f"{on['prefix_cache'].get('queried_tokens')}, of which hits {on['prefix_cache'].get('hit_tokens')}")
    print(f"\nprefix cache hit rate {on['prefix_cache'].get('hit_rate', 0):.1%} of prompt tokens; "
          f"TTFT p50 {off['ttft_p50']:.3f}s -> {on['ttft_p50']:.3f}s "
          f"({off['ttft_p50'] / on['ttft_p50']:.2f}x), p95 {off['ttft_p95']:.3f}s -> {on['ttft_p95']:.3f}s "
          f"({off['ttft_p95'] / on['ttft_p95']:.2f}x)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix-cache", action="store_true",
                        help="one worker, the prefix cache off against on (instead of affinity)")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=None,
                        help="measured requests (default 64; 40 with --prefix-cache)")
    parser.add_argument("--clients", type=int, nargs="+", default=None,
                        help="closed-loop clients of each run (default 8 16; 8 with --prefix-cache)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--slots", type=int, default=8, help="each worker's max batch size")
    parser.add_argument("--kv-cache-mb", type=int, default=None,
                        help="each worker's KV budget (default: the setting's); small enough that one "
                             "worker cannot keep every tenant's prompt cached is where affinity matters most")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    args.requests = args.requests or (40 if args.prefix_cache else 64)
    args.clients = args.clients or ([8] if args.prefix_cache else [8, 16])
    builder = PromptBuilder(resolve_model(Settings(model=args.model, allow_download=False)).path, 4096)
    if args.prefix_cache:
        save(args.out, "prefix", prefix_cache(args, builder))
    else:
        save(args.out, "affinity", affinity(args, builder))


if __name__ == "__main__":
    main()
