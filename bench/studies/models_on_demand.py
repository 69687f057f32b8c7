"""Models on demand: two catalog models behind one endpoint, one worker, alternating bursts.

    python -m bench.studies.models_on_demand [--rounds 3] [--burst 8] [--max-tokens 32] [--engine auto]

The catalog holds the embedded model and a second small model built here (a 2-layer random-weight
Qwen2 over the embedded model's vocabulary, `python -m bench.make_qwen_size_model --tiny`: it answers
differently, which is the point). Two runs, each a fresh stack with one worker:

- `room for one` (`LLMQ_WORKER_MAX_MODELS=1`): every burst for the other model finds it cold, so
  the worker unloads its idle model and loads the one asked for;
- `room for both` (`LLMQ_WORKER_MAX_MODELS=2`): both stay loaded after their first use; the same
  prompts, so its answers are the reference the first run must match (greedy decoding).

Each run first asks each model once (a first export to OpenVINO IR is not a load), then sends the
bursts: `--burst` streamed requests at once for one model, then for the other, `--rounds` times.
Reported per burst: whether the model was cold, its load time (the worker's own measure), time to
first token of the burst's first request and p50 of the burst, and per run the jobs lost (not
succeeded) and answered by the wrong model (text differs from the reference, or the job ran on
another model's runtime).
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
import requests

from bench.harness.clients import llmq_job
from bench.harness.prompts import TOPICS
from bench.harness.results import save
from bench.harness.servers import Stack
from bench.harness.stats import percentile
from common.keys import Keys
from common.settings import Settings
from tests.support.random_models import TINY, build

MODELS = ("smol", "tiny")


def catalog_file(out: Path, engine: str) -> Path:
    tiny = build(Settings().model_cache_dir / "tiny-random", TINY)
    path = out / "catalog.json"
    path.write_text(json.dumps({"default": "smol", "models": {
        "smol": {"source": "embedded", "engine": engine},
        "tiny": {"source": str(tiny), "engine": engine}}}))
    return path


def ask(stack: Stack, model: str, prompt: str, max_tokens: int) -> dict:
    job_id, sample = llmq_job(stack.url, [{"role": "user", "content": prompt}], max_tokens, model=model)
    if job_id is None:
        return {"model": model, "prompt": prompt, "ok": False}
    record = requests.get(f"{stack.url}/v1/jobs/{job_id}", timeout=30).json()
    # which model's runtime ran it: the worker's name in the fleet, kept in Redis, not shown by the API
    keys = Keys(stack.namespace)
    worker = redis.Redis.from_url(stack.redis_url, decode_responses=True).hget(keys.job(job_id), "worker")
    return {"model": model, "prompt": prompt, "ok": sample.ok, "ttft": sample.ttft, "text": record.get("text"),
            "ran_as": record.get("model"), "worker": worker}


def last_loads(stack: Stack) -> dict[str, dict]:
    return {m["id"]: m["llmq"] for m in requests.get(f"{stack.url}/v1/models", timeout=30).json()["data"]}


def run(stack: Stack, rounds: int, burst: int, max_tokens: int) -> list[dict]:
    for model in MODELS:  # first use: exports and first loads, not measured
        assert ask(stack, model, "Say hello.", 4)["ok"], f"{model} does not answer"
    bursts = []
    with ThreadPoolExecutor(burst) as pool:
        for r in range(rounds):
            for model in MODELS:
                before = last_loads(stack)[model]
                cold = before["state"] != "loaded"
                prompts = [f"Write one sentence about {TOPICS[(r * burst + i) % len(TOPICS)]} (note {r}.{i})."
                           for i in range(burst)]
                answers = list(pool.map(lambda p, m=model: ask(stack, m, p, max_tokens), prompts))
                after = last_loads(stack)[model]
                ttfts = [a["ttft"] for a in answers if a["ok"]]
                bursts.append({"round": r, "model": model, "cold": cold,
                               "load_s": after["load_s"] if cold else None,
                               "first_ttft": answers[0].get("ttft"), "ttft_p50": percentile(ttfts, 50),
                               "answers": answers})
                print(json.dumps({k: v for k, v in bursts[-1].items() if k != "answers"}), flush=True)
    return bursts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--idle-s", type=float, default=1.0, help="LLMQ_MODEL_IDLE_S of the worker")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    catalog = catalog_file(args.out, args.engine)
    runs = {}
    for label, room in (("room for both", 2), ("room for one", 1)):
        stack = Stack(args.redis_url, "embedded", args.out / "logs",
                      {"LLMQ_CATALOG": str(catalog), "LLMQ_WORKER_MAX_MODELS": str(room),
                       "LLMQ_MODEL_IDLE_S": str(args.idle_s), "LLMQ_HEARTBEAT_S": "1"})
        try:
            stack.wait_ready()
            runs[label] = run(stack, args.rounds, args.burst, args.max_tokens)
        finally:
            stack.stop()
    reference = {(a["model"], a["prompt"]): a["text"] for b in runs["room for both"] for a in b["answers"]}
    print()
    for label, bursts in runs.items():
        answers = [a for b in bursts for a in b["answers"]]
        lost = sum(not a["ok"] for a in answers)
        wrong = sum(a["ok"] and (a["text"] != reference[(a["model"], a["prompt"])] or a["ran_as"] != a["model"]
                                 or not (a["worker"] or "").endswith(f"/{a['model']}")) for a in answers)
        cold = [b for b in bursts if b["cold"]]
        warm = [b for b in bursts if not b["cold"]]
        line = f"{label}: {len(answers)} jobs, lost {lost}, wrong model {wrong}; "
        if cold:
            line += (f"cold bursts {len(cold)}: load {percentile([b['load_s'] for b in cold], 50):.2f}s p50, "
                     f"first TTFT {percentile([b['first_ttft'] for b in cold], 50):.2f}s p50; ")
        if warm:
            line += f"warm bursts {len(warm)}: first TTFT {percentile([b['first_ttft'] for b in warm], 50):.2f}s p50"
        print(line)
    save(args.out, "models-on-demand", runs)


if __name__ == "__main__":
    main()
