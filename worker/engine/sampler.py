"""Token selection with per-request temperature, top-k, top-p, seed and presence/frequency penalties."""
from __future__ import annotations

import torch

from worker.engine.sequence import Sampling, TokenLogprobs


def make_generator(sampling: Sampling) -> torch.Generator:
    """Seeded requests get a reproducible stream of random numbers of their own."""
    generator = torch.Generator()
    if sampling.seed is not None:
        generator.manual_seed(sampling.seed)
    else:
        generator.seed()
    return generator


def sample(logits: torch.Tensor, params: list[Sampling], generators: list[torch.Generator],
           outputs: list[list[int]] | None = None) -> list[int]:
    """One token per row of `logits` (rows x vocab); greedy rows are done in one argmax.
    `outputs` (each row's generated token ids so far) feeds the presence/frequency penalties."""
    logits = logits.float()
    if outputs is not None:
        apply_penalties(logits, params, outputs)
    tokens = logits.argmax(dim=-1).tolist()
    for row, (sampling, generator) in enumerate(zip(params, generators)):
        if sampling.temperature > 0:
            tokens[row] = _sample_row(logits[row], sampling, generator)
    return tokens


def apply_penalties(logits: torch.Tensor, params: list[Sampling], outputs: list[list[int]]) -> None:
    """OpenAI's penalties, in place: each token already generated loses `presence_penalty` once
    and `frequency_penalty` per occurrence."""
    for row, (sampling, generated) in enumerate(zip(params, outputs)):
        if not generated or (sampling.presence_penalty == 0 and sampling.frequency_penalty == 0):
            continue
        ids, counts = torch.tensor(generated).unique(return_counts=True)
        logits[row, ids] -= sampling.frequency_penalty * counts + sampling.presence_penalty


def _sample_row(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    logits = logits / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(logits, min(sampling.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < sampling.top_p  # always keeps the top token
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def raw_logprobs(logits: torch.Tensor, params: list[Sampling]) -> torch.Tensor | None:
    """The model's own log-distribution per row (before temperature, penalties and masks), when
    any row asked for logprobs (common/logprobs.py says why raw)."""
    if not any(sampling.logprobs for sampling in params):
        return None
    return torch.log_softmax(logits.float(), dim=-1)


def token_logprobs(row: torch.Tensor, token: int, top: int) -> TokenLogprobs:
    """One row's logprob of `token` and its `top` most likely tokens."""
    best = torch.topk(row, top) if top else None
    alternatives = tuple(zip(best.indices.tolist(), best.values.tolist())) if best is not None else ()
    return TokenLogprobs(float(row[token]), alternatives)
