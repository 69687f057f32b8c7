"""The vLLM engine adapter: same interface and output semantics as the CPU engine.

Most tests drive the adapter with a fake vLLM core (per-step token deltas, as vLLM's
`LLMEngine.step` returns them for the adapter's requests), so they run anywhere. The `gpu` tests need vllm and a CUDA GPU and skip otherwise.
"""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from tests.support.fakes import CharTokenizer, run_to_end
from tests.support.waiting import wait_until
from worker.engine.loop import EngineLoop
from worker.engine.sequence import EngineRequest, Sampling
from worker.engine.vllm_engine import VLLMEngine

GREEDY = Sampling(max_tokens=50, temperature=0)


class FakeVllmCore:
    """Emits each request's script one token per step (all running requests advance together),
    each step's new `token_ids` only (RequestOutputKind.DELTA, as the adapter asks) and vLLM's
    finish reasons."""

    def __init__(self, scripts: dict[str, str], fail_on_step: int | None = None):
        self.scripts = {rid: [ord(c) for c in text] for rid, text in scripts.items()}
        self.running: dict[str, tuple[list[int], int]] = {}
        self.aborted: list[str] = []
        self.steps = 0
        self.fail_on_step = fail_on_step

    def add_request(self, request_id, prompt, params):
        assert prompt["prompt_token_ids"], "prompt ids are passed, not text"
        if len(prompt["prompt_token_ids"]) > 100:
            raise RuntimeError("prompt is longer than the model's context")
        self.running[request_id] = ([], params.max_tokens)

    def abort_request(self, request_ids):
        for rid in request_ids:
            self.aborted.append(rid)
            self.running.pop(rid, None)

    def step(self):
        self.steps += 1
        if self.steps == self.fail_on_step:
            raise RuntimeError("CUDA error: device-side assert")
        results = []
        for rid, (ids, max_tokens) in list(self.running.items()):
            script = self.scripts[rid]
            ids.append(script[len(ids)] if len(ids) < len(script) else 0)
            reason = "stop" if ids[-1] == 0 else ("length" if len(ids) >= max_tokens else None)
            if reason:  # EOS (id 0) stays in token_ids and decodes to nothing, as in vLLM
                del self.running[rid]
            results.append(SimpleNamespace(request_id=rid, finished=reason is not None,
                                           outputs=[SimpleNamespace(token_ids=ids[-1:], finish_reason=reason)]))
        return results


def fake_params(sampling: Sampling):
    return SimpleNamespace(max_tokens=sampling.max_tokens)


def make_engine(scripts, **kw):
    core = FakeVllmCore(scripts, **kw)
    return VLLMEngine("unused", core=core, tokenizer=CharTokenizer(), sampling_params=fake_params), core


def test_deltas_add_up_to_the_text_and_requests_batch_together():
    engine, _ = make_engine({"a": "hello", "b": "hi"})
    engine.add_request(EngineRequest("a", [1, 2], GREEDY))
    engine.add_request(EngineRequest("b", [1], GREEDY))
    texts, finals = run_to_end(engine)
    assert texts == {"a": "hello", "b": "hi"}
    assert finals["a"].finish_reason == finals["b"].finish_reason == "stop"
    assert finals["a"].prompt_tokens == 2
    assert engine.stats.max_batch_size == 2 and engine.stats.tokens_generated > 0
    assert sum(engine.stats.batch_size_histogram.values()) == engine.stats.steps


def test_max_tokens_gives_length():
    engine, _ = make_engine({"a": "abcdefgh"})
    engine.add_request(EngineRequest("a", [1], Sampling(max_tokens=3, temperature=0)))
    texts, finals = run_to_end(engine)
    assert texts["a"] == "abc" and finals["a"].finish_reason == "length"
    assert finals["a"].completion_tokens == 3


def test_stop_string_is_cut_and_the_vllm_request_aborted():
    engine, core = make_engine({"a": "one two STOP three"})
    engine.add_request(EngineRequest("a", [1], Sampling(max_tokens=50, temperature=0, stop=("STOP",))))
    texts, finals = run_to_end(engine)
    assert texts["a"] == "one two " and finals["a"].finish_reason == "stop"
    assert "a" in core.aborted


