"""CPU kernel choices for the engine's decode step, measured in one run: dtype (float32 vs
bfloat16) x attention implementation (sdpa vs eager), and torch.compile if it works, at batch
sizes 1/8/16 through the real runner (slot KV cache, 4-D masks).

    python -m bench.studies.kernels [--model embedded] [--steps 20] [--context 200]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from bench.harness.results import levels
from common.models import resolve_model
from common.settings import Settings
from worker.engine.runner_hf import HFModelRunner


def decode_ms(runner: HFModelRunner, batch: int, context: int, steps: int) -> float:
    ids = [f"r{i}" for i in range(batch)]
    runner.prefill(ids, [[100 + (i + j) % 500 for j in range(context)] for i in range(batch)])
    last = {rid: 7 for rid in ids}
    runner.decode(last)  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        runner.decode(last)
    runner.release(ids)
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--batches", type=levels, default=[1, 8, 16])
    parser.add_argument("--compile", action="store_true", help="also try torch.compile (slow to build)")
    args = parser.parse_args()
    path = resolve_model(Settings(model=args.model, allow_download=False)).path
    batches = args.batches
    rows = []
    variants = [(d, a) for d in ("float32", "bfloat16") for a in ("sdpa", "eager")]
    for dtype, attn in variants:
        runner = HFModelRunner(path, dtype, max_batch_size=max(batches))
        runner.model.set_attn_implementation(attn)
        row = {"dtype": dtype, "attn": attn}
        row.update({f"B{b}_ms": round(decode_ms(runner, b, args.context, args.steps), 1) for b in batches})
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.compile:
        runner = HFModelRunner(path, "bfloat16", max_batch_size=max(batches))
        try:
            runner.model.forward = torch.compile(runner.model.forward, dynamic=True)
            row = {"dtype": "bfloat16", "attn": "sdpa+compile"}
            row.update({f"B{b}_ms": round(decode_ms(runner, b, args.context, args.steps), 1) for b in batches})
        except Exception as exc:  # report, do not hide: compile is optional
            row = {"dtype": "bfloat16", "attn": "sdpa+compile", "error": f"{type(exc).__name__}: {exc}"[:200]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]
    print(f"\n{'dtype':9} {'attn':13} " + " ".join(f"{'B' + str(b) + ' ms/step':>12}" for b in batches)
          + "   speed-up vs float32/sdpa")
    for row in rows:
        if "error" in row:
            print(f"{row['dtype']:9} {row['attn']:13} {row['error']}")
            continue
        cells = " ".join(f"{row[f'B{b}_ms']:12.1f}" for b in batches)
        gains = " ".join(f"{base[f'B{b}_ms'] / row[f'B{b}_ms']:.2f}x" for b in batches)
        print(f"{row['dtype']:9} {row['attn']:13} {cells}   {gains}")


if __name__ == "__main__":
    main()
