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

from bench.harness.stats import percentile
from common.models import resolve_model
from common.prompting import PromptBuilder
from common.settings import Settings
from worker.engine.registry import build_engine
from worker.engine.sequence import EngineRequest, Sampling

TEXTS = [
    "The river town of Elmsford sits where two valleys meet. Every spring the snowmelt swells the water, and "
    "the old stone bridge, built in 1782 by a mason named Thomas Hale, disappears for a week under the flood. "
    "Children wait on the hill for the first arch to show again, and the baker gives a free loaf to whoever "
    "sees it first. The town council has argued for forty years about a new bridge upstream; the plans are "
    "drawn, the money is not. Meanwhile the ferryman, Ada Brook, takes people across in a flat boat for two "
    "coins each, and keeps a ledger of every crossing since 1990. Her ledger shows that the flood now comes "
    "nine days earlier than it did when she started, and that it lasts longer. The school teaches the "
    "children to read the ledger as a lesson in patience and in measurement.",
    "Our support policy for returns is simple. Customers may return unused items within thirty days of "
    "delivery. Refunds are issued to the original payment method within five business days after the "
    "warehouse confirms the return. Fragile goods need photos of the damage and of the packaging before a "
    "replacement is sent. Items bought in a sale can be exchanged but not refunded. Gift cards cannot be "
    "returned. If a parcel is lost, the customer must wait ten business days from the shipping date before "
    "we open an investigation with the carrier. During that time the order page shows the tracking number "
    "and the carrier's last scan. Orders shipped abroad may be held by customs; any duties are paid by the "
    "customer, and refused parcels are returned to us at the customer's cost.",
    "def merge_intervals(intervals):\n    \"\"\"Merge overlapping intervals and return them sorted.\"\"\"\n"
    "    if not intervals:\n        return []\n    intervals = sorted(intervals, key=lambda pair: pair[0])\n"
    "    merged = [list(intervals[0])]\n    for start, end in intervals[1:]:\n        last = merged[-1]\n"
    "        if start <= last[1]:\n            last[1] = max(last[1], end)\n        else:\n"
    "            merged.append([start, end])\n    return [tuple(pair) for pair in merged]\n\n\n"
    "def total_covered(intervals):\n    \"\"\"The length of the union of the intervals.\"\"\"\n"
    "    return sum(end - start for start, end in merge_intervals(intervals))\n\n\n"
    "def gaps(intervals, lower, upper):\n    \"\"\"The stretches between lower and upper no interval covers.\"\"\"\n"
    "    result, cursor = [], lower\n    for start, end in merge_intervals(intervals):\n"
    "        if start > cursor:\n            result.append((cursor, min(start, upper)))\n"
    "        cursor = max(cursor, end)\n    if cursor < upper:\n        result.append((cursor, upper))\n"
    "    return result\n",
]
TASKS = {
    "quote": "Repeat this text exactly, word for word:\n\n{text}",
    "edit": "Rewrite this text with every number written out in words; change nothing else:\n\n{text}",
    "summarise": "Summarise this text in a few sentences, keeping its key names and facts:\n\n{text}",
}
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
