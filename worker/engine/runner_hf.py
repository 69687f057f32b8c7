"""Model runner on CPU with transformers: batches in, next-token logits out.

The running batch shares one left-padded KV cache (`DynamicCache`, rows in `self.rows` order) and a
2-D attention mask; each row carries its own position ids, so rows of different lengths decode
together. Joining requests are prefilled as their own padded batch, then their KV rows are merged
into the running cache; leaving requests are dropped and all-padding columns trimmed.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class HFModelRunner:
    def __init__(self, model_path: Path, dtype: str = "float32"):
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=_DTYPES[dtype])
        self.model.eval()
        self.config = self.model.config
        self.rows: list[str] = []  # request id of each cache row
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # rows x cached tokens, 1 = real token
        self._positions: torch.Tensor | None = None  # next position id per row

    @property
    def eos_token_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = ids if isinstance(ids, list) else [ids]
        return {i for i in ids if i is not None}

    @torch.inference_mode()
    def prefill(self, request_ids: list[str], prompts: list[list[int]]) -> torch.Tensor:
        """Run the prompts, add them to the running batch; logits of each prompt's last token."""
        width = max(map(len, prompts))
        input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.config)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         cache=cache, use_cache=True, logits_to_keep=1)
        self._merge(request_ids, cache, mask, positions[:, -1] + 1)
        return out.logits[:, -1, :]

    @torch.inference_mode()
    def decode(self, last_tokens: dict[str, int]) -> torch.Tensor:
        """One token for every row; logits in `self.rows` order."""
        input_ids = torch.tensor([[last_tokens[rid]] for rid in self.rows], dtype=torch.long)
        self._mask = torch.cat([self._mask, torch.ones(len(self.rows), 1, dtype=torch.long)], dim=1)
        out = self.model(input_ids=input_ids, attention_mask=self._mask,
                         position_ids=self._positions.unsqueeze(1), cache=self._cache,
                         use_cache=True)
        self._positions += 1
        return out.logits[:, -1, :]

    def release(self, request_ids: list[str]) -> None:
        """Drop finished or aborted rows from the cache."""
        gone = set(request_ids) & set(self.rows)
        if not gone:
            return
        keep = [i for i, rid in enumerate(self.rows) if rid not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._cache = self._mask = self._positions = None
            return
        index = torch.tensor(keep)
        for layer in self._cache.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self._mask, self._positions = self._mask[index], self._positions[index]
        self._trim_left()

    def _merge(self, request_ids, cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor) -> None:
        if self._cache is None:
            self.rows, self._cache, self._mask, self._positions = list(request_ids), cache, mask, positions
            return
        width = max(self._mask.shape[1], mask.shape[1])
        for old, new in zip(self._cache.layers, cache.layers):
            old.keys = torch.cat([_pad_left(old.keys, width), _pad_left(new.keys, width)])
            old.values = torch.cat([_pad_left(old.values, width), _pad_left(new.values, width)])
        self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)])
        self._positions = torch.cat([self._positions, positions])
        self.rows += request_ids

    def _trim_left(self) -> None:
        """Columns that are padding in every row cost attention time: cut them."""
        real = self._mask.any(dim=0).nonzero()
        start = int(real[0]) if len(real) else 0
        if start:
            self._mask = self._mask[:, start:]
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the token axis (dim -2 for KV tensors, -1 for masks) on the left to `width`."""
    axis = -1 if t.dim() == 2 else -2
    missing = width - t.shape[axis]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[axis] = missing
    return torch.cat([t.new_zeros(shape), t], dim=axis)
