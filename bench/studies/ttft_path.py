"""Where a streamed request's time to first token goes in llmq, segment by segment, under load.

    python -m bench.studies.ttft_path [--model PATH] [--clients 8,32] [--requests-per-client 2]
    python -m bench.studies.ttft_path --engine-loop [--model PATH] ...

Starts its own llmq stack (worker + API, fresh namespace, OpenVINO unless LLMQ_ENGINE says
otherwise), warms it up, then drives closed-loop OpenAI streaming clients (the harness's story
prompts, greedy, `--max-tokens`). Each request's way is cut at four instants, all read off this
machine's one clock:

- sent: the client posts the request;
- created: the job's record is written (`created_at`, by the API's admission);
- started: a worker claimed the job (`started_at`);
- logged: its first text is in the token log (the first chunk entry's id, Redis's time in ms);
- seen: the client read its first text.

Per level it prints the p50 and p90 of each segment: sent->created (the API: HTTP, validation,
admission), created->started (the ticket's way to a worker, its pick and claim), started->logged
(the hand-off to the engine, the step the request waits for, its prefill, the first token's way
back to the relay and its write), logged->seen (the API's relay of the log to the stream).

`--engine-loop` measures the part of started->logged that is the engine's: the engine built as a
worker builds it, behind the worker's `EngineLoop`, in this process, with no Redis, API or relay;
the same closed-loop clients submit to it directly. It prints tokens/s and submit->first output.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
import requests

from bench.harness.clients import openai_request, served_model
from bench.harness.load import drive
from bench.harness.prompts import story
from bench.harness.results import levels, markdown_table
from bench.harness.servers import Stack
from bench.harness.stats import percentile
from common.keys import Keys
from common.models import resolve_model
from common.prompting import PromptBuilder
from common.settings import Settings
from common.sseclient import iter_sse
from worker.engine.loop import EngineLoop
from worker.engine.registry import build_engine
from worker.engine.sequence import EngineRequest, Sampling

SEGMENTS = ("sent->created", "created->started", "started->logged", "logged->seen")


def timed_request(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat completion: its job id and the wall-clock instants it was sent and its
    first text was read."""
    sent = time.time()
    seen, job_id = None, None
    with requests.post(f"{url}/v1/chat/completions", stream=True, timeout=600, json={
            "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}) as resp:
        for event in iter_sse(resp.iter_lines(chunk_size=None)):
            if event.data == "[DONE]":
                break
            body = event.json()
            job_id = job_id or body["id"].split("-", 1)[1]
            if seen is None and body["choices"] and body["choices"][0].get("delta", {}).get("content"):
                seen = time.time()
    return {"job_id": job_id, "sent": sent, "seen": seen}


def segments(client: redis.Redis, keys: Keys, timing: dict) -> dict[str, float] | None:
    """The request's four segments in seconds (None when its job or first chunk is not there)."""
    record = client.hmget(keys.job(timing["job_id"]), "created_at", "started_at")
    first = client.xrange(keys.events(timing["job_id"]), count=1)
    if None in record or not first or timing["seen"] is None:
        return None
    created, started = (json.loads(value) for value in record)
    logged = int(first[0][0].decode().split("-")[0]) / 1000
    return {"sent->created": created - timing["sent"], "created->started": started - created,
            "started->logged": logged - started, "logged->seen": timing["seen"] - logged}


def run_level(url: str, model: str, clients: int, per_client: int, max_tokens: int, first: int) -> list[dict]:
    def client(index: int) -> list[dict]:
        numbers = range(first + index * per_client, first + (index + 1) * per_client)
        return [timed_request(url, model, story(n), max_tokens) for n in numbers]

    with ThreadPoolExecutor(clients) as pool:
        return [t for batch in pool.map(client, range(clients)) for t in batch]


def engine_loop(args) -> None:
    """The same load on the worker's engine and `EngineLoop` alone (see the module's text)."""
    settings = Settings(model=args.model, engine=args.engine, max_batch_size=max(args.clients), kv_cache_mb=1024,
                        allow_download=False)
    model = resolve_model(settings, prepare=True)
    engine, _ = build_engine(settings, model)
    loop, builder, numbers = EngineLoop(engine), PromptBuilder(model.path, settings.max_model_len), itertools.count()

    def request(n: int, max_tokens: int) -> tuple[float, int]:
        ids = builder.build([{"role": "user", "content": story(n)}], None)[1]
        start, first, tokens = time.perf_counter(), None, 0
        stream = loop.submit(EngineRequest(f"r{n}", ids, Sampling(max_tokens=max_tokens, temperature=0)))
        while True:
            output = stream.get(600)
            if output.new_token_ids and first is None:
                first = time.perf_counter() - start
            tokens += len(output.new_token_ids)
            if output.finished:
                return first, tokens

    def client(per_client: int, max_tokens: int) -> list[tuple[float, int]]:
        return [request(10_000 + next(numbers), max_tokens) for _ in range(per_client)]

    try:
        for clients in [max(args.clients), *args.clients]:  # the first level warms up
            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                done = [r for batch in pool.map(lambda _: client(args.requests_per_client, args.max_tokens),
                                                range(clients)) for r in batch]
            wall, firsts = time.perf_counter() - start, [r[0] for r in done if r[0] is not None]
            print(json.dumps({"clients": clients, "tokens_per_s": round(sum(r[1] for r in done) / wall, 1),
                              "submit_to_first_output": [round(percentile(firsts, q), 3) for q in (50, 90)]}),
                  flush=True)
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--clients", type=levels, default=[8, 32])
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--engine", default="openvino")
    parser.add_argument("--engine-loop", action="store_true",
                        help="the worker's engine and EngineLoop alone, in this process (no Redis, API or relay)")
    args = parser.parse_args()
    if args.engine_loop:
        engine_loop(args)
        return
    batch = str(max(args.clients))
    stack = Stack(args.redis_url, args.model, Path("bench/results/logs/ttft_path"),
                  {"LLMQ_ENGINE": args.engine, "LLMQ_MAX_BATCH_SIZE": batch, "LLMQ_KV_CACHE_MB": "1024"})
    client, keys, rows, first = redis.Redis.from_url(args.redis_url), Keys(stack.namespace), [], 0
    try:
        stack.wait_ready(600)
        drive(openai_request, stack.url, max(args.clients), 1, 16, first_prompt=10_000)  # warm-up
        model = served_model(stack.url)
        for clients in args.clients:
            timings = run_level(stack.url, model, clients, args.requests_per_client, args.max_tokens, first)
            first += len(timings)
            cut = [s for s in (segments(client, keys, t) for t in timings) if s is not None]
            ttft = [t["seen"] - t["sent"] for t in timings if t["seen"] is not None]
            row = {"clients": clients, "requests": len(cut), "ttft_p50": round(percentile(ttft, 50), 3),
                   **{name: [round(percentile([s[name] for s in cut], q), 3) for q in (50, 90)]
                      for name in SEGMENTS}}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        stack.stop()
    print("\n" + markdown_table(["clients", "TTFT p50", *(f"{name} p50 / p90" for name in SEGMENTS)],
                                [[r["clients"], f"{r['ttft_p50']:.3f} s",
                                  *(f"{r[name][0]:.3f} / {r[name][1]:.3f} s" for name in SEGMENTS)]
                                 for r in rows]))


if __name__ == "__main__":
    main()
