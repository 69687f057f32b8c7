"""Which engines llmq has, by the name `LLMQ_ENGINE` gives them.

A new engine is one module implementing `protocol.Engine` with a `build(settings, model)` that
returns the engine and what the heartbeat says of it, plus one line here. Modules are imported
only when their engine is built, so an engine's package (vllm, openvino_genai) is needed only by
the workers that run it.
"""
from __future__ import annotations

import importlib
import logging
import os

from worker.engine.protocol import Engine, EngineUnavailable

log = logging.getLogger(__name__)

FALLBACK = "hf"  # serves any model transformers loads
ENGINES: dict[str, str] = {  # name -> the module whose `build` makes it
    "hf": "worker.engine.hf_engine",
    "vllm": "worker.engine.vllm_engine",
    "openvino": "worker.engine.openvino_model",
}


def build_engine(settings, model) -> tuple[Engine, dict]:
    """The engine `settings.engine` names, on `model`, and what the heartbeat says of it (its
    name under "engine", dtype, KV capacity...). An engine that cannot serve this model here
    (`EngineUnavailable`) gives way to the HF engine, with the reason in the log."""
    name = settings.engine
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; llmq has {', '.join(ENGINES)}")
    try:
        engine, info = importlib.import_module(ENGINES[name]).build(settings, model)
    except EngineUnavailable as exc:
        if name == FALLBACK:
            raise
        log.error("the %s engine cannot serve %s: %s; falling back to the %s engine", name, model.name, exc,
                  FALLBACK)
        return build_engine(settings.model_copy(update={"engine": FALLBACK}), model)
    return engine, {"engine": name, "prompt_lookup": False, **info}  # the HF engine never drafts


def choose_engine(setting: str) -> str:
    """'auto' -> vLLM on a CUDA GPU; on a CPU OpenVINO (int8 weights and continuous batching in
    C++, a plain wheel that starts in seconds; vLLM's CPU build, never picked unasked, takes a
    minute and 4 GiB and is faster only at high concurrency on larger models on some CPUs:
    docs/benchmarks.md); the HF engine where neither is installed."""
    if setting != "auto":
        return setting
    import importlib.util

    if importlib.util.find_spec("vllm") and gpu_driver_present():
        import torch

        if torch.cuda.is_available():
            return "vllm"
    return "openvino" if importlib.util.find_spec("openvino_genai") else "hf"


def gpu_driver_present() -> bool:
    """Whether this machine has a GPU driver (NVIDIA's or AMD's) to ask about: only then is it
    worth loading torch to ask whether CUDA works, which takes seconds of a worker's start and
    a few hundred MiB that a worker of a CPU engine never uses otherwise."""
    return any(os.path.exists(device) for device in ("/dev/nvidiactl", "/dev/kfd"))
