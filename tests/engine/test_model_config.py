"""What the engines read from a model folder without torch, and that the OpenVINO engine's two
sides (the worker's adapter and the core's process) load no torch, which they never use."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import ROOT
from worker.engine.model_config import eos_token_ids, kv_bytes_per_token

SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "num_hidden_layers": 30, "eos_token_id": 2}


def model_folder(tmp_path, config: dict, generation: dict | None = None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer_and_kv_head(tmp_path):
    folder = model_folder(tmp_path, SMOLLM2)
    assert kv_bytes_per_token(folder, 2) == 2 * 30 * 3 * 64 * 2


def test_without_head_dim_or_kv_heads_the_attention_heads_give_them(tmp_path):
    config = {k: v for k, v in SMOLLM2.items() if k not in ("head_dim", "num_key_value_heads")}
    assert kv_bytes_per_token(model_folder(tmp_path, config), 4) == 2 * 30 * 9 * 64 * 4


def test_eos_ids_come_from_the_generation_config_before_the_model_config(tmp_path):
    assert eos_token_ids(model_folder(tmp_path, SMOLLM2, {"eos_token_id": [2, 5]})) == {2, 5}
    assert eos_token_ids(model_folder(tmp_path, SMOLLM2, {"eos_token_id": None})) == {2}
    (tmp_path / "generation_config.json").unlink()
    assert eos_token_ids(tmp_path) == {2}


def test_the_openvino_engine_and_its_core_load_without_torch(tmp_path):
    """A fresh interpreter imports the adapter and the core, sizes a KV block and makes a request's
    config (where openvino_genai is installed) as the core does: loading torch there took seconds
    from the core's first request."""
    folder = model_folder(tmp_path, SMOLLM2)
    script = ("import importlib.util, sys\n"
              "from worker.engine import openvino_core, openvino_engine, openvino_model\n"
              "from worker.engine.sequence import Sampling\n"
              f"assert openvino_core.kv_block_bytes({str(folder)!r}, 'bf16') == 2 * 30 * 3 * 64 * 2 * 32\n"
              f"assert openvino_core.eos_token_ids({str(folder)!r}) == {{2}}\n"
              "if importlib.util.find_spec('openvino_genai'):\n"
              "    openvino_core.generation_config(Sampling(max_tokens=4, temperature=0.7), {2}, (3, 2))\n"
              "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_core_process_loads_nothing_of_the_workers_side():
    script = ("import sys\nfrom worker.engine import openvino_core\n"
              "print('worker.engine.openvino_engine' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