def test_abort_reports_cancelled_next_step_and_others_go_on():
    engine, core = make_engine({"a": "aaaaaaaaaa", "b": "bbbb"})
    engine.add_request(EngineRequest("a", [1], GREEDY))
    engine.add_request(EngineRequest("b", [1], GREEDY))
    texts, finals = run_to_end(engine, on_step=lambda step: step == 2 and engine.abort_request("a"))
    assert finals["a"].finish_reason == "cancelled" and texts["a"] == "aa"
    assert texts["b"] == "bbbb" and finals["b"].finish_reason == "stop"
    assert core.aborted == ["a"]


def test_rejected_request_is_a_request_error_and_step_failure_fails_everyone():
    engine, _ = make_engine({"a": "abc", "b": "abc"}, fail_on_step=2)
    with pytest.raises(ValueError, match="rejected"):
        engine.add_request(EngineRequest("long", list(range(200)), GREEDY))
    engine.add_request(EngineRequest("a", [1], GREEDY))
    engine.add_request(EngineRequest("b", [1], GREEDY))
    texts, finals = run_to_end(engine)
    assert {o.finish_reason for o in finals.values()} == {"error"}
    assert all("CUDA error" in o.error for o in finals.values())
    assert not engine.has_unfinished()


def test_runs_under_the_engine_loop_like_the_cpu_engine():
    engine, _ = make_engine({"a": "streamed", "b": "x" * 60})
    loop = EngineLoop(engine)
    stream = loop.submit(EngineRequest("a", [1], GREEDY))
    bad = loop.submit(EngineRequest("b", list(range(200)), GREEDY))
    text, deadline = "", time.monotonic() + 10
    while time.monotonic() < deadline:
        out = stream.get(timeout=1)
        if out is None:
            continue
        text += out.text
        if out.finished:
            break
    assert text == "streamed" and out.finish_reason == "stop"
    failed = bad.get(timeout=5)
    assert failed.finished and failed.finish_reason == "error" and "rejected" in failed.error


class QueuedFakeVllmCore(FakeVllmCore):
    """As vLLM's multiprocess engine: its engine core steps in another process, and a thread of
    its client queues each step's outputs on `engine_core.outputs_queue`, where `step` blocks until
    they come. Here the test plays the engine core: `emit` runs one step and queues its outputs."""

    def __init__(self, scripts):
        super().__init__(scripts)
        self.engine_core = SimpleNamespace(outputs_queue=queue.Queue())

    def step(self):
        return self.engine_core.outputs_queue.get()

    def emit(self):
        self.engine_core.outputs_queue.put_nowait(super().step())


def test_a_request_reaches_vllm_while_the_loop_waits_for_a_step():
    """The loop waits for vLLM's outputs beside its inbox, not inside `step`: a request submitted
    while a step is under way goes to vLLM at once, so it can join the very next step."""
    core = QueuedFakeVllmCore({"a": "abc", "b": "xy"})
    engine = VLLMEngine("unused", core=core, tokenizer=CharTokenizer(), sampling_params=fake_params)
    ready, step_awaited = engine.ready, threading.Event()
    engine.ready = lambda: ready() or step_awaited.set()  # the loop found the step not yet done
    loop = EngineLoop(engine)
    first = loop.submit(EngineRequest("a", [1], GREEDY))
    wait_until(lambda: "a" in core.running, timeout=5)
    assert step_awaited.wait(5)  # the loop is now waiting for a's first step, which has not come
    second = loop.submit(EngineRequest("b", [1], GREEDY))
    wait_until(lambda: "b" in core.running, timeout=5)  # blocked inside step(), the loop would never get here
    assert core.steps == 0
    for _ in range(4):  # a: a, b, c, EOS; b joined the first step: x, y, EOS
        core.emit()
    texts = {}
    for rid, stream in (("a", first), ("b", second)):
        texts[rid], out = "", None
        while out is None or not out.finished:
            out = stream.get(timeout=5)
            assert out is not None, f"{rid} did not finish"
            texts[rid] += out.text
    assert texts == {"a": "abc", "b": "xy"} and not engine.has_unfinished()


