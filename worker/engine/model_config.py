"""What the engines read of a model from its folder's JSON files, without torch or transformers.

The OpenVINO engine's core sizes its KV cache and stops generating from these, and the HF engine
reads the same functions, so every engine stops on the same tokens and counts KV memory alike.
Keeping them free of torch keeps torch out of the OpenVINO engine's processes, which never use it.
"""
from __future__ import annotations

import json
from pathlib import Path


def eos_token_ids(model_dir: Path) -> set[int]:
    """The ids that end generation: generation_config.json's, else config.json's (transformers
    reads the same files)."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids |= set(value if isinstance(value, list) else [value]) - {None}
            if ids:
                return ids
    return ids


def kv_bytes_per_token(model_dir: Path, element_bytes: int) -> int:
    """Bytes of one token's keys and values, over every layer and KV head, at `element_bytes`
    per number."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * element_bytes
