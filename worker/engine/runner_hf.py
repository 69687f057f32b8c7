"""Model runner on CPU with transformers: batches in, next-token logits out.

Each running sequence owns a row of the slot KV cache (`kv_cache.SlotKVCache`); `self.rows[i]` is
the request in row i. Joining requests are prefilled together (their prompts right-padded, each
starting after whatever prefix the prefix cache already had for it); decoding runs one token for
every row. The runner builds the 4-D attention mask itself, so each row attends exactly to its own
tokens whatever the lengths of the others.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from worker.engine.kv_cache import SlotKVCache
from worker.engine.model_config import eos_token_ids, kv_bytes_per_token
from worker.engine.prefix_cache import PrefixCache

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    """'auto': bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), else float32."""
    if name != "auto":
        return _DTYPES[name]
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        flags = ""
    return torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32


class HFModelRunner:
    def __init__(self, model_path: Path, dtype: str = "float32", max_batch_size: int = 16,
                 max_model_len: int = 4096, prefix_cache_tokens: int = 0, prefix_block_size: int = 32):
        self.model_path = model_path
        self.dtype = resolve_dtype(dtype)
        self.eos_token_ids = eos_token_ids(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype)
        self.model.eval()
        config = self.config = self.model.config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.max_model_len = min(max_model_len, config.max_position_embeddings)
        self.cache = SlotKVCache(config.num_hidden_layers, max_batch_size, config.num_key_value_heads,
                                 self.head_dim, self.dtype, self.max_model_len)
        self.prefix = PrefixCache(prefix_block_size, prefix_cache_tokens) if prefix_cache_tokens else None
        self.rows: list[str] = []

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model_path, self.dtype.itemsize)

    def prefill_tokens(self, prompt: list[int]) -> int:
        """Tokens a prefill of `prompt` would compute now (after the cached prefix)."""
        return len(prompt) - (self.prefix.peek(prompt) if self.prefix is not None else 0)

    @torch.inference_mode()
    def prefill(self, request_ids: list[str], prompts: list[list[int]]) -> torch.Tensor:
        """Add the requests as new rows and run their prompts; logits of each prompt's last token."""
        first = len(self.rows)
        starts = [self._start_row(rid, prompt) for rid, prompt in zip(request_ids, prompts)]
        suffixes = [prompt[start:] for prompt, start in zip(prompts, starts)]
        width = max(map(len, suffixes))
        input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, suffix in enumerate(suffixes):
            input_ids[row, :len(suffix)] = torch.tensor(suffix)
        positions = torch.tensor(starts).unsqueeze(1) + torch.arange(width)
        self.cache.prepare(first, first + len(prompts), starts, width)
        hidden = self.model.model(input_ids=input_ids, position_ids=positions, past_key_values=self.cache,
                                  attention_mask=self._mask(positions), use_cache=True).last_hidden_state
        last = hidden[torch.arange(len(prompts)), torch.tensor([len(s) - 1 for s in suffixes])]
        self.cache.commit([len(p) for p in prompts])
        if self.prefix is not None:
            for offset, prompt in enumerate(prompts):
                self.prefix.insert(prompt, lambda s, e, row=first + offset: self.cache.row_kv(row, s, e))
        return self.model.lm_head(last).float()

    @torch.inference_mode()
    def decode(self, last_tokens: dict[str, int]) -> torch.Tensor:
        """One token for every row; logits in `self.rows` order."""
        input_ids = torch.tensor([[last_tokens[rid]] for rid in self.rows], dtype=torch.long)
        starts = list(self.cache.lengths)
        positions = torch.tensor(starts).unsqueeze(1)
        self.cache.prepare(0, len(self.rows), starts, 1)
        out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=self.cache,
                         attention_mask=self._mask(positions), use_cache=True)
        self.cache.commit([s + 1 for s in starts])
        return out.logits[:, -1, :].float()

    @torch.inference_mode()
    def release(self, request_ids: list[str]) -> None:
        """Free the rows of finished or aborted requests."""
        for rid in request_ids:
            if rid in self.rows:
                row = self.rows.index(rid)
                moved = self.cache.remove_row(row)
                if moved is not None:
                    self.rows[row] = self.rows[moved]
                self.rows.pop()

    def _start_row(self, request_id: str, prompt: list[int]) -> int:
        """Claim a row; copy in the cached prefix if any. Returns the number of tokens reused."""
        row = self.cache.add_row()
        self.rows.append(request_id)
        start = 0
        for block in (self.prefix.lookup(prompt) if self.prefix is not None else []):
            start = self.cache.write_row(row, start, block)
        return start

    def _mask(self, positions: torch.Tensor) -> torch.Tensor:
        """rows x 1 x queries x width: query at position p sees cached positions 0..p of its row."""
        kv = torch.arange(self.cache.width)
        return (kv.view(1, 1, 1, -1) <= positions.view(positions.shape[0], 1, -1, 1))
