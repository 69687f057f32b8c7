"""Prefix affinity: a job goes, when it can, to the worker that last served its prompt's start.

Every engine keeps a prefix cache (the K/V of prompt starts it computed recently), but a job lands
on whichever worker picks it, so with several workers a tenant's long system prompt is computed
again on each. Here, as in llm-d's approximate prefix routing, nothing is asked of the engines: the
API cuts each prompt's token ids into blocks of `BLOCK_TOKENS` and hashes the chain of them (block
i's hash covers blocks 1..i), and Redis remembers, per block chain, the worker that last started a
job beginning with it. Job order never changes (priorities and fair shares decide which job is
next, exactly as without affinity); affinity only decides *which worker* starts the next job:

- the pick script (common/lua/fair_pick.lua) finds the holder of the job's longest known chain;
- a worker that is not the holder leaves the job at the head of the queue while the holder says it
  has a free slot (`FreeSlots`, a number each worker keeps in Redis), for at most
  `prefix_affinity_wait_s` from the first time the job was left; on the first time it sends the
  holder a ticket on the holder's own Celery queue, so a holder without a ticket in hand picks it;
- past that bound, or when the holder is full or gone, the first worker to look takes the job.

A job with no known holder, or a prompt shorter than one block, is picked as without affinity.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from typing import NamedTuple

import redis

log = logging.getLogger(__name__)

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


class FreeSlots:
    """How many more jobs this worker can start now, kept in Redis for the other workers' picks.

    A hint, not a reservation: a write that fails is logged and skipped (the next change or
    heartbeat writes it again), and a worker that died leaves a value that lapses with `ttl_s`."""

    def __init__(self, client: redis.Redis, key: str, slots: int, ttl_s: int):
        self.r, self.key, self.slots, self.ttl_s = client, key, slots, ttl_s
        self._held = 0
        self._lock = threading.Lock()

    def taken(self) -> None:
        self._change(+1)

    def released(self) -> None:
        self._change(-1)

    def publish(self) -> None:
        """Write the number again (each heartbeat, so an idle worker's does not lapse)."""
        self._change(0)

    def forget(self) -> None:
        """On a clean shutdown: other workers stop waiting for this one at once."""
        try:
            self.r.delete(self.key)
        except redis.RedisError as exc:
            log.warning("could not clear the free-slot count: %s", exc)

    def _change(self, by: int) -> None:
        with self._lock:
            self._held += by
            free = max(0, self.slots - self._held)
            try:
                self.r.set(self.key, free, ex=self.ttl_s)
            except redis.RedisError as exc:
                log.warning("could not publish the free-slot count: %s", exc)
