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
import json
import time
import uuid
from pathlib import Path

import redis

from bench.harness.clients import Sample, openai_request
from bench.harness.load import drive
from bench.harness.results import levels, markdown_table
from bench.harness.servers import Stack
from bench.harness.stats import percentile
from common.keys import Keys
from common.models import resolve_model
from common.prompting import PromptBuilder
from common.settings import Settings
from worker.engine.loop import EngineLoop
from worker.engine.registry import build_engine
from worker.engine.sequence import EngineRequest, Sampling

SEGMENTS = ("sent->created", "created->started", "started->logged", "logged->seen")


def timed_request(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat completion (the harness's client): its job id and the wall-clock
    instants it was sent and its first text was read."""
    sent = time.time()
    sample = openai_request(url, prompt, max_tokens)
    return {"job_id": sample.answer_id.split("-", 1)[-1], "sent": sent,
            "seen": sent + sample.ttft if sample.ttft else None}


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


def engine_loop(args) -> None:
    """The same load on the worker's engine and `EngineLoop` alone (see the module's text)."""
    settings = Settings(model=args.model, engine=args.engine, max_batch_size=max(args.clients), kv_cache_mb=1024,
                        allow_download=False)
    model = resolve_model(settings, prepare=True)
    engine, _ = build_engine(settings, model)
    loop, builder = EngineLoop(engine), PromptBuilder(model.path, settings.max_model_len)

    def request(_url: str, prompt: str, max_tokens: int) -> Sample:
        """`drive`'s request, submitted to the loop: TTFT from submit to the first output."""
        ids = builder.build([{"role": "user", "content": prompt}], None)[1]
        start, sample = time.perf_counter(), Sample(ok=False)
        stream = loop.submit(EngineRequest(uuid.uuid4().hex, ids, Sampling(max_tokens=max_tokens, temperature=0)))
        while not sample.ok:
            output = stream.get(600)
            if output.new_token_ids and not sample.ttft:
                sample.ttft = time.perf_counter() - start
            sample.tokens += len(output.new_token_ids)
            sample.ok = output.finished
        return sample

    try:
        first = 10_000
        for clients in [max(args.clients), *args.clients]:  # the first level warms up
            samples, wall = drive(request, "", clients, args.requests_per_client, args.max_tokens, first)
            first += len(samples)
            firsts = [s.ttft for s in samples if s.ttft]
            print(json.dumps({"clients": clients, "tokens_per_s": round(sum(s.tokens for s in samples) / wall, 1),
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
        for clients in args.clients:
            timings, _ = drive(timed_request, stack.url, clients, args.requests_per_client, args.max_tokens, first)
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
