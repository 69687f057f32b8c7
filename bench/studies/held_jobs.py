"""What holding many jobs costs a worker, beside its engine: threads, memory, Redis connections and
the CPU of the relay (job threads, Celery, the writes of every job's text to Redis), per held job.

For each level N a worker with LLMQ_MAX_BATCH_SIZE=N starts after N jobs are queued, so it takes
them all at once and its engine batches them together; the run reports the largest batch a step
saw and the worker's own footprint while it held them, apart from its engine's processes.

    python -m bench.studies.held_jobs [--engine vllm] [--levels 16,64,256] [--max-tokens 32] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

from bench.harness.results import levels, markdown_table, save
from common.settings import Settings
from tests.support.held_jobs import hold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--levels", type=levels, default=[16, 64, 256])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for level in args.levels:
        settings = Settings(namespace=f"held{uuid.uuid4().hex[:6]}", redis_url=args.redis_url, model=args.model,
                            engine=args.engine, max_batch_size=level, kv_cache_mb=2048, max_model_len=1024,
                            vllm_enforce_eager=True, coalesce=False, max_queue=10_000)
        row = hold(settings, level, args.max_tokens, args.out / f"held-{args.engine}-{level}.log")
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n" + markdown_table(
        ["held jobs", "largest step", "threads", "worker RSS MB", "Redis connections",
         "worker CPU s per 1k tokens", "engine CPU s per 1k tokens"],
        [[r["jobs"], r["max_batch"], r["threads"], r["rss_mb"], r["redis_connections"],
          f"{r['worker_cpu_s'] * 1000 / max(r['tokens'], 1):.2f}", f"{r['engine_cpu_s'] * 1000 / max(r['tokens'], 1):.2f}"]
         for r in rows]))
    save(args.out, "held-jobs", rows)


if __name__ == "__main__":
    main()
