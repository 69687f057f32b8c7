"""How much each OpenVINO weight format changes a model's output, against a float reference.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.studies.weights_quality ~/.cache/llmq/models/SmolLM2-135M-Instruct
    .venv/bin/python -m bench.studies.weights_quality HF_DIR --formats fp16,int8,int4 --ir int8=/tmp/ovir/smol-int8

For a model's Hugging Face folder it takes an OpenVINO IR per weight format (`--ir FMT=DIR`, or
exported once into `--cache` with `.venv-export`'s optimum-cli, the flags the worker uses) and
prints a markdown table:

- greedy agreement: the chat PROMPTS, 64 new tokens each (stopping at EOS), all in one batch of
  OpenVINO GenAI's ContinuousBatchingPipeline, as the worker serves them; the share of prompts
  whose tokens are identical to the reference's, and the mean common prefix in tokens;
- perplexity of the first `--text-tokens` tokens of README.md's prose (code, tables and headings
  left out), one forward of the raw IR; beside it the mean KL divergence from the reference's
  next-token distribution and how often the argmax is the same, which move long before perplexity.

The reference is the fp32 IR computed in f32 (f32 activations and KV cache, no int8 activation
quantization): its weights are the checkpoint's own (float32 or bf16 both fit exactly), and it
runs in the same runtime, tokenizer and kernels as the formats under test, so what differs is
weights and precision only. (The HF model in transformers would add differences of kernels and
tokenizer; an fp16 IR at f32 would already round the weights that the fp16 row is about.)
The formats run with the plugin settings the worker's `dtype=auto` asks for
(`openvino_core.plugin_properties`): bf16 compute and KV cache where the CPU has native BF16,
int8-quantized activations for int8/int4 weights (the table names the compute and KV precisions
the plugin compiled the raw IR at). The `fp32` row (included by default) runs those defaults on unrounded weights: the part
of every row's difference that comes from the runtime, not the weights. `--runtime f32` runs
every format at the reference's settings instead, leaving the weights as the only difference.
`int8-asym` is optimum-cli's own int8, with a zero point per channel (what llmq exported before
its int8 became symmetric), for comparison. `--dq-groups 64,128` adds a row per int8/int4 format
and group size: the activations quantized in groups of that many values instead of the plugin's
default (0: not quantized, left in bf16/f32).

Needs openvino and openvino-genai (the project's .venv); exporting needs `.venv-export`
(`bash -c 'source ops/common.sh; install_openvino_exporter'`).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as ov_genai

from worker.engine.model_config import eos_token_ids
from worker.engine.openvino_core import BLOCK_TOKENS, plugin_properties
from worker.engine.openvino_model import EXPORT_FORMATS, run_exporter

ROOT = Path(__file__).resolve().parents[2]
# optimum-cli's arguments per format: the worker's own (optimum-intel 2.2 has no bf16 weight
# format: the worker's "bf16" is fp16 weights, computed in bf16 on a CPU with native BF16)
EXPORT_ARGS = {"fp32": ["--weight-format", "fp32"], "fp16": EXPORT_FORMATS["bf16"],
               "int8": EXPORT_FORMATS["int8"], "int4": EXPORT_FORMATS["int4"],
               "int8-asym": ["--weight-format", "int8"]}  # int8 with zero points, for comparison
REFERENCE = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
SERVED = plugin_properties("auto", len(os.sched_getaffinity(0)))  # what the worker asks for

PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn leaves.",
    "Give me three tips for writing clean Python code.",
    "What is 17 multiplied by 23? Show your steps.",
    "Translate 'Good morning, how are you?' into Spanish.",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "What are the main differences between a list and a tuple in Python?",
    "Suggest a name for a bakery that specializes in sourdough bread.",
    "How does a refrigerator keep food cold?",
    "Write a short, polite email declining a meeting invitation.",
    "List the planets of the solar system in order from the sun.",
    "What is a job queue, and why would a web service use one?",
    "Give a one-paragraph explanation of photosynthesis for a child.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What should I pack for a weekend hiking trip?",
]


def readme_prose() -> str:
    """README.md's paragraphs of prose: fenced code, tables, headings and emphasis marks left out."""
    paragraphs, current, fenced = [], [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith(("|", "#")) or not line.strip():
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    return re.sub(r"\*\*|`", "", "\n\n".join(paragraphs))


def ensure_ir(hf_dir: Path, fmt: str, cache: Path, exporter: Path) -> Path:
    """The IR of `hf_dir` at `fmt` in the cache, exported on first use."""
    out = cache / f"{hf_dir.name}-{fmt}"
    if (out / "openvino_model.xml").exists():
        return out
    if not exporter.exists():
        sys.exit(f"no IR at {out} and no exporter at {exporter} "
                 "(bash -c 'source ops/common.sh; install_openvino_exporter')")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    command = [str(exporter), "export", "openvino", "-m", str(hf_dir), "--task", "text-generation-with-past",
               *EXPORT_ARGS[fmt], str(tmp)]
    print(f"exporting {fmt}: {' '.join(command)}", file=sys.stderr)
    start = time.perf_counter()
    done = run_exporter(command)  # OpenVINO's telemetry declined first
    if done.returncode != 0 or not (tmp / "openvino_model.xml").exists():
        sys.exit(f"export {fmt} failed:\n" + "\n".join((done.stderr or done.stdout).splitlines()[-10:]))
    tmp.rename(out)
    print(f"exported {fmt} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out


def greedy(source: Path, props: dict, prompts: list[np.ndarray], new_tokens: int,
           stop: set[int]) -> list[list[int]]:
    """Each prompt's greedy tokens, all prompts in one batch of the continuous-batching pipeline
    (`source`: an IR folder or a GGUF file)."""
    scheduler = ov_genai.SchedulerConfig()
    scheduler.num_kv_blocks = sum(-(-(len(p) + new_tokens) // BLOCK_TOKENS) for p in prompts) + len(prompts)
    scheduler.max_num_seqs = len(prompts)
    scheduler.max_num_batched_tokens = 2048
    pipeline = ov_genai.ContinuousBatchingPipeline(str(source), scheduler, "CPU", props)
    config = ov_genai.GenerationConfig()
    config.max_new_tokens, config.do_sample, config.stop_token_ids = new_tokens, False, stop
    results = pipeline.generate([ov.Tensor(p.reshape(1, -1)) for p in prompts], [config] * len(prompts))
    return [list(r.m_generation_ids[0]) for r in results]


def log_probs(ir: Path, props: dict, ids: np.ndarray) -> tuple[np.ndarray, str]:
    """Log-probabilities of the next token at each position of `ids` (one forward of the raw
    stateful IR), and the precisions the plugin compiled it at."""
    compiled = ov.Core().compile_model(ir / "openvino_model.xml", "CPU", props)
    request = compiled.create_infer_request()
    request.reset_state()
    n = len(ids)
    request.infer({"input_ids": ids.reshape(1, n), "attention_mask": np.ones((1, n), np.int64),
                   "position_ids": np.arange(n, dtype=np.int64).reshape(1, n), "beam_idx": np.zeros(1, np.int32)})
    logits = request.get_tensor("logits").data[0].astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    precision = "{}, {} KV".format(*(compiled.get_property(name).get_type_name()
                                     for name in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")))
    return logp.astype(np.float32), precision


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir", type=Path, help="the model's Hugging Face folder")
    ap.add_argument("--formats", default="fp32,fp16,int8,int4", help=f"of {', '.join(EXPORT_ARGS)}")
    ap.add_argument("--ir", action="append", default=[], metavar="FMT=DIR", help="an IR already exported")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/llmq/models/openvino-quality")
    ap.add_argument("--exporter", type=Path, default=ROOT / ".venv-export/bin/optimum-cli")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--text-tokens", type=int, default=512)
    ap.add_argument("--gguf", type=Path, help="also a GGUF file read by OpenVINO directly (greedy agreement only)")
    ap.add_argument("--runtime", choices=("served", "f32"), default="served",
                    help="the formats under test at the plugin's defaults (as served) or at the reference's f32")
    ap.add_argument("--dq-groups", default="", help="also int8/int4 with activations quantized in groups of these sizes")
    args = ap.parse_args()
    hf_dir = args.hf_dir.expanduser().resolve()
    given = {fmt: Path(path) for fmt, path in (item.split("=", 1) for item in args.ir)}
    formats = args.formats.split(",")
    irs = {fmt: given.get(fmt) or ensure_ir(hf_dir, fmt, args.cache, args.exporter)
           for fmt in dict.fromkeys(["fp32", *formats])}

    tokenizer = ov_genai.Tokenizer(str(irs["fp32"]))  # one tokenization for every model
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}], True),
                                add_special_tokens=False).input_ids.data[0].copy() for p in PROMPTS]
    text = tokenizer.encode(readme_prose(), add_special_tokens=False).input_ids.data[0][:args.text_tokens].copy()
    targets = text[1:]

    runtime = SERVED if args.runtime == "served" else REFERENCE
    start = time.perf_counter()
    stop = eos_token_ids(hf_dir)
    ref_tokens = greedy(irs["fp32"], REFERENCE, prompts, args.new_tokens, stop)
    ref_logp, ref_precision = log_probs(irs["fp32"], REFERENCE, text)
    ref_logp = ref_logp[:-1]
    ref_ppl = float(np.exp(-ref_logp[np.arange(len(targets)), targets].mean()))
    print(f"reference: fp32 IR at {ref_precision} ({time.perf_counter() - start:.0f} s); {len(PROMPTS)} prompts, "
          f"mean {np.mean([len(t) for t in ref_tokens]):.1f} tokens each; perplexity text {len(text)} tokens",
          file=sys.stderr)

    rows = [f"| reference: fp32, {ref_precision} | "
            f"{(irs['fp32'] / 'openvino_model.bin').stat().st_size / 2**20:.0f} | 100% | "
            f"{np.mean([len(t) for t in ref_tokens]):.1f} (all) | {ref_ppl:.3f} | 0 | 0 | 100% |"]
    groups = [int(g) for g in args.dq_groups.split(",") if g]
    runs = [(fmt, None) for fmt in formats] + [(fmt, g) for fmt in formats if fmt in ("int8", "int4") for g in groups]
    for fmt, group in runs:
        start = time.perf_counter()
        props = runtime if group is None else {**runtime, "DYNAMIC_QUANTIZATION_GROUP_SIZE": group}
        tokens = greedy(irs[fmt], props, prompts, args.new_tokens, stop)
        logp, precision = log_probs(irs[fmt], props, text)
        if group is not None:
            precision += f", activations in groups of {group}" if group else ", activations not quantized"
        logp = logp[:-1]
        ppl = float(np.exp(-logp[np.arange(len(targets)), targets].mean()))
        kl = float((np.exp(ref_logp) * (ref_logp - logp)).sum(axis=-1).mean())
        top1 = float((logp.argmax(-1) == ref_logp.argmax(-1)).mean())
        same = np.mean([t == r for t, r in zip(tokens, ref_tokens)])
        prefix = np.mean([common_prefix(t, r) for t, r in zip(tokens, ref_tokens)])
        size = (irs[fmt] / "openvino_model.bin").stat().st_size / 2**20
        rows.append(f"| {fmt}, {precision} | {size:.0f} | {same:.0%} | {prefix:.1f} | {ppl:.3f} | "
                    f"{ppl / ref_ppl - 1:+.1%} | {kl:.4f} | {top1:.1%} |")
        print(f"{fmt}{'' if group is None else f', group {group}'}: {time.perf_counter() - start:.0f} s",
              file=sys.stderr)

    if args.gguf:  # no raw model to take log-probabilities from: agreement only
        tokens = greedy(args.gguf, runtime, prompts, args.new_tokens, stop)
        same = np.mean([t == r for t, r in zip(tokens, ref_tokens)])
        prefix = np.mean([common_prefix(t, r) for t, r in zip(tokens, ref_tokens)])
        size = args.gguf.stat().st_size / 2**20
        rows.append(f"| {args.gguf.name} read by OpenVINO | {size:.0f} | {same:.0%} | {prefix:.1f} | | | | |")
    print(f"\n{hf_dir.name}: {len(PROMPTS)} chat prompts x {args.new_tokens} greedy tokens; "
          f"perplexity on {len(text)} tokens of README prose\n")
    print("| weights, compute, KV | model MB | same tokens | common prefix | perplexity | vs ref | KL vs ref | top-1 = ref |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
