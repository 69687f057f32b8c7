"""Random-weight models built here, without hub access: one with Qwen2.5-0.5B-Instruct's
architecture and sizes (speed work at the real cost per token; a tensor-parallel vLLM worker's
model), and a 2-layer one of the same architecture (a second catalog model that loads in a
second). They borrow the embedded model's tokenizer (token ids stay below its vocab; the
Qwen-size one keeps Qwen's 151,936-row embedding and LM head, so the per-token cost is the real
one). The text they write is noise. `python -m bench.make_qwen_size_model` builds one."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from common.models import embedded_model
from common.settings import Settings

# Qwen/Qwen2.5-0.5B-Instruct config.json, as published
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  hidden_act="silu", attention_dropout=0.0, use_sliding_window=False)

# The same architecture at a toy size, over the embedded model's vocabulary: a second model that
# answers differently from the embedded one and loads in about a second
TINY = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=49152, max_position_embeddings=8192)


def build(out: Path, sizes: dict = QWEN25_05B) -> Path:
    if (out / "config.json").exists():
        return out
    smol = embedded_model(Settings(), prepare=True).path
    torch.manual_seed(0)
    config = Qwen2Config(**sizes, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smol / name).exists():
            shutil.copy(smol / name, tmp / name)
    tmp.rename(out)
    return out


def default_out(tiny: bool = False) -> Path:
    return Settings().model_cache_dir / ("tiny-random" if tiny else "qwen2.5-0.5b-random")

