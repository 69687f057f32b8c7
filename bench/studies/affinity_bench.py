"""Prefix affinity: two workers, tenants with long system prompts of their own, affinity on vs off.

    python -m bench.affinity_bench [--tenants 8] [--requests 64] [--clients 8 16] [--engine auto]

Each run starts the stack (two workers, one CPU each), sends each tenant's first request once (as
a running server would already have seen them), then the measured requests, tenants interleaved,
streamed by `--clients` threads. Reported per run:

- `served_before`: share of measured jobs that ran on a worker that had already started a job of
  the same tenant in this run (read from the job records): where an engine's prefix cache can hit;
- `engine_hit_rate`: the engines' own prefix-cache hit rate over the measured requests, where the
  engine reports it (the reference engine does; OpenVINO's pipeline does not say);
- TTFT p50/p95 as the client sees it, and completion tokens/s over the measured phase;
- affinity outcomes (hit / miss / new) as the pick script recorded them.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
import requests

from bench.bench import Sample, _stream
from bench.prefix_bench import pct, system_prompt
from bench.stack import Stack
from common.keys import Keys
from common.models import resolve_model
from common.prompting import PromptBuilder
from common.settings import Settings

HEARTBEAT_S = 1.0
QUESTIONS = ["Where is my parcel?", "Can I return a lamp?", "My mug arrived broken.",
             "How long do refunds take?", "Do you ship abroad?", "I lost my receipt."]


def tenant_messages(systems: list[str], i: int) -> list[dict]:
    tenant = i % len(systems)
    return [{"role": "system", "content": systems[tenant]},
            {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (ticket {i})"}]


def submit(stack: Stack, messages: list[dict], max_tokens: int) -> tuple[str, Sample]:
    t0 = time.perf_counter()
    job = requests.post(f"{stack.url}/v1/jobs", json={"messages": messages, "max_tokens": max_tokens,
                                                      "temperature": 0, "cache": False}, timeout=60).json()
    with requests.get(f"{stack.url}{job['links']['events']}", stream=True, timeout=600) as resp:
        return job["id"], _stream(resp, t0)


def engine_prefix_stats(stack: Stack) -> tuple[int, int] | None:
    """(hit tokens, queried tokens) summed over the workers, from a fresh heartbeat."""
    time.sleep(HEARTBEAT_S * 2)
    workers = requests.get(f"{stack.url}/health", timeout=10).json()["workers_detail"]
    stats = [w["prefix_cache"] for w in workers if "prefix_cache" in w]
    if not stats:
        return None
    return sum(s["hit_tokens"] for s in stats), sum(s["queried_tokens"] for s in stats)


def run(stack: Stack, systems: list[str], requests_n: int, clients: int, max_tokens: int) -> dict:
    stack.wait_ready(timeout=600)  # a first OpenVINO run exports the model
    deadline = time.monotonic() + 120  # both consumers answer (a heartbeat comes before the consumer)
    while len(requests.get(f"{stack.url}/health?deep=1", timeout=10).json().get("celery_workers") or []) < 2:
        assert time.monotonic() < deadline, "two workers did not come up"
        time.sleep(1)
    warm = [submit(stack, tenant_messages(systems, t), max_tokens)[0] for t in range(len(systems))]
    before = engine_prefix_stats(stack)
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(lambda i: submit(stack, tenant_messages(systems, i), max_tokens),
                             range(len(systems), len(systems) + requests_n)))
    wall = time.perf_counter() - started
    after = engine_prefix_stats(stack)

    client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    keys = Keys(stack.env["LLMQ_NAMESPACE"])
    records = {}
    for n, job_id in enumerate(warm + [job_id for job_id, _ in done]):
        worker, started_at, outcome = client.hmget(keys.job(job_id), "worker", "started_at", "prefix_affinity")
        records[job_id] = (n % len(systems), worker, float(started_at), outcome or "")
    seen: set[tuple[int, str]] = set()
    served_before = 0
    for job_id, (tenant, worker, _, _) in sorted(records.items(), key=lambda item: item[1][2]):
        if job_id not in warm and (tenant, worker) in seen:
            served_before += 1
        seen.add((tenant, worker))
    samples = [sample for _, sample in done]
    ttft = [s.ttft for s in samples if s.ok]
    result = {
        "clients": clients, "ok": len(ttft), "failed": len(samples) - len(ttft),
        "served_before": round(served_before / requests_n, 3),
        "ttft_p50": round(pct(ttft, 50), 3), "ttft_p95": round(pct(ttft, 95), 3),
        "tokens_per_s": round(sum(s.tokens for s in samples) / wall, 1),
        "outcomes": dict(Counter(records[job_id][3] for job_id, _ in done)),
        "jobs_per_worker": dict(Counter(records[job_id][1] for job_id, _ in done)),
        "ttft_p50_per_worker": {worker: round(pct([s.ttft for job_id, s in done if s.ok and records[job_id][1] == worker], 50), 3)
                                for worker in {records[job_id][1] for job_id, _ in done}},
        "warmed_on": [records[job_id][1] for job_id in warm],
    }
    if before and after and after[1] > before[1]:
        result["engine_hit_rate"] = round((after[0] - before[0]) / (after[1] - before[1]), 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 16])
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
    model = resolve_model(Settings(model=args.model, allow_download=False))
    builder = PromptBuilder(model.path, 4096)
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
                result = {"affinity": label, **run(stack, systems, args.requests, clients, args.max_tokens)}
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
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"affinity-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
