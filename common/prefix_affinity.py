"""Prefix affinity: a job goes, when it can, to the worker that last served its prompt's start.

Every engine keeps a prefix cache (the K/V of prompt starts it computed recently), but a job lands
on whichever worker picks it, so with several workers a tenant's long system prompt is computed
again on each. Here, as in llm-d's approximate prefix routing, nothing is asked of the engines: the
API cuts each prompt's token ids into blocks of `BLOCK_TOKENS` and hashes the chain of them (block
i's hash covers blocks 1..i), and Redis remembers, per block chain, the worker that last started a
job beginning with it. Job order never changes (priorities and fair shares decide which job is
next, exactly as without affinity); affinity only decides *which worker* starts the next job:

- the pick script (common/lua/fair_pick.lua) finds the holder of the job's longest known chain;
- a worker that is not the holder leaves the job at the head of the queue while the holder is live
  (its heartbeat is fresh), for at most `prefix_affinity_wait_s` from the first time the job was
  left; on the first time it sends the holder a ticket on the holder's own Celery queue, so a
  holder without a ticket in hand picks it as soon as it has a free slot;
- past that bound, or when the holder is gone, the first worker to look takes the job and
  becomes the holder.

A job with no known holder, or a prompt shorter than one block, is picked as without affinity.
"""
from __future__ import annotations

import hashlib
from typing import NamedTuple

BLOCK_TOKENS = 64  # tokens per hashed block: a shared start shorter than this is not routed on
MAX_BLOCKS = 32  # chains hashed per prompt: a shared start is recognised up to 2,048 tokens
HOLDER_TTL_S = 900  # how long a chain remembers its holder (an engine's prefix cache turns over)


class Deferred(NamedTuple):
    """A pick that left the head job for another worker, `holder`; `first`: the first time the
    job was left, when the holder is sent a ticket."""
    holder: str
    first: bool


def prefix_blocks(prompt_ids: list[int]) -> str:
    """The job record's `prefix_blocks`: the hashes of the prompt's block chains, shortest first,
    space-separated ('' for a prompt shorter than one block). Only whole blocks: the last partial
    block is where prompts that share a start usually differ."""
    hashes, chain = [], hashlib.blake2b(digest_size=8)
    for start in range(0, min(len(prompt_ids) // BLOCK_TOKENS, MAX_BLOCKS) * BLOCK_TOKENS, BLOCK_TOKENS):
        chain.update(b"".join(t.to_bytes(4, "little") for t in prompt_ids[start:start + BLOCK_TOKENS]))
        hashes.append(chain.copy().hexdigest())
    return " ".join(hashes)
