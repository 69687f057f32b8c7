"""Batches against interactive traffic: interactive p95 time to first token at N clients, alone
and while a large batch runs, and the batch's throughput when it runs alone.

    flock /tmp/llmq-bench.lock python -m bench.studies.batch_bench [--lines 1000] [--clients 8]

One stack (model worker, model-less control worker, API) on loopback. Phases, in order:
1. interactive alone: N clients, each streaming R chat completions one after another;
2. batch alone: a batch of L lines (max_tokens --batch-max-tokens), created to completed;
3. interactive while a second batch of L lines is in progress (the batch is then cancelled, to
   keep the run bounded; its lines left are accounted for as batch_cancelled).
"""
from __future__ import annotations

import argparse
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench.harness.clients import openai_request, served_model
from bench.harness.servers import Stack
from bench.harness.stats import percentile


def interactive(url: str, clients: int, rounds: int, max_tokens: int, tag: str) -> dict:
    """`clients` clients, each streaming `rounds` chat completions one after another: p50/p95 of
    the time to the first content."""
    def client(c: int) -> list[float]:
        samples = [openai_request(url, f"[{tag} {c}.{r}] Give one tip for writing clear code.", max_tokens)
                   for r in range(rounds)]
        return [s.ttft for s in samples if s.ok and s.ttft]

    with ThreadPoolExecutor(clients) as pool:
        ttfts = [t for times in pool.map(client, range(clients)) for t in times]
    return {"requests": clients * rounds, "answered": len(ttfts), "p50_ttft_s": percentile(ttfts, 50),
            "p95_ttft_s": percentile(ttfts, 95)}


def start_batch(url: str, model: str, lines: int, max_tokens: int, tag: str) -> str:
    text = "".join(json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": model, "max_tokens": max_tokens, "cache": False,
                                        "messages": [{"role": "user", "content": f"Fact {i} ({tag}) about rivers?"}]}})
                   + "\n" for i in range(lines))
    file_id = requests.post(f"{url}/v1/files", data={"purpose": "batch"},
                            files={"file": ("in.jsonl", io.BytesIO(text.encode()))}, timeout=60).json()["id"]
    return requests.post(f"{url}/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                    "completion_window": "24h"}, timeout=60).json()["id"]


def wait(url: str, batch_id: str, statuses: tuple[str, ...], timeout: float = 1800) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = requests.get(f"{url}/v1/batches/{batch_id}", timeout=30).json()
        if state["status"] in statuses:
            return state
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} still {state['status']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--batch-max-tokens", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32, help="per interactive request")
    parser.add_argument("--logs", default="/tmp/llmq-batch-bench")
    args = parser.parse_args()

    stack = Stack(args.redis, args.model, Path(args.logs))
    stack.start_batch_worker()
    try:
        stack.wait_ready()
        model = served_model(stack.url)
        interactive(stack.url, 2, 1, 4, "warm-up")
        alone = interactive(stack.url, args.clients, args.rounds, args.max_tokens, "alone")

        t0 = time.perf_counter()
        state = wait(stack.url, start_batch(stack.url, model, args.lines, args.batch_max_tokens, "solo"),
                     ("completed", "failed", "expired", "cancelled"))
        elapsed = time.perf_counter() - t0
        counts = state["request_counts"]
        batch_alone = {"lines": counts["total"], "completed": counts["completed"], "seconds": round(elapsed, 1),
                       "lines_per_s": round(counts["completed"] / elapsed, 2),
                       "output_tokens_per_s": round(state["usage"]["output_tokens"] / elapsed, 1)}

        batch_id = start_batch(stack.url, model, args.lines, args.batch_max_tokens, "mixed")
        wait(stack.url, batch_id, ("in_progress",))
        time.sleep(3)  # let the batch fill the worker's slots
        under = interactive(stack.url, args.clients, args.rounds, args.max_tokens, "under-batch")
        progress = requests.get(f"{stack.url}/v1/batches/{batch_id}", timeout=30).json()["request_counts"]
        requests.post(f"{stack.url}/v1/batches/{batch_id}/cancel", timeout=30)
        ended = wait(stack.url, batch_id, ("cancelled", "completed"))
        counts = ended["request_counts"]
        accounted = counts["completed"] + counts["failed"] == counts["total"]
    finally:
        stack.stop()
    report = {"interactive_alone": alone, "interactive_under_batch": under, "batch_alone": batch_alone,
              "batch_lines_done_during_interactive_phase": progress["completed"],
              "cancelled_batch_every_line_accounted": accounted,
              "p95_ttft_ratio_under_batch": round(under["p95_ttft_s"] / alone["p95_ttft_s"], 2),
              "settings": {"lines": args.lines, "batch_max_tokens": args.batch_max_tokens,
                           "clients": args.clients, "rounds": args.rounds, "interactive_max_tokens": args.max_tokens}}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
