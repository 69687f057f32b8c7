"""The generation engines: plain Python, no Celery, no Redis.

`protocol` says what every engine offers and `registry` which engines there are; `output` turns
every engine's token ids into text and finish reasons. The HF engine is `hf_engine` (`scheduler`
decides who runs each step, `runner_hf` runs the model, `sampler` picks tokens); `vllm_engine` and
`openvino_engine` adapt engines that schedule and sample on their own. `loop` drives any of them on
a background thread for callers on other threads.
"""
from worker.engine.sequence import EngineRequest, RequestOutput, Sampling

__all__ = ["EngineRequest", "RequestOutput", "Sampling"]
