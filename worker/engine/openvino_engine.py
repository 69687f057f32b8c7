"""OpenVINO GenAI's continuous-batching pipeline behind llmq's engine interface: the CPU default.

`ContinuousBatchingPipeline` schedules, batches (prefill chunked into the running decode steps),
keeps a paged KV cache with prefix reuse and samples, all in C++ that reads int8/int4 weights; on a
CPU that is what decode speed comes down to. This adapter hands it llmq's prompt token ids and
sampling, reads each request's new token ids after every `step()`, and turns them into text with
the shared `output.OutputProcessor`, so every engine answers alike.

`openvino_genai` is imported only when an engine is built, never at module import.
"""
from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import queue
import random
import threading
import time
from pathlib import Path
from typing import Any

from common.logprobs import engine_refusal
from common.schemas import FinishReason
from worker.engine import child_hygiene
from worker.engine.detokenizer import Decoder, load_tokenizer
from worker.engine.output import OutputProcessor
from worker.engine.protocol import ContinuationRefused, EngineStats
from worker.engine.sequence import EngineRequest, RequestOutput, Sampling, TokenLogprobs, model_request

log = logging.getLogger(__name__)

BLOCK_TOKENS = 32  # tokens per KV block of OpenVINO's CPU plugin
_PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


SHARED_START_TOKENS = 256  # prompts that agree on this many first tokens share a prefix worth waiting for
WARM_STARTS = 256  # prompt starts remembered as prefilled (likely still in the prefix cache): none waits on them


def prompt_start(prompt_token_ids) -> tuple[int, ...] | None:
    """A long prompt's first tokens: what a request waits on while another with the same start
    prefills (None: too short to be worth a wait)."""
    if len(prompt_token_ids) <= SHARED_START_TOKENS:
        return None
    return tuple(prompt_token_ids[:SHARED_START_TOKENS])


def kv_block_bytes(model_dir: Path, kv_precision: str) -> int:
    """Bytes of one KV block of this model: keys and values of every layer and KV head."""
    import torch

    from worker.engine.kv_cache import SlotKVCache

    config = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[kv_precision]
    return SlotKVCache.bytes_per_token(config["num_hidden_layers"], kv_heads, head_dim, dtype) * BLOCK_TOKENS


