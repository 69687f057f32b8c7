"""The OpenVINO engine beyond the shared contract: what it serves, how close int8 stays to float
weights, the fallbacks, and that its steps, in a process of their own, leave the GIL to the job
threads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.prompting import PromptBuilder
from tests.support import ROOT
from tests.support.engines import token_ids
from tests.support.settings import make_settings
from worker.engine.sequence import EngineRequest, ResponseFormat, Sampling

pytest.importorskip("openvino_genai", reason="the OpenVINO engine is not installed")
pytestmark = pytest.mark.slow

# Greedy agreement of int8 weights with bf16 weights (both computed in float32), over the contract's
# prompts, 48 tokens each. Measured here: see docs/engines.md; the floor leaves room for other CPUs.
MIN_IDENTICAL = 2
MIN_MEAN_COMMON_PREFIX = 12


def build(model_ref, **overrides):
    from worker.engine.registry import build_engine

    settings = make_settings(**{"engine": "openvino", "kv_cache_mb": 128, "max_batch_size": 8, **overrides})
    return build_engine(settings, model_ref)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_int8_weights_agree_with_bf16_weights_above_the_floor(model_ref, prompts):
    runs = {}
    for weights in ("int8", "bf16"):
        engine, info = build(model_ref, weights=weights, dtype="float32")
        assert info["engine"] == "openvino" and info["weights"] == weights
        runs[weights] = token_ids(engine, prompts, 48, weights)
    prefixes = [common_prefix(a, b) for a, b in zip(runs["int8"], runs["bf16"])]
    identical = sum(a == b for a, b in zip(runs["int8"], runs["bf16"]))
    print(f"int8 vs bf16: identical {identical}/{len(prompts)}, common prefixes {prefixes}")
    assert identical >= MIN_IDENTICAL and sum(prefixes) / len(prefixes) >= MIN_MEAN_COMMON_PREFIX


def test_int8_weights_are_exported_symmetric_into_a_folder_of_their_own(model_ref):
    """int8 weights carry one scale per output channel and no zero point: signed weights, no
    unsigned ones and no subtraction of a zero point before each matmul, the form that decodes
    faster on a CPU without int8 dot products (docs/engines.md). The export an older llmq made
    with zero points, in the folder named after the format alone, is not the one served."""
    import openvino as ov

    from worker.engine.openvino_model import choose_source

    settings = make_settings(engine="openvino", weights="int8")
    source, weights = choose_source(model_ref, settings)
    assert weights == "int8" and source.name != f"{model_ref.disk_name}-int8"
    model = ov.Core().read_model(source / "openvino_model.xml")
    constants = [op.get_element_type() for op in model.get_ops() if op.get_type_name() == "Constant"]
    assert constants.count(ov.Type.i8) > 0 and constants.count(ov.Type.u8) == 0
    assert not [op for op in model.get_ops() if op.get_type_name() == "Subtract"]


def test_the_activation_group_reaches_the_plugin(model_ref, prompts):
    """`openvino_activation_group` is passed to the plugin (the heartbeat says which) unless the
    dtype is float32, which keeps activations exact. How much larger groups change the answers is
    measured, not asserted here: bench/studies/weights_quality.py --dq-groups (docs/engines.md)."""
    from worker.engine.openvino_core import plugin_properties

    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in plugin_properties("auto", 2)
    assert plugin_properties("auto", 2, 128)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 128
    assert plugin_properties("float32", 2, 128)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0
    engine, info = build(model_ref, weights="int8", dtype="auto", openvino_activation_group=128)
    assert info["activation_group"] == 128
    assert all(0 < len(ids) <= 16 for ids in token_ids(engine, prompts, 16, "group 128"))


def test_the_gguf_file_is_served_as_it_is_when_asked(model_ref, prompts):
    engine, info = build(model_ref, weights="gguf")
    assert info["weights"] == "Q4_1" and info["source"].endswith(".gguf")
    (ids,) = token_ids(engine, prompts[:1], 8, "gguf")
    assert len(ids) == 8


def test_without_an_exporter_a_gguf_model_is_served_from_its_file(model_ref, tmp_path):
    engine, info = build(model_ref, model_cache_dir=tmp_path, openvino_export_python=tmp_path / "none")
    assert info["engine"] == "openvino" and info["source"].endswith(".gguf")


def test_a_model_openvino_cannot_serve_falls_back_to_the_hf_engine(model_ref, tmp_path):
    """A Hugging Face folder (no GGUF) with no exporter: the reason is logged, the HF engine serves."""
    from dataclasses import replace

    folder_only = replace(model_ref, gguf=None)
    from worker.engine.registry import build_engine

    settings = make_settings(engine="openvino", model_cache_dir=tmp_path, openvino_export_python=tmp_path / "none",
                             kv_cache_mb=64)
    engine, info = build_engine(settings, folder_only)
    assert info["engine"] == "hf"


def test_a_prompt_longer_than_the_kv_cache_fails_alone(model_ref, prompts):
    # A float32 KV cache of 4 MB holds two blocks of 32 tokens: room for the short prompt, not the long one.
    engine, info = build(model_ref, kv_cache_mb=4, dtype="float32")
    assert len(prompts[0]) + 4 <= info["kv_capacity_tokens"]
    long_prompt = prompts[0] * (info["kv_capacity_tokens"] // len(prompts[0]) + 1)
    with pytest.raises(ValueError, match="KV cache"):
        engine.add_request(EngineRequest("long", long_prompt, Sampling(max_tokens=4)))
    engine.add_request(EngineRequest("short", prompts[0], Sampling(max_tokens=4, temperature=0)))
    while engine.has_unfinished():
        finals = [o for o in engine.step() if o.finished]
    assert finals[0].finish_reason == "length"


def test_requests_beyond_the_kv_cache_wait_for_room_instead_of_failing(model_ref):
    # A float32 KV cache of 12 MB holds 256 tokens: two answers of 90 tokens to a short prompt fit
    # beside each other, four do not. Given all four, the pipeline preempts, or (seen with long
    # prompts sharing cached blocks) drops requests mid-answer; the adapter holds two back instead.
    engine, info = build(model_ref, kv_cache_mb=12, dtype="float32")
    count = PromptBuilder(model_ref.path, 1024).build(None, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,")[1]
    need = len(count) + 90
    fit = info["kv_capacity_tokens"] // need
    assert 1 < fit < 4
    for i in range(4):
        engine.add_request(EngineRequest(f"r{i}", count, Sampling(max_tokens=90, temperature=0)))
    finals, most_at_once = [], 0
    while engine.has_unfinished():
        outputs = engine.step()
        most_at_once = max([most_at_once, *(o.batch_size for o in outputs)])
        finals += [o for o in outputs if o.finished]
    assert [(o.finish_reason, o.error) for o in finals] == [("length", None)] * 4
    assert most_at_once <= fit


def test_prompts_that_start_alike_wait_for_the_first_ones_prefill(model_ref):
    """The pipeline looks up its prefix cache only as it takes a request in: requests sharing a
    long start, sent together, would each compute it. The adapter sends the first, then the others
    once it has its first token (from the cache); other requests are not held."""
    from worker.engine.openvino_gate import SHARED_START_TOKENS

    engine, _ = build(model_ref)
    builder = PromptBuilder(model_ref.path, 4096)
    policy = builder.build(None, "Policy: refunds within thirty days of delivery, to the original card. " * 40)[1]
    assert len(policy) > SHARED_START_TOKENS
    asks = {f"r{i}": policy + builder.build(None, f" Question {i}: may I return a lamp?")[1] for i in range(3)}
    asks["other"] = builder.build(None, "Name a colour.")[1]
    for request_id, prompt in asks.items():
        engine.add_request(EngineRequest(request_id, prompt, Sampling(max_tokens=4, temperature=0)))
    assert engine.gate.in_core == {"r0", "other"}  # r1 and r2 wait for r0's start to be cached
    seen, finals = set(), []
    while engine.has_unfinished():
        outputs = engine.step()
        now = {out.request_id for out in outputs}
        if "r0" in now - seen:  # r0's first token: the others go to the core at once
            assert {"r1", "r2"} <= engine.gate.in_core and not {"r1", "r2"} & now
        elif "r0" not in seen:
            assert not {"r1", "r2"} & engine.gate.in_core
        seen |= now
        finals += [(out.request_id, out.finish_reason) for out in outputs if out.finished]
    assert sorted(finals) == sorted((rid, "length") for rid in asks)


def test_steps_leave_the_gil_to_the_job_threads(prompts):
    """The job threads relay text while the engine computes. openvino-genai holds the GIL for a
    whole step, so the pipeline steps in a process of its own: a fresh worker-side interpreter
    decodes 8 requests through the engine without ever loading OpenVINO itself, so nothing of a
    step can hold its GIL (were the steps in its process, its threads could run only between them)."""
    script = ("import json, os, sys\n"
              "from common.models import embedded_model\n"
              "from tests.support.settings import make_settings\n"
              "from worker.engine.registry import build_engine\n"
              "from worker.engine.sequence import EngineRequest, Sampling\n"
              "settings = make_settings(engine='openvino', kv_cache_mb=128, max_batch_size=8)\n"
              "engine, info = build_engine(settings, embedded_model(settings, prepare=True))\n"
              f"prompts = {prompts!r}\n"
              "for i in range(8):\n"
              "    engine.add_request(EngineRequest(f'g{i}', prompts[i % len(prompts)], Sampling(max_tokens=64, temperature=0)))\n"
              "while engine.has_unfinished():\n"
              "    engine.step()\n"
              "print(json.dumps({'engine': info['engine'], 'steps': engine.stats.steps,\n"
              "                  'core_elsewhere': engine.process.pid != os.getpid(),\n"
              "                  'openvino_here': sorted(m for m in ('openvino', 'openvino_genai') if m in sys.modules)}))\n"
              "engine.close()\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"engine": "openvino", "steps": seen["steps"], "core_elsewhere": True, "openvino_here": []}
    assert seen["steps"] >= 40  # 8 requests of 64 tokens decoded


def test_the_core_process_ends_with_close(model_ref):
    engine, _ = build(model_ref)
    assert engine.process.is_alive()
    engine.close()
    assert not engine.process.is_alive()


def test_json_output_leaves_the_core_without_the_grammar_library(model_ref, prompts):
    """The worker makes a JSON request's grammar and hands the core its text, so the core, which
    holds the model, never loads xgrammar nor the torch it imports (seconds of the first JSON
    request, and hundreds of MiB); the grammar still holds the answer to the schema."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    engine, _ = build(model_ref)
    try:
        fmt = ResponseFormat("json_schema", json.dumps(schema))
        engine.add_request(EngineRequest("js", prompts[3], Sampling(max_tokens=40, temperature=0, response_format=fmt)))
        text = ""
        while engine.has_unfinished():
            text += "".join(output.text for output in engine.step())
        assert text.startswith('{"n":'), text
        libraries = Path(f"/proc/{engine.process.pid}/maps").read_text()
        assert "xgrammar" not in libraries and "libtorch" not in libraries
    finally:
        engine.close()
