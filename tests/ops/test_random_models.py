"""The random-weight models that benchmarks and some tests serve: every token they choose shows
text (so "first text" is the first token on every engine), and a model built by an older recipe
is built again, with the exports made from it."""
import json
import shutil

import pytest
from safetensors.torch import load_file

from tests.support.random_models import RECIPE, TINY, build, silent_ids


def test_only_ids_with_text_can_win_and_an_old_build_is_replaced(tmp_path, model_ref):
    out = tmp_path / "tiny-random"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "qwen2"}))  # an older recipe's
    shutil.copy(model_ref.path / "tokenizer.json", out / "tokenizer.json")
    stale_ir = tmp_path / "openvino" / "tiny-random-int8"
    stale_ir.mkdir(parents=True)
    stale_gguf = tmp_path / "tiny-random-q8_0.gguf"
    stale_gguf.write_bytes(b"old")

    build(out, TINY)

    assert all(json.loads((out / "config.json").read_text())[k] == v for k, v in RECIPE.items())
    assert not stale_ir.exists() and not stale_gguf.exists()
    head = load_file(next(out.glob("*.safetensors")))["model.embed_tokens.weight"]
    silent = silent_ids(model_ref.path, TINY["vocab_size"])
    assert 0 < len(silent) < TINY["vocab_size"] // 10
    zero_rows = set((head.abs().sum(dim=1) == 0).nonzero().flatten().tolist())
    assert zero_rows == set(silent)
    built_at = (out / "config.json").stat().st_mtime_ns
    build(out, TINY)  # this recipe's: kept as it is
    assert (out / "config.json").stat().st_mtime_ns == built_at


@pytest.mark.parametrize("model_type, tokenizer", [("llama", "embedded"), ("qwen2", "its own")],
                         ids=["the embedded model", "a real Qwen2.5"])
def test_a_folder_holding_another_model_is_refused_and_left_as_it_is(tmp_path, model_ref, model_type, tokenizer):
    """Pointed at a folder that holds a model it did not build (a copy of the embedded model, a
    real Qwen2.5 with its own tokenizer), the build stops there: that folder and the exports made
    from it stay."""
    out = tmp_path / "a-model"
    out.mkdir()
    config = json.dumps({"model_type": model_type, "vocab_size": 49152})
    (out / "config.json").write_text(config)
    if tokenizer == "embedded":
        shutil.copy(model_ref.path / "tokenizer.json", out / "tokenizer.json")
    else:
        (out / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}}}))
    export = tmp_path / "openvino" / "a-model-int8"
    export.mkdir(parents=True)

    with pytest.raises(ValueError, match="not built here"):
        build(out, TINY)

    assert (out / "config.json").read_text() == config and (out / "tokenizer.json").exists()
    assert export.exists()
