"""OpenVINO GenAI's continuous-batching pipeline behind llmq's engine interface: the CPU default.

`ContinuousBatchingPipeline` schedules, batches (prefill chunked into the running decode steps),
keeps a paged KV cache with prefix reuse and samples, all in C++ that reads int8/int4 weights; on a
CPU that is what decode speed comes down to. This adapter hands it llmq's prompt token ids and
sampling, reads each request's new token ids after every `step()`, and turns them into text with
the shared `output.OutputProcessor`, so every engine answers alike.

This is the worker's side of the process boundary: the pipeline runs in a process of its own
(`openvino_core`, everything that calls OpenVINO), and this side loads neither OpenVINO nor
torch (xgrammar, which imports torch, is loaded only to check a request's JSON schema).
`openvino_gate.AdmissionGate` decides when the core may take each request.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from common.logprobs import engine_refusal
from common.schemas import FinishReason
from worker.engine import child_hygiene
from worker.engine.detokenizer import Decoder, load_tokenizer
from worker.engine.openvino_gate import AdmissionGate
from worker.engine.output import OutputProcessor
from worker.engine.protocol import ContinuationRefused, EngineStats
from worker.engine.sequence import EngineRequest, RequestOutput, TokenLogprobs, model_request

log = logging.getLogger(__name__)


class OpenVINOEngine:
    """The engine protocol (`protocol.Engine`) on OpenVINO GenAI's pipeline in its own process
    (`openvino_core`). A thread here receives each of the core's steps and wakes the engine loop;
    `step` turns what came into llmq's outputs without waiting for the core."""

    def __init__(self, process: Any, conn: Any, tokenizer: Decoder, info: dict[str, Any]):
        self.process = process
        self.conn = conn
        self.tokenizer = tokenizer
        self.info = info
        self.stats = EngineStats()
        self.processor = OutputProcessor(tokenizer, self.stats)  # the pipeline reports EOS as its own reason
        self.gate = AdmissionGate(info.get("kv_capacity_tokens") or 0)  # requests wait here for the core
        self._received: queue.Queue = queue.Queue()
        self._grammars: dict[str, str] = {}  # request id -> its JSON grammar (EBNF), until sent to the core
        self._wake = lambda: None
        self._closing = False
        threading.Thread(target=self._receive, name="openvino-core-outputs", daemon=True).start()

    @classmethod
    def from_source(cls, source: Path, model_dir: Path, settings, info: dict[str, Any]) -> "OpenVINOEngine":
        """Start the core on `source` (a GGUF file or an IR folder); RuntimeError if it cannot
        load it. The core dies with this process (`child_hygiene`), SIGKILL included."""
        import multiprocessing
        import multiprocessing.util

        from worker.engine.openvino_core import run_core

        started = time.monotonic()
        child_hygiene.install()
        context = multiprocessing.get_context("spawn")
        conn, child_conn = context.Pipe()
        process = context.Process(target=run_core, args=(Path(source), Path(model_dir), settings, child_conn),
                                  name="openvino-core", daemon=True)
        process.start()
        child_conn.close()
        tokenizer = load_tokenizer(model_dir)  # while the core compiles the model, on another core
        try:
            kind, detail = conn.recv()
        except EOFError:
            kind, detail = "error", f"the OpenVINO core exited with code {process.join(5) or process.exitcode}"
        if kind != "ready":
            raise RuntimeError(detail)
        info = {**info, **detail, "load_s": round(time.monotonic() - started, 2)}
        log.info("OpenVINO pipeline ready on %s in %.1f s: %s", source, info["load_s"], info)
        engine = cls(process, conn, tokenizer, info)
        # A process that exits without closing its engine (a test, a bench) must still end its core,
        # which ignores SIGTERM: `close` has to run before multiprocessing's exit handler joins the
        # core. atexit runs the last registered first, but multiprocessing moves its handler last
        # again the first time anything calls `multiprocessing.util.get_logger()`; calling it first
        # makes that move happen now. (Celery's logging set-up registers billiard's exit handler
        # after this one too, which is why a worker closes its engine itself: worker/__main__.py.)
        multiprocessing.util.get_logger()
        atexit.register(engine.close)
        return engine

    # --- requests -------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """A continued request runs with its generated tokens after its prompt; one with JSON
        output is refused (`ContinuationRefused`): the pipeline's structured output constrains a
        request's output from its start, and cannot be advanced over tokens given in the prompt."""
        detok = self.processor.check_new(request)
        if request.continued is not None and request.sampling.response_format is not None:
            raise ContinuationRefused("OpenVINO GenAI cannot continue structured output from generated tokens")
        model = model_request(request)
        capacity = self.info.get("kv_capacity_tokens")
        if capacity and len(model.prompt_token_ids) >= capacity:
            raise ValueError(f"the prompt ({len(model.prompt_token_ids)} tokens) does not fit the "
                             f"KV cache ({capacity} tokens; LLMQ_KV_CACHE_MB)")
        grammar = None
        if request.sampling.response_format is not None:
            # made here, where a schema no grammar enforces is refused, and handed to the core as
            # text: only this process loads xgrammar (and the torch it imports), once
            from worker.engine.structured import json_grammar_ebnf

            grammar = json_grammar_ebnf(request.sampling.response_format)
        if request.sampling.logprobs and (reason := engine_refusal("openvino", request.sampling.top_logprobs)):
            raise ValueError(reason)
        if grammar is not None:
            self._grammars[request.request_id] = grammar
        self.processor.add(request, detok)
        self.gate.wait(model)
        self._send_admitted()

    def abort_request(self, request_id: str) -> None:
        self._grammars.pop(request_id, None)
        if self.processor.cancel(request_id) and not self.gate.withdraw(request_id):
            self.conn.send(("cancel", request_id))

    def _send_admitted(self) -> None:
        """Hand the core the requests the gate lets through (see `openvino_gate` for why it waits)."""
        for request in self.gate.admit():
            self.conn.send(("add", request.request_id, list(request.prompt_token_ids), request.sampling,
                            self._grammars.pop(request.request_id, None)))

    def has_unfinished(self) -> bool:
        return self.processor.has_unfinished()

    def on_ready(self, wake) -> None:
        """Call `wake` whenever the core sends a step's outputs."""
        self._wake = wake

    def ready(self) -> bool:
        """Whether `step` has something to hand out: a cancel, or the core's outputs."""
        return self.processor.has_cancelled() or not self._received.empty()

    # --- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """What the core sent since the last call (blocking for its next step only when nothing
        came yet and requests are running: callers without `on_ready` simply loop on `step`)."""
        outputs = self.processor.take_cancelled()
        messages = []
        if not outputs and len(self.processor) and self._received.empty():
            messages.append(self._received.get())  # wait for the core's next step
        while not self._received.empty():
            messages.append(self._received.get_nowait())
        for message in messages:
            outputs += self._handle(message)
        for out in outputs:
            self.gate.heard(out.request_id, out.finished)
        self._send_admitted()
        return outputs

    def _handle(self, message: tuple) -> list[RequestOutput]:
        kind = message[0]
        if kind == "steps":
            _, results, ignored, steps = message
            for batch_size, prefill in steps:
                self.stats.record_step(batch_size, prefill)
            results = [r for r in results if r[0] in self.processor]  # cancelled ones were reported
            outputs = [self._advance(*result) for result in results]
            return outputs + [self.processor.finish(rid, FinishReason.ERROR, "the prompt does not fit the KV cache "
                                                  "(LLMQ_KV_CACHE_MB)") for rid in ignored if rid in self.processor]
        if kind == "refused":
            _, rid, error = message
            return [self.processor.finish(rid, FinishReason.ERROR, error)] if rid in self.processor else []
        log.error("OpenVINO step failed; failing %d requests", len(self.processor))
        return self.processor.fail_all(message[1])  # "failed"

    def _advance(self, request_id: str, new_ids: list[int], reason: FinishReason | None,
                 logprobs: list[float] | None = None) -> RequestOutput:
        computed = [TokenLogprobs(lp) for lp in logprobs] if logprobs is not None else None
        out = self.processor.advance(request_id, new_ids, reason, computed)
        if out.finished and reason is None:  # a stop string: the core would go on without us
            self.conn.send(("cancel", request_id))
        return out

    def fail_all(self, message: str) -> list[RequestOutput]:
        for request_id in self.gate.clear():
            self.conn.send(("cancel", request_id))
        return self.processor.fail_all(message)

    def _receive(self) -> None:
        """The core's messages, in order, to `step`; each one wakes the engine loop. A core that
        dies takes the worker with it, as vLLM's server goes when its engine core does: its jobs
        are then handed to another worker (their leases lapse) rather than failed here."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                if not (self._closing or child_hygiene.EXITING.is_set()):
                    child_hygiene.exit_for_redelivery(
                        f"the OpenVINO core process died (exit code {self.process.exitcode})", len(self.processor))
                return
            self._received.put(message)
            self._wake()

    def close(self) -> None:
        """Stop the core: the worker calls this once its jobs are done. The core ignores SIGTERM
        (openvino_core.run_core), so without it multiprocessing's exit handler, which terminates
        daemonic children and joins them, would wait for the core forever."""
        if self.conn.closed:
            return
        self._closing = True
        try:
            self.conn.send(("close",))
        except OSError:
            pass  # already gone
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
