"""Short engine benchmark: tokens/s of N concurrent requests vs one at a time, on one engine.

    python bench/gpu_engine.py --engine vllm [--requests 32] [--max-tokens 128]   # a GPU worker
    python bench/gpu_engine.py --engine hf --requests 4 --max-tokens 16          # the CPU engine

Drives the engine directly (no Redis, no Celery), through the same `add_request`/`step` interface
the worker uses, and prints one JSON line: tokens/s sequential and batched, their ratio, and the
largest batch seen. Figures are ratios measured in one run on one machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.models import resolve_model  # noqa: E402
from common.prompting import PromptBuilder  # noqa: E402
from common.settings import Settings  # noqa: E402
from worker.engine.sequence import EngineRequest, Sampling  # noqa: E402
from worker.engine.registry import build_engine  # noqa: E402

PROMPTS = ["Explain what a job queue is.", "Name three rivers in Europe.", "Write a haiku about rain.",
           "What is 17 times 3?", "Describe a cat in one sentence.", "Why is the sky blue?"]


def run(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> tuple[int, float]:
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}{i}", ids, Sampling(max_tokens=max_tokens, temperature=0)))
    tokens, start = 0, time.perf_counter()
    while engine.has_unfinished():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["hf", "vllm"], default="vllm")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model", default="embedded")
    args = parser.parse_args()
    settings = Settings(engine=args.engine, model=args.model, max_batch_size=max(args.requests, 1),
                        allow_download=False)
    model = resolve_model(settings, prepare=True)
    engine, _ = build_engine(settings, model)
    builder = PromptBuilder(model.path, settings.max_model_len)
    prompts = [builder.build([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], None)[1]
               for i in range(args.requests)]
    run(engine, prompts[:1], 4, "warm")
    seq_tokens, seq_s = 0, 0.0
    for i, ids in enumerate(prompts[: max(1, min(4, args.requests))]):
        tokens, secs = run(engine, [ids], args.max_tokens, f"seq{i}-")
        seq_tokens, seq_s = seq_tokens + tokens, seq_s + secs
    batch_tokens, batch_s = run(engine, prompts, args.max_tokens, "batch")
    seq_rate, batch_rate = seq_tokens / seq_s, batch_tokens / batch_s
    print(json.dumps({"engine": args.engine, "model": model.name, "requests": args.requests,
                      "max_tokens": args.max_tokens, "sequential_tokens_per_s": round(seq_rate, 1),
                      "batched_tokens_per_s": round(batch_rate, 1),
                      "batched_over_sequential": round(batch_rate / seq_rate, 2),
                      "max_batch_seen": engine.stats.max_batch_size}))


if __name__ == "__main__":
    main()
