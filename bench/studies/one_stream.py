"""One stream's decode, OpenVINO against llama.cpp: where a single request's time per token goes.

    python -m bench.studies.one_stream --model M [--gguf FILE --llama-server PATH]
        [--variant g128:LLMQ_OPENVINO_ACTIVATION_GROUP=128] [--rounds 6] [--profile]

At one client a decode step reads every weight once, so the engines' matmul kernels decide the
speed, not the server around them. Each OpenVINO pipeline is built as llmq's worker builds it
(`bench.harness.llmq_pipeline`; a variant changes llmq's settings, as `bench.bench --variant`
does), llama-server runs with one slot, its best case for one stream, on the same cores, and
requests alternate between them (each round's order the reverse of the last), the same prompt
token ids to each, greedy, every request made to run `--max-tokens` long. Time per token counts
from the first token on: measured in process for OpenVINO, llama-server's own
`predicted_per_token_ms` for llama.cpp, so neither carries HTTP or a queue.

`--profile` adds the CPU plugin's own time per operation type for a decode step of the same IR
without the pipeline (the stateful model compiled with PERF_COUNT, one token a step after a
40-token prompt): whether the weights' matmuls take the step, or everything around them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from unittest import mock

from bench.harness.llmq_pipeline import llmq_pipeline
from bench.harness.prompts import story
from bench.harness.results import args_dict, parse_variant, save
from bench.harness.servers import LlamaServer
from common.prompting import PromptBuilder
from common.settings import Settings
from worker.engine.openvino_core import plugin_properties, read_new_tokens

LLAMA = "llama.cpp"


def variant_settings(changes: dict[str, str]) -> Settings:
    """llmq's settings with a variant's LLMQ_* changes over the environment's."""
    with mock.patch.dict(os.environ, changes):
        return Settings()


def openvino_ms_per_token(pipeline, prompt_ids: list[int], max_tokens: int) -> float:
    """One request alone on the pipeline: milliseconds per token after its first."""
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    config = genai.GenerationConfig()
    config.max_new_tokens, config.ignore_eos, config.do_sample = max_tokens, True, False
    handle = pipeline.add_request(0, ov.Tensor(np.asarray([prompt_ids], dtype=np.int64)), config)
    first, made = None, 0
    while pipeline.has_non_finished_requests():
        pipeline.step()
        if handle.can_read():
            made += len(read_new_tokens(handle)[0])
            first = first or time.perf_counter()
    return (time.perf_counter() - first) * 1000 / max(1, made - 1)


def llama_ms_per_token(url: str, prompt_ids: list[int], max_tokens: int) -> float:
    body = {"prompt": prompt_ids, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
    request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.load(answer)["timings"]["predicted_per_token_ms"]


def profile(ir_dir: Path, settings: Settings, steps: int = 60) -> dict[str, float]:
    """Milliseconds per decode step by the plugin's operation type (and kernel), largest first."""
    import numpy as np
    import openvino as ov

    props = {**plugin_properties(settings.dtype, len(os.sched_getaffinity(0)), settings.openvino_activation_group),
             "PERF_COUNT": True}
    request = ov.Core().compile_model(ir_dir / "openvino_model.xml", "CPU", props).create_infer_request()

    def inputs(ids: list[int], past: int) -> dict:
        n = len(ids)
        return {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, past + n), np.int64),
                "position_ids": np.arange(past, past + n, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32)}

    prompt = list(range(100, 140))
    request.infer(inputs(prompt, 0))
    times: Counter = Counter()
    for step in range(steps):
        request.infer(inputs([5], len(prompt) + step))
        if step >= steps // 4:  # the first steps warm caches and kernels up
            for op in request.get_profiling_info():
                times[f"{op.node_type} ({op.exec_type})"] += op.real_time.total_seconds() * 1000
    counted = steps - steps // 4
    return {name: round(ms / counted, 3) for name, ms in times.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="llmq model (default: LLMQ_MODEL's)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:LLMQ_X=V,...",
                        help="one more pipeline with these llmq settings changed; repeatable")
    parser.add_argument("--llama-server", help="llama-server binary (bash bench/build_llama_server.sh)")
    parser.add_argument("--gguf", help="the GGUF file llama-server serves")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--profile", action="store_true", help="also the plugin's time per operation type")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    base = {"LLMQ_MODEL": args.model} if args.model else {}
    variants = {"openvino": base}
    for name, changes in map(parse_variant, args.variant):
        variants[name] = {**base, **changes}
    pipelines, settings, sources = {}, {}, {}
    for name, changes in variants.items():
        settings[name] = variant_settings(changes)
        model, pipelines[name], info = llmq_pipeline(settings[name])
        sources[name] = Path(info["source"])  # the IR folder (or GGUF file) the worker would serve
        print(f"{name}: {info}", flush=True)
    builder = PromptBuilder(model.path, settings["openvino"].max_model_len)
    prompts = [builder.build([{"role": "user", "content": story(n)}], None)[1] for n in range(args.rounds + 1)]

    llama = None
    if args.llama_server:
        llama = LlamaServer(args.llama_server, args.gguf, Path(tempfile.mkdtemp(prefix="one-stream-")),
                            threads=len(os.sched_getaffinity(0)), slots=1)
        llama.wait_ready()
    names = [*pipelines, *([LLAMA] if llama else [])]

    def run(name: str, prompt_ids: list[int]) -> float:
        if name == LLAMA:
            return llama_ms_per_token(llama.url, prompt_ids, args.max_tokens)
        return openvino_ms_per_token(pipelines[name], prompt_ids, args.max_tokens)

    try:
        for name in names:  # warm-up, not counted
            run(name, prompts[-1])
        per_round = {name: [] for name in names}
        for round_ in range(args.rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                per_round[name].append(round(run(name, prompts[round_]), 2))
    finally:
        if llama:
            llama.stop()

    medians = {name: statistics.median(values) for name, values in per_round.items()}
    print(f"\nms per token after the first, one request, {args.max_tokens} tokens, median of {args.rounds} rounds:")
    for name in names:
        against = f"  {medians[LLAMA] / medians[name]:.2f}x llama.cpp's tokens/s" if llama and name != LLAMA else ""
        print(f"  {name:14s} {medians[name]:6.2f}{against}   rounds {per_round[name]}")
    profiles = {}
    if args.profile:
        for name in pipelines:
            if sources[name].suffix == ".gguf":
                continue
            profiles[name] = profile(sources[name], settings[name])
            print(f"\n{name}: plugin time per decode step, {sum(profiles[name].values()):.2f} ms in all")
            for op, ms in list(profiles[name].items())[:8]:
                print(f"  {ms:7.3f} ms  {op}")
    path = save(args.out, "one-stream", {"args": args_dict(args), "ms_per_token": per_round, "median": medians,
                                         "profile": profiles})
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
