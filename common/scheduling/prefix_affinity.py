"""Prefix affinity: a job goes, when it can, to the worker that last served its prompt's start.

Every engine keeps a prefix cache (the K/V of prompt starts it computed recently), but a job lands
on whichever worker picks it, so with several workers a tenant's long system prompt is computed
again on each. Here, as in llm-d's approximate prefix routing, nothing is asked of the engines: the
API cuts each prompt's token ids into blocks of `BLOCK_TOKENS` and hashes the chain of them (block
i's hash covers blocks 1..i), and Redis remembers, per block chain, the workers that recently
started a job beginning with it (its *holders*, at most `MAX_HOLDERS`). Job order never changes
(priorities and fair shares decide which job is next, exactly as without affinity); affinity only
decides *which worker* starts the next job:

- a holder of the job's longest known chain takes it at once;
- another worker leaves it at the head of the queue while some holder has a free slot (the count
  each worker keeps in Redis, common/scheduling/free_slots.py), for at most `prefix_affinity_wait_s` from the
  first time the job was left; the first time, it sends that holder a ticket on the holder's own
  Celery queue, since a holder with a free slot may have no ticket in hand;
- when every holder is full or gone, or the wait is over, the worker that looks takes the job and
  becomes a holder too. So a prefix that one worker cannot keep up with spreads to more workers,
  and one that it can stays on one: a single system prompt shared by every request does not pile
  onto one worker while others idle.

A job with no known holder, or a prompt shorter than one block, is picked as without affinity.
"""
from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

BLOCK_TOKENS = 64  # tokens per hashed block: a shared start shorter than this is not routed on
MAX_BLOCKS = 32  # chains hashed per prompt: a shared start is recognised up to 2,048 tokens
HOLDER_TTL_S = 900  # how long a chain remembers a holder (an engine's prefix cache turns over)
MAX_HOLDERS = 8  # holders kept per chain, the most recent


class Deferred(NamedTuple):
    """A pick that left the head job for another worker, `holder`; `first`: the first time the
    job was left, when the holder is sent a ticket."""
    holder: str
    first: bool


def prefix_blocks(prompt_ids: list[int]) -> str:
    """The job record's `prefix_blocks`: the hashes of the prompt's block chains, shortest first,
    space-separated ('' for a prompt shorter than one block). Only whole blocks: the last partial
    block is where prompts that share a start usually differ."""
    tokens = min(len(prompt_ids) // BLOCK_TOKENS, MAX_BLOCKS) * BLOCK_TOKENS
    data = struct.pack(f"<{tokens}I", *prompt_ids[:tokens])  # one call: this runs on every admission
    hashes, chain, step = [], hashlib.blake2b(digest_size=8), BLOCK_TOKENS * 4
    for start in range(0, len(data), step):
        chain.update(data[start:start + step])
        hashes.append(chain.copy().hexdigest())
    return " ".join(hashes)
