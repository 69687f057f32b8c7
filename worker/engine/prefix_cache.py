"""Prefix cache: reuse the KV of prompt blocks another request already computed.

Prompts are cut into blocks of `block_size` tokens. A block's key hashes every token from the
start of the prompt to the end of that block, so a block is only reused after the very same prefix
(K/V depend on everything before them). Shared system prompts and chat histories that grow turn by
turn hit; an LRU bound on the number of cached tokens keeps memory fixed.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), kv_heads x n x head_dim


@dataclass
class PrefixStats:
    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class PrefixCache:
    def __init__(self, block_size: int, max_tokens: int):
        self.block_size = block_size
        self.max_blocks = max(0, max_tokens // block_size)
        self._blocks: OrderedDict[int, LayerKV] = OrderedDict()
        self.stats = PrefixStats()

    def _block_keys(self, tokens: list[int]) -> list[int]:
        keys, key = [], 0
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            key = hash((key, tuple(tokens[start:start + self.block_size])))
            keys.append(key)
        return keys

    def lookup(self, tokens: list[int]) -> list[LayerKV]:
        """K/V blocks for the longest cached prefix, leaving at least one token to compute."""
        usable = self._block_keys(tokens[:-1])
        found = []
        for key in usable:
            block = self._blocks.get(key)
            if block is None:
                break
            self._blocks.move_to_end(key)
            found.append(block)
        self.stats.queried_tokens += len(tokens)
        self.stats.hit_tokens += len(found) * self.block_size
        return found

    def peek(self, tokens: list[int]) -> int:
        """How many leading tokens `lookup` would reuse now (no LRU or stats change)."""
        count = 0
        for key in self._block_keys(tokens[:-1]):
            if key not in self._blocks:
                break
            count += self.block_size
        return count

    def insert(self, tokens: list[int], read_kv: Callable[[int, int], LayerKV]) -> None:
        """Store the prompt's full blocks not cached yet; `read_kv(start, end)` copies them out."""
        if not self.max_blocks:
            return
        for index, key in enumerate(self._block_keys(tokens)):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            start = index * self.block_size
            self._blocks[key] = read_kv(start, start + self.block_size)
            while len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)