def eos_token_ids(model_dir: Path) -> set[int]:
    """The ids that end generation, as the HF engine reads them (generation_config.json, else
    config.json), so every engine stops on the same tokens."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids |= set(value if isinstance(value, list) else [value]) - {None}
            if ids:
                return ids
    return ids


def plugin_properties(dtype: str, cpus: int) -> dict[str, Any]:
    """The CPU plugin's settings: one thread per core of the worker's CPU set, and llmq's dtype as
    the precision of both the compute and the KV cache ('auto': bf16 where the CPU has native
    BF16, else f32, as llmq's auto). The plugin's own KV default, u8, is a few per cent faster,
    but a quantized cache made a seeded (or greedy) request's answer depend on what else was in
    the batch: the same request twice gave two answers (docs/engines.md). float32 also keeps the
    activations in f32 (the plugin quantizes them to int8 for int8/int4 weights), for results that
    must match a float reference."""
    precision = _PRECISIONS.get(dtype) or default_precision()
    props: dict[str, Any] = {"INFERENCE_NUM_THREADS": cpus, "INFERENCE_PRECISION_HINT": precision,
                             "KV_CACHE_PRECISION": precision}
    if dtype == "float32":
        props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
    return props


def default_precision() -> str:
    """The CPU plugin's compute precision on this CPU: 'bf16' where native, else 'f32'."""
    import openvino as ov

    return ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()


def compute_dtype(props: dict[str, Any]) -> str:
    """The precision the plugin computes in, in llmq's words."""
    precision = props["INFERENCE_PRECISION_HINT"]
    return {short: name for name, short in _PRECISIONS.items()}.get(precision, precision)


def prompt_lookup(settings) -> tuple[int, int] | None:
    """(draft tokens per step, longest n-gram matched) when the pipeline drafts from the prompt."""
    return (settings.prompt_lookup_tokens, settings.prompt_lookup_ngram) if settings.prompt_lookup else None


def generation_config(sampling: Sampling, stop_token_ids: set[int], lookup: tuple[int, int] | None = None) -> Any:
    """llmq's `Sampling` as OpenVINO's `GenerationConfig`. Stop strings are applied by llmq (see
    `output`); a request without a seed gets a random one, since OpenVINO's default seed would
    make every unseeded sampled request alike. A pipeline built with prompt lookup refuses any
    request whose config lacks its draft length and n-gram size (`lookup`), so every request there
    carries them: it cannot opt out."""
    import openvino_genai as ov

    from worker.engine.structured import json_grammar_ebnf

    config = ov.GenerationConfig()
    config.max_new_tokens = sampling.max_tokens
    config.stop_token_ids = set(stop_token_ids)
    config.presence_penalty = sampling.presence_penalty
    config.frequency_penalty = sampling.frequency_penalty
    if sampling.temperature > 0:
        config.do_sample = True
        config.temperature = sampling.temperature
        config.top_p = sampling.top_p
        if sampling.top_k > 0:
            config.top_k = sampling.top_k
        config.rng_seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
    else:
        config.do_sample = False
    if sampling.logprobs:
        config.logprobs = 1  # the chosen token's logprob: all the pipeline computes
    if lookup is not None:
        config.num_assistant_tokens, config.max_ngram_size = lookup
    if sampling.response_format is not None:  # the HF engine's grammar: compact JSON, no free whitespace
        config.structured_output_config = ov.StructuredOutputConfig(
            grammar=json_grammar_ebnf(sampling.response_format))
    return config


def build_pipeline(source: Path, model_dir: Path, settings) -> tuple[Any, dict[str, Any]]:
    """The pipeline on `source` (a GGUF file or an IR folder), sized by llmq's settings, and what
    the heartbeat says of it. `model_dir` is the model's Hugging Face folder (its config sizes
    the KV cache)."""
    import openvino_genai as ov

    cpus = len(os.sched_getaffinity(0))
    props = plugin_properties(settings.dtype, cpus)
    block_bytes = kv_block_bytes(model_dir, props["KV_CACHE_PRECISION"])
    scheduler = ov.SchedulerConfig()
    scheduler.num_kv_blocks = max(1, settings.kv_cache_mb * 2**20 // block_bytes)
    scheduler.max_num_seqs = settings.max_batch_size
    scheduler.max_num_batched_tokens = max(settings.max_prefill_tokens, settings.max_batch_size)
    scheduler.dynamic_split_fuse = True  # long prompts are prefilled in chunks beside running decodes
    scheduler.enable_prefix_caching = settings.prefix_cache_mb > 0
    lookup = prompt_lookup(settings)
    # prompt lookup is the pipeline's kind (its scheduler verifies drafts), chosen once here
    pipeline = ov.ContinuousBatchingPipeline(str(source), scheduler, "CPU",
                                             {**props, "prompt_lookup": True} if lookup else props)
    info = {"kv_capacity_tokens": scheduler.num_kv_blocks * BLOCK_TOKENS,
            "prefix_caching": scheduler.enable_prefix_caching, "dtype": compute_dtype(props), "threads": cpus,
            "prompt_lookup": {"tokens": lookup[0], "ngram": lookup[1]} if lookup else False}
    return pipeline, info


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
        self._received: queue.Queue = queue.Queue()
        self._reserved: dict[str, int] = {}  # in the core: request id -> KV tokens it may come to use
        self._waiting: collections.deque[EngineRequest] = collections.deque()  # held until they fit
        self._prefilling: dict[str, tuple[int, ...]] = {}  # in the core, no token yet: id -> prompt start
        self._warm: collections.OrderedDict[tuple[int, ...], None] = collections.OrderedDict()  # prefilled starts
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
        try:
            kind, detail = conn.recv()
        except EOFError:
            kind, detail = "error", f"the OpenVINO core exited with code {process.join(5) or process.exitcode}"
        if kind != "ready":
            raise RuntimeError(detail)
        info = {**info, **detail, "load_s": round(time.monotonic() - started, 2)}
        log.info("OpenVINO pipeline ready on %s in %.1f s: %s", source, info["load_s"], info)
        engine = cls(process, conn, load_tokenizer(model_dir), info)
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
        from worker.engine.structured import json_grammar

        detok = self.processor.check_new(request)
        if request.continued is not None and request.sampling.response_format is not None:
            raise ContinuationRefused("OpenVINO GenAI cannot continue structured output from generated tokens")
        model = model_request(request)
        capacity = self.info.get("kv_capacity_tokens")
        if capacity and len(model.prompt_token_ids) >= capacity:
            raise ValueError(f"the prompt ({len(model.prompt_token_ids)} tokens) does not fit the "
                             f"KV cache ({capacity} tokens; LLMQ_KV_CACHE_MB)")
        if request.sampling.response_format is not None:
            json_grammar(request.sampling.response_format)  # a schema no grammar enforces: refused here
        if request.sampling.logprobs and (reason := engine_refusal("openvino", request.sampling.top_logprobs)):
            raise ValueError(reason)
        self.processor.add(request, detok)
        self._waiting.append(model)
        self._send_what_fits()

    def abort_request(self, request_id: str) -> None:
        if self.processor.cancel(request_id):
            waiting = next((r for r in self._waiting if r.request_id == request_id), None)
            if waiting is not None:
                self._waiting.remove(waiting)
            else:
                self.conn.send(("cancel", request_id))

    def _send_what_fits(self) -> None:
        """Hand the core the waiting requests, oldest first, while each one's prompt and longest
        answer fit the KV cache beside those it runs. The pipeline does not wait for room: a
        request its cache cannot grow into is dropped (IGNORED) mid-answer, so a burst of long
        prompts on a small `LLMQ_KV_CACHE_MB` would fail jobs that need only wait. Counting
        every request's whole length ignores the blocks prompts share, so it holds back a little
        early; one request alone always goes.

        A request whose prompt starts like one the core is still prefilling waits for that one's
        first token (the requests behind it go on): the pipeline looks up its prefix cache only
        when it takes a request in, so a burst of prompts with one long system prompt would
        otherwise compute it once per request, several seconds on one core. A start prefilled
        once is remembered, and later requests with it go at once."""
        capacity = self.info.get("kv_capacity_tokens") or 0
        prefilling = set(self._prefilling.values())
        for request in list(self._waiting):
            start = prompt_start(request.prompt_token_ids)
            if start in self._warm:
                start = None  # computed already: nothing to wait for
            elif start is not None and start in prefilling:
                continue
            need = len(request.prompt_token_ids) + request.sampling.max_tokens
            if self._reserved and capacity and sum(self._reserved.values()) + need > capacity:
                return
            self._waiting.remove(request)
            self._reserved[request.request_id] = need
            if start is not None:
                self._prefilling[request.request_id] = start
                prefilling.add(start)
            self.conn.send(("add", request.request_id, list(request.prompt_token_ids), request.sampling))

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
        ended = {out.request_id for out in outputs if out.finished}
        prefilled = [self._prefilling.pop(out.request_id) for out in outputs if out.request_id in self._prefilling]
        for start in prefilled:
            self._warm[start] = None
            self._warm.move_to_end(start)
            if len(self._warm) > WARM_STARTS:
                self._warm.popitem(last=False)
        for request_id in ended:
            self._reserved.pop(request_id, None)
        if self._waiting and (ended or prefilled):  # an engine failure ends waiting requests too
            self._waiting = collections.deque(r for r in self._waiting if r.request_id not in ended)
            self._send_what_fits()
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
        self._waiting.clear()
        self._prefilling.clear()
        for request_id in self._reserved:
            self.conn.send(("cancel", request_id))
        self._reserved.clear()
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
