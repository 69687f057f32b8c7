"""What the engine tests feed every real engine: the contract's prompts, greedy decoding alone."""
from __future__ import annotations

from worker.engine.sequence import EngineRequest, Sampling

PROMPTS = ["What is the capital of France?", "Name three rivers in Europe.", "Write a haiku about rain.",
           "What is 17 times 3?", "Why is the sky blue?"]


def token_ids(engine, prompts, max_tokens, tag):
    """Greedy token ids per prompt, each request alone."""
    out = []
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}{i}", ids, Sampling(max_tokens=max_tokens, temperature=0)))
        got = []
        while engine.has_unfinished():
            for o in engine.step():
                got += o.new_token_ids
        out.append(got)
    return out
