"""The generation engine: plain Python and torch, no Celery, no Redis.

`scheduler` decides who runs each step, `runner_*` runs the model on a batch, `sampler` picks tokens,
`detokenizer` turns tokens into text deltas with stop strings, `engine` ties them into `step()`,
and `loop` drives `step()` on a background thread for callers on other threads.
"""
from worker.engine.sequence import EngineRequest, RequestOutput, Sampling

__all__ = ["EngineRequest", "RequestOutput", "Sampling"]
