"""Measure which engine and weights serve a model fastest on this host, and record the winner.

    python -m worker.tune [--model NAME] [--clients N] [--seconds S] [--candidates openvino:int8,vllm]

Each candidate is built as a worker builds it (exported once if it must be) and driven in process
by N closed-loop clients (N: `LLMQ_MAX_BATCH_SIZE`, the batch a worker runs) with greedy requests
for `--seconds` after a warm-up; generated tokens per second decide. The record
(worker/tuning.py) is what `LLMQ_ENGINE=auto` / `LLMQ_WEIGHTS=auto` workers then serve with.
Default candidates: OpenVINO int8; OpenVINO bf16 where the CPU computes bf16 natively; vLLM's
CPU build where it is installed. int4 and raw GGUF weights are left out for their quality
(docs/engines.md); name them in --candidates to measure them anyway, knowing that.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import logging
import threading
import time
import uuid

from common.catalog import Catalog
from common.logs import setup_logging
from common.prompting import PromptBuilder
from common.settings import Settings, get_settings
from worker.engine.loop import EngineLoop
from worker.engine.registry import build_engine
from worker.engine.sequence import EngineRequest, Sampling
from worker.tuning import Candidate, host_signature, write_record

log = logging.getLogger("llmq.tune")
PROMPTS = ("Explain how a lighthouse works.", "Write a short story about a cat who learns to sail.",
           "List the planets of the solar system and one fact about each.", "Describe a good breakfast.")


def default_candidates() -> list[Candidate]:
    out = []
    if importlib.util.find_spec("openvino_genai"):
        out.append(Candidate("openvino", "int8"))
        if "+amx" in host_signature() or _native_bf16():
            out.append(Candidate("openvino", "bf16"))
    if importlib.util.find_spec("vllm"):
        out.append(Candidate("vllm", "-"))
    return out or [Candidate("hf", "-")]


def _native_bf16() -> bool:
    import torch

    from worker.engine.runner_hf import resolve_dtype

    return resolve_dtype("auto") == torch.bfloat16


def measure(settings: Settings, model_name: str | None, candidate: Candidate, clients: int, seconds: float,
            max_tokens: int) -> float:
    """Generated tokens/s of `clients` closed-loop clients on the candidate, after a warm-up."""
    entry = Catalog.from_settings(settings).get(model_name)
    update = {"engine": candidate.engine, **({"weights": candidate.weights} if candidate.weights != "-" else {})}
    settings = entry.settings(settings).model_copy(update=update)
    model = entry.resolve(settings, prepare=True)
    builder = PromptBuilder(model.path, settings.max_model_len)
    prompts = [builder.build([{"role": "user", "content": p}], None)[1] for p in PROMPTS]
    engine, _ = build_engine(settings, model)
    loop = EngineLoop(engine)
    counted, lock, started = [0], threading.Lock(), time.monotonic()
    warm_until, end = started + min(seconds / 2, 5.0), started + min(seconds / 2, 5.0) + seconds

    def client(index: int) -> None:
        for prompt in itertools.cycle(prompts[index % len(prompts):] + prompts[:index % len(prompts)]):
            if time.monotonic() >= end:
                return
            stream = loop.submit(EngineRequest(uuid.uuid4().hex, prompt, Sampling(max_tokens=max_tokens,
                                                                                    temperature=0.0)))
            while (output := stream.get(timeout=120)) is not None:
                if warm_until <= time.monotonic() <= end:
                    with lock:
                        counted[0] += len(output.new_token_ids)
                if output.finished:
                    break

    try:
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        loop.stop()
        engine.close()
    return counted[0] / seconds


def main(argv: list[str] | None = None) -> Candidate:
    parser = argparse.ArgumentParser(prog="python -m worker.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a catalog model (default: the catalog's default)")
    parser.add_argument("--clients", type=int, help="concurrent requests (default: LLMQ_MAX_BATCH_SIZE)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time per candidate")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--candidates", help="e.g. openvino:int8,openvino:bf16,vllm (default: see above)")
    args = parser.parse_args(argv)
    settings = get_settings()
    setup_logging(settings, "tune")
    clients = args.clients or settings.max_batch_size
    settings = settings.model_copy(update={"max_batch_size": clients})
    candidates = ([Candidate.parse(c) for c in args.candidates.split(",")] if args.candidates
                  else default_candidates())
    entry = Catalog.from_settings(settings).get(args.model)
    if entry is None:
        parser.error(f"no model {args.model!r} in the catalog")
    model_name = entry.resolve(entry.settings(settings), prepare=True).name
    results: dict[str, float] = {}
    for candidate in candidates:
        log.info("measuring %s at %d clients for %.0f s", candidate.label, clients, args.seconds)
        results[candidate.label] = measure(settings, args.model, candidate, clients, args.seconds, args.max_tokens)
        log.info("%s: %.1f tokens/s", candidate.label, results[candidate.label])
    winner = max(candidates, key=lambda c: results[c.label])
    path = write_record(settings, model_name, clients, results, winner)
    print(f"{model_name} on {host_signature()} at {clients} clients: " +
          ", ".join(f"{k} {v:.1f} tokens/s" for k, v in results.items()) + f"; serving with {winner.label} ({path})")
    return winner


if __name__ == "__main__":
    main()
