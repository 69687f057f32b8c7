"""Measure which engine and weights serve a model fastest on this host, and record the winner.

    python -m worker.tune [--model NAME] [--clients N] [--seconds S] [--candidates openvino:int8,vllm]
                          [--prompt-tokens N]

Each candidate is built as a worker builds it (exported once if it must be) and driven in process
by N closed-loop clients (N: `LLMQ_MAX_BATCH_SIZE`, the batch a worker runs) with greedy requests
for `--seconds` after a warm-up; generated tokens per second decide, a lead of under 5% going to
the candidate listed first (`tuning.choose`). The requests are short questions, or, with
`--prompt-tokens`, each brings a context of its own of about that many tokens (a document,
retrieved passages, an agent's history): engines differ more in how fast they read a long prompt
than in how fast they write, so a deployment whose prompts are long should say so. The record
(worker/tuning.py) is what `LLMQ_ENGINE=auto` / `LLMQ_WEIGHTS=auto` workers then serve with.
Default candidates, in order of preference: OpenVINO int8; OpenVINO bf16 where the CPU computes
bf16 natively; vLLM's CPU build where it is installed. int4 and raw GGUF weights are left out for
their quality (docs/engines.md); name them in --candidates to measure them anyway, knowing that.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import logging
import random
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
from worker.tuning import Candidate, choose, host_signature, write_record

log = logging.getLogger("llmq.tune")
PROMPTS = ("Explain how a lighthouse works.", "Write a short story about a cat who learns to sail.",
           "List the planets of the solar system and one fact about each.", "Describe a good breakfast.")
CONTEXT_WORDS = ("harbour river engine ledger signal winter copper garden market lantern bridge orchard "
                 "meadow compass archive cellar beacon thread quarry valley").split()


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


class Prompts:
    """The requests' prompt token ids, in turn: the short questions, or each question after a
    context of its own of about `context_tokens` tokens (words in an order of its own from the
    first, so no prefix cache can answer for it, as with real documents)."""

    def __init__(self, builder: PromptBuilder, context_tokens: int = 0):
        self.builder, self.context_tokens = builder, context_tokens
        self._count = itertools.count()
        self._words = context_tokens  # words per context: one a token at first, then scaled by what that made
        if context_tokens:
            self._words = max(1, round(self._words * context_tokens / len(self._context_ids(0))))

    def next(self) -> list[int]:
        index = next(self._count)
        if not self.context_tokens:
            return self._ids(PROMPTS[index % len(PROMPTS)])
        return self._context_ids(index)

    def _context_ids(self, index: int) -> list[int]:
        rng = random.Random(index)
        context = f"Reference {index}. " + " ".join(rng.choice(CONTEXT_WORDS) for _ in range(self._words))
        return self._ids(PROMPTS[index % len(PROMPTS)], context)

    def _ids(self, question: str, context: str | None = None) -> list[int]:
        messages = [{"role": "system", "content": context}] if context else []
        return self.builder.build([*messages, {"role": "user", "content": question}], None)[1]


def measure(settings: Settings, model_name: str | None, candidate: Candidate, clients: int, seconds: float,
            max_tokens: int, prompt_tokens: int = 0) -> float:
    """Generated tokens/s of `clients` closed-loop clients on the candidate, after a warm-up."""
    entry = Catalog.from_settings(settings).get(model_name)
    update = {"engine": candidate.engine, **({"weights": candidate.weights} if candidate.weights != "-" else {})}
    settings = entry.settings(settings).model_copy(update=update)
    model = entry.resolve(settings, prepare=True)
    prompts = Prompts(PromptBuilder(model.path, settings.max_model_len), prompt_tokens)
    engine, _ = build_engine(settings, model)
    loop = EngineLoop(engine)
    counted, lock, started = [0], threading.Lock(), time.monotonic()
    warm_until, end = started + min(seconds / 2, 5.0), started + min(seconds / 2, 5.0) + seconds

    def client() -> None:
        while time.monotonic() < end:
            stream = loop.submit(EngineRequest(uuid.uuid4().hex, prompts.next(),
                                               Sampling(max_tokens=max_tokens, temperature=0.0)))
            while (output := stream.get(timeout=120)) is not None:
                if warm_until <= time.monotonic() <= end:
                    with lock:
                        counted[0] += len(output.new_token_ids)
                if output.finished:
                    break

    try:
        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
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
    parser.add_argument("--candidates",
                        help="e.g. openvino:int8,openvino:bf16,vllm, most preferred first (default: see above)")
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="each request's own context, in tokens, where the deployment's prompts are long "
                             "(default: short questions)")
    args = parser.parse_args(argv)
    settings = get_settings()
    setup_logging(settings, "tune")
    if args.prompt_tokens + args.max_tokens + 64 > settings.max_model_len:
        parser.error(f"--prompt-tokens {args.prompt_tokens} and --max-tokens {args.max_tokens} do not fit "
                     f"LLMQ_MAX_MODEL_LEN ({settings.max_model_len})")
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
        results[candidate.label] = measure(settings, args.model, candidate, clients, args.seconds, args.max_tokens,
                                           args.prompt_tokens)
        log.info("%s: %.1f tokens/s", candidate.label, results[candidate.label])
    winner = choose(candidates, results)
    path = write_record(settings, model_name, clients, results, winner, args.prompt_tokens)
    print(f"{model_name} on {host_signature()} at {clients} clients: " +
          ", ".join(f"{k} {v:.1f} tokens/s" for k, v in results.items()) + f"; serving with {winner.label} ({path})")
    return winner


if __name__ == "__main__":
    main()
