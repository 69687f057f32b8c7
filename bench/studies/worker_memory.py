"""Memory and start-up of one worker per engine: a stack (worker + API) on the embedded model with
1 GiB of KV and 16 slots, 16 streamed requests of 64 tokens, then the resident (RSS) and
proportional (PSS: shared pages split between processes) memory of the worker and every process
it started (engine core, vLLM's executor, OpenVINO's core).

    python -m bench.studies.worker_memory [--engines openvino,vllm,hf]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import psutil

from bench.harness.clients import openai_request
from bench.harness.load import drive
from bench.harness.servers import Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="openvino,vllm,hf")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/llmq-worker-memory"))
    args = parser.parse_args()
    print("| engine | stack ready | processes | RSS MiB | PSS MiB |\n|---|---|---|---|---|")
    for engine in args.engines.split(","):
        env = {"LLMQ_ENGINE": engine, "LLMQ_KV_CACHE_MB": "1024", "LLMQ_MAX_BATCH_SIZE": "16",
               "LLMQ_VLLM_ENFORCE_EAGER": "true"}
        started = time.monotonic()
        stack = Stack(args.redis_url, "embedded", args.logs / engine, env)
        try:
            stack.wait_ready(600)
            ready = time.monotonic() - started
            drive(openai_request, stack.url, 16, 1, 64)
            worker = psutil.Process(stack.procs["worker"].pid)
            procs = [worker, *worker.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in procs) / 2**20
            pss = sum(p.memory_full_info().pss for p in procs) / 2**20
            print(f"| {engine} | {ready:.1f} s | {len(procs)} | {rss:.0f} | {pss:.0f} |", flush=True)
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
