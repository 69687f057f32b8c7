"""Prompt lookup (n-gram speculative decoding): decode speed with and without it, one client.

    python -m bench.studies.prompt_lookup [--rounds 3] [--max-tokens 128] [--tokens 4] [--ngram 3]

Two OpenVINO engines on the embedded model (int8 weights, the worker's defaults otherwise), one
built with LLMQ_PROMPT_LOOKUP, one without, run the same requests one at a time, the two
interleaved round by round. Input-grounded requests quote, edit or summarise a ~300-token text
given in the prompt (where drafts copied from the prompt get accepted); open questions are the
control (where they rarely do). Reports tokens/s per workload and mode, and the tokens each
pipeline step made: 1 without drafts, 1 + the accepted drafts with them (OpenVINO's Python API
does not expose its own acceptance counters).
"""
from __future__ import annotations

import argparse
import json
import time

from bench.harness.prompts import TASKS, TEXTS
from bench.harness.stats import percentile
from common.models import resolve_model
from common.prompting import PromptBuilder
from common.settings import Settings
from worker.engine.registry import build_engine
from worker.engine.sequence import EngineRequest, Sampling

OPEN = ["Why is the sky blue?", "Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
        "What should I pack for a week of hiking?", "Describe the water cycle."]


def workloads(builder: PromptBuilder) -> dict[str, list[list[int]]]:
    def ids(content: str) -> list[int]:
        return builder.build([{"role": "user", "content": content}], None)[1]

    grounded = {task: [ids(template.format(text=text)) for text in TEXTS] for task, template in TASKS.items()}
    return {**grounded, "open questions": [ids(q) for q in OPEN]}


def run_one(engine, prompt_ids: list[int], max_tokens: int, tag: str) -> tuple[int, int, float]:
    """(tokens, pipeline steps, seconds) of one request alone."""
    steps, tokens, started = engine.stats.steps, 0, time.perf_counter()
    engine.add_request(EngineRequest(tag, prompt_ids, Sampling(max_tokens=max_tokens, temperature=0)))
    while engine.has_unfinished():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
    return tokens, engine.stats.steps - steps, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=4, help="LLMQ_PROMPT_LOOKUP_TOKENS")
    parser.add_argument("--ngram", type=int, default=3, help="LLMQ_PROMPT_LOOKUP_NGRAM")
    args = parser.parse_args()

    base = Settings(engine="openvino", weights="int8", model="embedded", kv_cache_mb=512, max_batch_size=4)
    model = resolve_model(base, prepare=True)
    loads = workloads(PromptBuilder(model.path, base.max_model_len))
    engines = {}
    for lookup in (False, True):
        settings = base.model_copy(update={"prompt_lookup": lookup, "prompt_lookup_tokens": args.tokens,
                                           "prompt_lookup_ngram": args.ngram})
        engines[lookup], info = build_engine(settings, model)
        print(f"lookup {'on ' if lookup else 'off'}: {json.dumps(info)}", flush=True)
    totals = {(name, lookup): [0, 0, 0.0] for name in loads for lookup in engines}
    per_round = {lookup: [] for lookup in engines}
    for round_ in range(args.rounds):
        for lookup in ((False, True) if round_ % 2 == 0 else (True, False)):  # interleaved, order alternating
            tokens = seconds = 0.0
            for name, prompts in loads.items():
                for i, ids in enumerate(prompts):
                    made = run_one(engines[lookup], ids, args.max_tokens, f"r{round_}-{lookup}-{name}-{i}")
                    totals[name, lookup] = [a + b for a, b in zip(totals[name, lookup], made)]
                    tokens, seconds = tokens + made[0], seconds + made[2]
            per_round[lookup].append(tokens / seconds)
            print(f"round {round_ + 1}, lookup {'on ' if lookup else 'off'}: {tokens / seconds:.1f} tokens/s", flush=True)
    print("\n| workload | tokens/s off | tokens/s on | on / off | tokens per step on |")
    print("|---|---:|---:|---:|---:|")
    for name in loads:
        off, on = totals[name, False], totals[name, True]
        print(f"| {name} | {off[0] / off[2]:.1f} | {on[0] / on[2]:.1f} | {on[0] / on[2] / (off[0] / off[2]):.2f}x "
              f"| {on[0] / on[1]:.2f} |")
    print(f"\nall requests, per round: off {', '.join(f'{v:.1f}' for v in per_round[False])}; "
          f"on {', '.join(f'{v:.1f}' for v in per_round[True])} (median {percentile(per_round[False], 50):.1f} "
          f"against {percentile(per_round[True], 50):.1f})")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
