"""Random-weight models built here, without hub access: one with Qwen2.5-0.5B-Instruct's architecture
and sizes (speed work at the real cost per token), a 2-layer one of the same architecture (a second
catalog model that loads in a second), and one between them whose heads split over two ranks (a
tensor-parallel vLLM worker's model). They borrow the embedded model's tokenizer; the Qwen-size one
keeps Qwen's 151,936-row embedding and LM head, so the per-token cost is the real one. The text
they write is noise, but every token they choose is text: the rows of ids the tokenizer has no text
for (past its vocabulary, special tokens, lone bytes of a longer character) are zero, so they never
win. With random rows there, most answers began with tokens that show nothing, and a benchmark's
"first text" came tokens after the first token, differently for each engine's rounding.
`python -m bench.make_qwen_size_model` builds one."""
from __future__ import annotations

import json
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


# Small enough to load and step in a moment, with heads that split over two tensor-parallel ranks
# (SmolLM2's 9 cannot) and a head size vLLM's CPU attention takes (TINY's 16 is not one of them)
SPLITTABLE = dict(TINY, hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=2)
# written into config.json; a model built by an earlier recipe (without it) is built again
RECIPE = {"llmq_random_model": "text-rows-only"}


def build(out: Path, sizes: dict = QWEN25_05B) -> Path:
    if _built_by_this_recipe(out):
        return out
    _remove_with_what_was_made_from_it(out)
    smol = embedded_model(Settings(), prepare=True).path
    torch.manual_seed(0)
    config = Qwen2Config(**sizes, bos_token_id=1, eos_token_id=2, pad_token_id=2, **RECIPE)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        model.get_output_embeddings().weight[silent_ids(smol, config.vocab_size)] = 0
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smol / name).exists():
            shutil.copy(smol / name, tmp / name)
    tmp.rename(out)
    return out


def silent_ids(tokenizer_dir: Path, rows: int) -> list[int]:
    """Ids that decode to no text of their own: past the tokenizer's vocabulary, special tokens,
    and bytes that are only part of a character."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = len(tokenizer)
    silent = set(tokenizer.all_special_ids) | set(range(vocab, rows))
    for token_id in range(min(vocab, rows)):
        text = tokenizer.decode([token_id])
        if not text.strip() or "\ufffd" in text:
            silent.add(token_id)
    return sorted(silent)


def _config(folder: Path) -> dict:
    """The folder's config.json, or {} where there is none that reads."""
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _built_by_this_recipe(out: Path) -> bool:
    config = _config(out)
    return all(config.get(key) == value for key, value in RECIPE.items())


def _remove_with_what_was_made_from_it(out: Path) -> None:
    """An older build and its exports, which would otherwise be served in its place: the OpenVINO
    IR folders `worker.engine.openvino_model.exported_dir` names after it (beside it, in the model
    cache) and the GGUF files `bench.qwen_size_gguf` writes beside it. Every recipe built a qwen2
    model with the embedded model's tokenizer: any other folder (the embedded model itself, a real
    Qwen2.5) is not one of ours, and is refused rather than deleted."""
    if not out.exists():
        return
    if not random_build(out):
        raise ValueError(f"{out} holds a model that was not built here with random weights; "
                         "it is left as it is (name another folder)")
    shutil.rmtree(out)
    for made in [*out.parent.glob(f"{out.name}-*.gguf"), *(out.parent / "openvino").glob(f"{out.name}-*")]:
        shutil.rmtree(made) if made.is_dir() else made.unlink()


def random_build(folder: Path) -> bool:
    """The folder holds a model built here, by this recipe or an older one: a qwen2 model that
    borrows the embedded model's tokenizer."""
    return _config(folder).get("model_type") == "qwen2" and borrows_embedded_tokenizer(folder)


def borrows_embedded_tokenizer(folder: Path) -> bool:
    """The folder's tokenizer is the embedded model's, byte for byte (true of that model too)."""
    try:
        tokenizer = (folder / "tokenizer.json").read_bytes()
    except OSError:
        return False
    smol = embedded_model(Settings(), prepare=True).path
    return tokenizer == (smol / "tokenizer.json").read_bytes()


def default_out(tiny: bool = False) -> Path:
    return Settings().model_cache_dir / ("tiny-random" if tiny else "qwen2.5-0.5b-random")