def test_module_does_not_import_vllm():
    code = "import sys, worker.engine.vllm_engine; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- real vLLM on a GPU --------------------------------------------------------------------------
def _gpu_or_skip():
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")


@pytest.mark.gpu
def test_vllm_engine_generates_on_gpu(model_ref):
    _gpu_or_skip()
    from tests.support.settings import make_settings

    engine = VLLMEngine(model_ref.path, make_settings(vllm_gpu_memory_utilization=0.3, vllm_enforce_eager=True))
    from common.prompting import PromptBuilder

    builder = PromptBuilder(model_ref.path, 2048)
    _, ids = builder.build([{"role": "user", "content": "What is the capital of France?"}], None)
    for i in range(8):
        engine.add_request(EngineRequest(f"r{i}", ids, Sampling(max_tokens=24, temperature=0)))
    engine.add_request(EngineRequest("stop", ids, Sampling(max_tokens=40, temperature=0, stop=("Paris",))))
    texts, finals = run_to_end(engine, max_steps=500)
    assert len({texts[f"r{i}"] for i in range(8)}) == 1, "greedy requests in one batch agree"
    assert "Paris" in texts["r0"] and "Paris" not in texts["stop"]
    assert finals["stop"].finish_reason == "stop"
    assert engine.stats.max_batch_size >= 8


def test_auto_engine_is_vllm_on_a_gpu_openvino_on_a_cpu_else_hf(monkeypatch):
    import importlib.util

    import torch

    from worker.engine import registry
    from worker.engine.registry import choose_engine

    def installed(*names):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in names else None)

    def cuda_asked():
        raise AssertionError("torch was asked about CUDA on a machine without a GPU driver")

    installed("vllm", "openvino_genai")
    monkeypatch.setattr(registry, "gpu_driver_present", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", cuda_asked)
    assert choose_engine("auto") == "openvino"  # CPU: OpenVINO, even with vLLM's CPU build there
    monkeypatch.setattr(registry, "gpu_driver_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a driver, but no GPU for torch
    assert choose_engine("auto") == "openvino"
    installed("vllm")
    assert choose_engine("auto") == "hf"  # CPU without OpenVINO: never vLLM unasked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_engine("auto") == "vllm"
    installed("openvino_genai")
    assert choose_engine("auto") == "openvino"  # a GPU but no vllm
    installed()
    assert choose_engine("auto") == "hf"
    assert choose_engine("vllm") == "vllm" and choose_engine("hf") == "hf"


def test_float32_stays_float32_for_vllm():
    from worker.engine.vllm_engine import vllm_dtype

    assert vllm_dtype("float32") == "float32" and vllm_dtype("bfloat16") == "bfloat16"


def test_each_steps_tokens_wait_the_relay_delay_before_they_are_handed_on(monkeypatch):
    """On CPU the worker holds each step's tokens for `vllm_relay_delay_ms` before returning them;
    without the setting (a test double's engine) it never sleeps."""
    from tests.support.settings import make_settings
    from worker.engine import vllm_engine

    slept = []
    monkeypatch.setattr(vllm_engine.time, "sleep", slept.append)
    core = FakeVllmCore({"a": "ab"})
    engine = VLLMEngine("unused", make_settings(vllm_relay_delay_ms=3), core=core, tokenizer=CharTokenizer(),
                        sampling_params=fake_params)
    engine.add_request(EngineRequest("a", [1], GREEDY))
    texts, _ = run_to_end(engine)
    assert texts["a"] == "ab" and slept == [0.003] * core.steps
    plain, _ = make_engine({"b": "cd"})
    plain.add_request(EngineRequest("b", [1], GREEDY))
    run_to_end(plain)
    assert len(slept) == core.steps
