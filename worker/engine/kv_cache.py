"""Slot-based KV cache: each running sequence owns one row of preallocated per-layer buffers.

Why: a shared left-padded cache has to be re-padded (copied whole) whenever a request joins, and
`DynamicCache` copies every layer's whole cache at each step (`torch.cat`). Here a token's K/V is
written once, in place, at its sequence's row and position; joining writes only the new row;
leaving moves the last row into the freed one (rows stay compact, so the running batch is a
plain slice of the buffers, never a gather). Buffers grow along the token axis on demand, within
`max_tokens_per_row`, and along the row axis up to `max_rows`, so memory follows the load.

The model sees it as a transformers `Cache`. Before each forward the runner says which rows run
and where each row's new tokens start (`prepare`); every layer's `update` then writes there and
returns the row slice up to the batch's width. The runner passes an explicit 4-D mask, so rows of
different lengths never see each other's padding.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _SlotLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, owner: "SlotKVCache"):
        super().__init__()
        self.owner = owner
        self.is_initialized = True
        self.keys = owner.new_buffer()
        self.values = owner.new_buffer()

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers exist already
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        o = self.owner
        self._write(self.keys, key_states)
        self._write(self.values, value_states)
        return self.keys[o.row_start:o.row_end, :, :o.width], self.values[o.row_start:o.row_end, :, :o.width]

    def _write(self, buffer: torch.Tensor, states: torch.Tensor) -> None:
        o = self.owner
        rows = buffer[o.row_start:o.row_end]
        if states.shape[2] == 1:  # decode: one token per row, each at its own position
            rows[torch.arange(rows.shape[0]), :, o.starts] = states[:, :, 0]
        else:
            for i, start in enumerate(o.starts.tolist()):
                rows[i, :, start:start + states.shape[2]] = states[i]

    def get_seq_length(self) -> int:
        return self.owner.width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_max_length(self) -> int:
        return -1


class SlotKVCache(Cache):
    def __init__(self, num_layers: int, max_rows: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, max_tokens_per_row: int, initial_tokens: int = 256):
        self.max_rows, self.kv_heads, self.head_dim, self.dtype = max_rows, kv_heads, head_dim, dtype
        self.max_tokens_per_row = max_tokens_per_row
        self.capacity = min(initial_tokens, max_tokens_per_row)  # tokens per row allocated
        self.row_capacity = 1  # rows allocated; both grow by doubling, on demand
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])
        self.lengths: list[int] = []  # tokens cached per row
        # set by `prepare` for the next forward:
        self.row_start = self.row_end = self.width = 0
        self.starts = torch.zeros(0, dtype=torch.long)

    def new_buffer(self) -> torch.Tensor:
        return torch.zeros(self.row_capacity, self.kv_heads, self.capacity, self.head_dim, dtype=self.dtype)

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.keys, layer.values))

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    def add_row(self) -> int:
        if self.num_rows >= self.max_rows:
            raise RuntimeError("no free KV row")
        self._ensure_capacity(self.num_rows + 1, 0)
        self.lengths.append(0)
        return self.num_rows - 1

    def prepare(self, row_start: int, row_end: int, starts: list[int], new_tokens: int) -> None:
        """Rows [row_start, row_end) run next, row i writing `new_tokens` tokens from `starts[i]`."""
        self.row_start, self.row_end = row_start, row_end
        self.starts = torch.tensor(starts, dtype=torch.long)
        self.width = max(starts) + new_tokens
        self._ensure_capacity(row_end, self.width)

    def commit(self, new_lengths: list[int]) -> None:
        """After the forward: the true token count of each prepared row."""
        self.lengths[self.row_start:self.row_end] = new_lengths

    def write_row(self, row: int, start: int, per_layer_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Write K/V computed elsewhere (kv_heads x n x head_dim per layer) into `row` at `start`."""
        end = start + per_layer_kv[0][0].shape[1]
        self._ensure_capacity(self.num_rows, end)
        for layer, (k, v) in zip(self.layers, per_layer_kv):
            layer.keys[row, :, start:end] = k
            layer.values[row, :, start:end] = v
        self.lengths[row] = end
        return end

    def row_kv(self, row: int, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys[row, :, start:end].clone(), layer.values[row, :, start:end].clone())
                for layer in self.layers]

    def remove_row(self, row: int) -> int | None:
        """Free `row`; the last row moves into it. Returns the moved row's old index, if any."""
        last = self.num_rows - 1
        moved = None
        if row != last:
            n = self.lengths[last]
            for layer in self.layers:
                layer.keys[row, :, :n] = layer.keys[last, :, :n]
                layer.values[row, :, :n] = layer.values[last, :, :n]
            self.lengths[row] = n
            moved = last
        self.lengths.pop()
        return moved

    def _ensure_capacity(self, rows: int, tokens: int) -> None:
        if rows <= self.row_capacity and tokens <= self.capacity:
            return
        if tokens > self.max_tokens_per_row:
            raise RuntimeError(f"sequence of {tokens} tokens exceeds the KV row size {self.max_tokens_per_row}")
        new_rows = min(max(rows, 2 * self.row_capacity if rows > self.row_capacity else self.row_capacity),
                       self.max_rows)
        new_tokens = min(max(tokens, 2 * self.capacity if tokens > self.capacity else self.capacity),
                         self.max_tokens_per_row)
        for layer in self.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                grown = old.new_zeros(new_rows, self.kv_heads, new_tokens, self.head_dim)
                grown[:old.shape[0], :, :old.shape[2]] = old
                setattr(layer, name, grown)
        self.row_capacity, self.capacity = new_rows, new_tokens
