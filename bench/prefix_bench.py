"""Prefix cache: time to first token with and without it, on a workload where 80% of prompts share
a ~300-token system prompt (the rest have system prompts of their own).

    python -m bench.prefix_bench [--requests 40] [--clients 8] [--model embedded]

Starts the stack twice (LLMQ_PREFIX_CACHE_MB=0, then the default), same requests, same order.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench.bench import Sample, _stream
from bench.stack import Stack
from common.models import resolve_model
from common.prompting import PromptBuilder
from common.settings import Settings

HEARTBEAT_S = 1.0
POLICY = ("Section {n}: customers may return unused items within thirty days of delivery; refunds are "
          "issued to the original payment method within five business days after the warehouse "
          "confirms the return; fragile goods need photos of the damage and the packaging. ")


def system_prompt(builder: PromptBuilder, target_tokens: int, seed: int) -> str:
    text, n = f"You are support agent #{seed} for an online shop. Follow the policies. ", 1
    while len(builder.encode(text, add_special_tokens=False)) < target_tokens:
        text += POLICY.format(n=n)
        n += 1
    return text


def workload(builder: PromptBuilder, count: int, shared_share: float = 0.8) -> list[list[dict]]:
    rng = random.Random(7)
    shared = system_prompt(builder, 300, seed=0)
    questions = ["Where is my parcel?", "Can I return a lamp?", "My mug arrived broken.",
                 "How long do refunds take?", "Do you ship abroad?", "I lost my receipt."]
    jobs = []
    for i in range(count):
        system = shared if rng.random() < shared_share else system_prompt(builder, 300, seed=1000 + i)
        jobs.append([{"role": "system", "content": system},
                     {"role": "user", "content": f"{questions[i % len(questions)]} (ticket {i})"}])
    return jobs


def run(stack: Stack, jobs: list[list[dict]], clients: int, max_tokens: int) -> tuple[list[Sample], dict]:
    stack.wait_ready()

    def one(messages) -> Sample:
        t0 = time.perf_counter()
        job = requests.post(f"{stack.url}/v1/jobs", json={"messages": messages, "max_tokens": max_tokens,
                                                          "temperature": 0, "cache": False}, timeout=60)
        with requests.get(f"{stack.url}{job.json()['links']['events']}", stream=True, timeout=600) as resp:
            return _stream(resp, t0)

    one(jobs[0])  # warm-up (also seeds the prefix cache once, as any running server would have)
    with ThreadPoolExecutor(clients) as pool:
        samples = list(pool.map(one, jobs))
    time.sleep(HEARTBEAT_S * 2)  # the stats come with the worker's heartbeat: wait for a fresh one
    health = requests.get(f"{stack.url}/health", timeout=10).json()
    stack.stop()
    (worker,) = health["workers_detail"]  # one worker, so its stats are the run's
    return samples, worker.get("prefix_cache", {})


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    model = resolve_model(Settings(model=args.model, allow_download=False))
    builder = PromptBuilder(model.path, 4096)
    jobs = workload(builder, args.requests)
    results = {}
    for label, mb in (("off", "0"), ("on", "256")):
        stack = Stack(args.redis_url, args.model, args.out / "logs",
                      {"LLMQ_PREFIX_CACHE_MB": mb, "LLMQ_HEARTBEAT_S": str(HEARTBEAT_S)})
        samples, prefix = run(stack, jobs, args.clients, args.max_tokens)
        ttft = [s.ttft for s in samples if s.ok]
        results[label] = {"ok": len(ttft), "failed": len(samples) - len(ttft),
                          "ttft_p50": round(pct(ttft, 50), 3), "ttft_p95": round(pct(ttft, 95), 3),
                          "prefix_cache": prefix}
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
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"prefix-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
