"""What every engine offers, so the engine loop, the job runner and the metrics never ask which one runs.

An engine is single-threaded: `loop.EngineLoop` makes every call from its one thread. A request
the engine refuses raises ValueError from `add_request` and fails alone; a failed step ends every
request in flight (finish reason `error`) and leaves the engine usable for the next ones.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from worker.engine.sequence import EngineRequest, RequestOutput


@dataclass
class EngineStats:
    """Counters every engine keeps the same way; the heartbeat and Prometheus read them."""

    steps: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    max_batch_size: int = 0
    tokens_generated: int = 0
    last_batch_size: int = 0
    batch_size_histogram: dict[int, int] = field(default_factory=dict)

    def record_step(self, batch_size: int, prefill: bool) -> None:
        self.steps += 1
        self.prefill_steps += prefill
        self.decode_steps += not prefill
        self.last_batch_size = batch_size
        self.max_batch_size = max(self.max_batch_size, batch_size)
        self.batch_size_histogram[batch_size] = self.batch_size_histogram.get(batch_size, 0) + 1


class Engine(Protocol):
    """`hf_engine.HFEngine`, `vllm_engine.VLLMEngine`, `openvino_engine.OpenVINOEngine`."""

    stats: EngineStats

    def add_request(self, request: EngineRequest) -> None:
        """Take a request; ValueError refuses it (and only it). A request that continues an
        answer (`continued`) runs as `sequence.model_request` says, or is refused with
        `ContinuationRefused`."""

    def abort_request(self, request_id: str) -> None:
        """Drop a request; the next `step` reports it finished with reason `cancelled`."""

    def has_unfinished(self) -> bool:
        """Whether any request is still in the engine (or has an end still to report)."""

    def ready(self) -> bool:
        """Whether `step` has something to do without waiting for another process."""

    def on_ready(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from any thread) whenever `ready` may have turned true."""

    def step(self) -> list[RequestOutput]:
        """One step: each advanced request's new text, and the end of those that finished."""

    def close(self) -> None:
        """Release what the engine holds outside this process, once the worker has finished its
        jobs (the OpenVINO core process; the others hold nothing that outlives them)."""


class ContinuationRefused(ValueError):
    """This engine cannot continue this answer from its generated tokens (`EngineRequest.continued`);
    the job runner then starts the job over."""


class EngineUnavailable(RuntimeError):
    """This engine cannot serve this model here; the registry falls back to the HF engine."""
