"""OpenVINO GenAI's pipeline in a process of its own: the engine core of the OpenVINO engine.

openvino-genai's Python binding holds the GIL for the whole of `ContinuousBatchingPipeline.step()`,
so in the worker's process every job thread (the text relay to Redis, Celery's threads) would wait
for each step to end. Here the pipeline steps in a child process, as vLLM's engine core does: the
worker sends it requests and cancels over a pipe, and it sends back each step's new token ids, and
steps again at once while it has work. Only token ids cross; text is made in the worker.

The core sends what its steps made in bunches, every `stream_interval_ms` (the interval at which
the worker relays text anyway), and at once when a request gets its first token or ends. Each
message wakes threads of the worker, and on a small CPU every wake-up takes a core from the
pipeline's compute threads for a moment, which all of them then wait for: one message a step
made a single stream markedly slower than the pipeline alone (docs/benchmarks.md).

Messages to the core: ("add", request_id, prompt_ids, sampling), ("cancel", request_id), ("close",).
From it: ("ready", info) once, then ("steps", [(request_id, new_ids, reason, logprobs)], ignored_ids,
[(batch_size, prefill)] per step), ("refused", request_id, message) for a request it could not
take, ("failed", message) when a step raised. `reason` is None while a request runs, else a
`FinishReason` (STOP or LENGTH); `logprobs` the new tokens' logprobs for a request that asked
for them (`Sampling.logprobs`), else None.
"""
from __future__ import annotations

import logging
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from common.schemas import FinishReason

log = logging.getLogger(__name__)


def run_core(source: Path, model_dir: Path, settings, conn: Connection) -> None:
    """The child's main loop (target of a spawned process; ends when the pipe closes).

    The core ignores SIGTERM and SIGINT: a process manager stopping the worker signals its whole
    group (compose, systemd, Ctrl-C), and a core that died at once would cut the worker's warm
    shutdown short with the jobs it is finishing. The core ends when the worker closes the pipe,
    or with the worker itself (child_hygiene binds it with PDEATHSIG, SIGKILL)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from worker.engine.openvino_engine import build_pipeline, eos_token_ids, prompt_lookup

        pipeline, info = build_pipeline(source, model_dir, settings)
    except Exception as exc:  # unreadable model, missing package: the parent falls back
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", info))
    core = _Core(pipeline, eos_token_ids(model_dir), conn, settings.stream_interval_ms / 1000,
                 prompt_lookup(settings))
    try:
        core.serve()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the worker closed the pipe or is gone: nothing left to serve


class _Core:
    def __init__(self, pipeline: Any, stop_token_ids: set[int], conn: Connection, interval_s: float,
                 lookup: tuple[int, int] | None = None):
        self.pipeline = pipeline
        self.lookup = lookup  # (draft tokens, n-gram size) every request of a prompt-lookup pipeline carries
        self.stop_token_ids = stop_token_ids
        self.conn = conn
        self.interval_s = interval_s
        self.handles: dict[str, Any] = {}
        self._next_id = 0  # OpenVINO's request ids are integers
        self._made: dict[str, list] = {}  # request id -> [new ids, reason, logprobs] not sent yet
        self._logprobs: set[str] = set()  # requests that asked for logprobs
        self._ignored: list[str] = []
        self._steps: list[tuple[int, bool]] = []  # (batch size, prefill) of each step not reported
        self._urgent = False  # a first token or an end among them: send now
        self._sent_at = 0.0
        self._seen: set[str] = set()  # requests that have had their first token

    def serve(self) -> None:
        while True:
            if not self.handles:
                self._send()
                self.conn.poll(None)  # idle: sleep until the worker sends something
            while self.conn.poll():
                message = self.conn.recv()
                if message[0] == "close":
                    return
                self._command(*message)
            if self.handles:
                self._step()
                if self._urgent or time.monotonic() - self._sent_at >= self.interval_s:
                    self._send()

    def _command(self, kind: str, request_id: str, *args) -> None:
        if kind == "cancel":
            handle = self.handles.pop(request_id, None)
            if handle is not None:
                handle.cancel()
            self._made.pop(request_id, None)
            self._seen.discard(request_id)
            self._logprobs.discard(request_id)
            return
        import numpy as np
        import openvino as ov

        from worker.engine.openvino_engine import generation_config

        prompt_ids, sampling = args
        try:
            config = generation_config(sampling, self.stop_token_ids, self.lookup)
            ids = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
            self.handles[request_id] = self.pipeline.add_request(self._next_id, ids, config)
            self._next_id += 1
            if sampling.logprobs:
                self._logprobs.add(request_id)
        except Exception as exc:  # this request only
            self.conn.send(("refused", request_id, f"OpenVINO rejected the request: {exc}"))

    def _step(self) -> None:
        import openvino_genai as ov

        try:
            self.pipeline.step()
        except Exception as exc:  # engine-level: every request in flight ends
            log.exception("OpenVINO step failed")
            for handle in self.handles.values():
                handle.cancel()
            self.handles.clear()
            self._made.clear()
            self.conn.send(("failed", f"engine error: {exc}"))
            return
        advanced, prefill = 0, False
        for request_id, handle in list(self.handles.items()):
            if handle.can_read():
                new_ids, reason, logprobs = read_new_tokens(handle)
                made = self._made.setdefault(request_id, [[], None, [] if request_id in self._logprobs else None])
                advanced += 1
                if request_id not in self._seen:
                    self._seen.add(request_id)
                    prefill = self._urgent = True  # its first token goes out at once
                made[0] += new_ids
                if made[2] is not None:
                    made[2] += logprobs
                if reason is not None:
                    made[1] = reason
                    self._urgent = True
                    del self.handles[request_id]
                    self._seen.discard(request_id)
                    self._logprobs.discard(request_id)
            elif handle.get_status() == ov.GenerationStatus.IGNORED:  # never fits the KV cache
                self._ignored.append(request_id)
                self._urgent = True
                del self.handles[request_id]
                self._seen.discard(request_id)
        if advanced:
            self._steps.append((advanced, prefill))

    def _send(self) -> None:
        if self._made or self._ignored:
            results = [(rid, *made) for rid, made in self._made.items()]
            self.conn.send(("steps", results, self._ignored, self._steps))
        self._made, self._ignored, self._steps = {}, [], []
        self._urgent = False
        self._sent_at = time.monotonic()


def read_new_tokens(handle: Any) -> tuple[list[int], FinishReason | None, list[float]]:
    """A generation handle's token ids since the last read, why it ended (None: running), and
    their logprobs (zeros unless the request's config asked for them)."""
    import openvino_genai as ov

    new_ids: list[int] = []
    logprobs: list[float] = []
    reason = None
    for output in handle.read().values():  # one sequence per request (no beams)
        new_ids += output.generated_ids
        logprobs += output.generated_log_probs
        if output.finish_reason == ov.GenerationFinishReason.LENGTH:
            reason = FinishReason.LENGTH
        elif output.finish_reason != ov.GenerationFinishReason.NONE:
            reason = FinishReason.STOP
    return new_ids, reason, logprobs
