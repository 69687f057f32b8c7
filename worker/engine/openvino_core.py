"""OpenVINO GenAI's pipeline in a process of its own: the engine core of the OpenVINO engine.

openvino-genai's Python binding holds the GIL for the whole of `ContinuousBatchingPipeline.step()`,
so in the worker's process every job thread (the text relay to Redis, Celery's threads) would wait
for each step to end. Here the pipeline steps in a child process, as vLLM's engine core does: the
worker sends it requests and cancels over a pipe, and it sends back each step's new token ids, and
steps again at once while it has work. Only token ids cross; text is made in the worker.
Everything that calls OpenVINO is here: building the pipeline, llmq's sampling as OpenVINO's
`GenerationConfig`, reading each request's new tokens. The worker's side, `openvino_engine`,
starts this process and imports nothing else of it.

The core sends what its steps made in bunches, every `stream_interval_ms` (the interval at which
the worker relays text anyway), and at once when a request gets its first token or ends. Each
message wakes threads of the worker, and on a small CPU every wake-up takes a core from the
pipeline's compute threads for a moment, which all of them then wait for: one message a step
made a single stream markedly slower than the pipeline alone (docs/benchmarks.md).

Messages to the core: ("add", request_id, prompt_ids, sampling, grammar), ("cancel", request_id),
("close",); `grammar` is the EBNF text a request's JSON output must follow (the worker makes it
from `sampling.response_format`), else None.
From it: ("ready", info) once, then ("steps", [(request_id, new_ids, reason, logprobs)], ignored_ids,
[(batch_size, prefill)] per step), ("refused", request_id, message) for a request it could not
take, ("failed", message) when a step raised. `reason` is None while a request runs, else a
`FinishReason` (STOP or LENGTH); `logprobs` the new tokens' logprobs for a request that asked
for them (`Sampling.logprobs`), else None.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from common.schemas import FinishReason
from worker.engine.model_config import eos_token_ids, kv_bytes_per_token
from worker.engine.sequence import Sampling

log = logging.getLogger(__name__)

BLOCK_TOKENS = 32  # tokens per KV block of OpenVINO's CPU plugin
_PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_PRECISION_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def run_core(source: Path, model_dir: Path, settings, conn: Connection) -> None:
    """The child's main loop (target of a spawned process; ends when the pipe closes).

    The core ignores SIGTERM and SIGINT: a process manager stopping the worker signals its whole
    group (compose, systemd, Ctrl-C), and a core that died at once would cut the worker's warm
    shutdown short with the jobs it is finishing. The core ends when the worker closes the pipe,
    or with the worker itself (child_hygiene binds it with PDEATHSIG, SIGKILL)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
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

        prompt_ids, sampling, grammar = args
        try:
            config = generation_config(sampling, self.stop_token_ids, self.lookup, grammar)
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


# --- the pipeline in OpenVINO's terms (also used by bench/openvino_server.py and weights_quality.py)
def kv_block_bytes(model_dir: Path, kv_precision: str) -> int:
    """Bytes of one KV block of this model: keys and values of every layer and KV head."""
    return kv_bytes_per_token(model_dir, _PRECISION_BYTES[kv_precision]) * BLOCK_TOKENS


def plugin_properties(dtype: str, cpus: int, activation_group: int | None = None) -> dict[str, Any]:
    """The CPU plugin's settings: one thread per core of the worker's CPU set, and llmq's dtype as
    the precision of both the compute and the KV cache ('auto': bf16 where the CPU has native
    BF16, else f32, as llmq's auto). The plugin's own KV default, u8, is a few per cent faster,
    but a quantized cache made a seeded (or greedy) request's answer depend on what else was in
    the batch: the same request twice gave two answers (docs/engines.md). With int8/int4 weights
    the plugin quantizes activations to int8 too, in groups of `activation_group` values (None:
    its default); float32 keeps them in f32 whatever the group, for results that must match a
    float reference."""
    precision = _PRECISIONS.get(dtype) or default_precision()
    props: dict[str, Any] = {"INFERENCE_NUM_THREADS": cpus, "INFERENCE_PRECISION_HINT": precision,
                             "KV_CACHE_PRECISION": precision}
    if dtype == "float32":
        props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
    elif activation_group is not None:
        props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = activation_group
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


def generation_config(sampling: Sampling, stop_token_ids: set[int], lookup: tuple[int, int] | None = None,
                      grammar: str | None = None) -> Any:
    """llmq's `Sampling` as OpenVINO's `GenerationConfig`. Stop strings are applied by llmq (see
    `output`); a request without a seed gets a random one, since OpenVINO's default seed would
    make every unseeded sampled request alike. A pipeline built with prompt lookup refuses any
    request whose config lacks its draft length and n-gram size (`lookup`), so every request there
    carries them: it cannot opt out. `grammar` (EBNF, from `structured.json_grammar_ebnf`: the
    HF engine's grammar, compact JSON with no free whitespace) constrains the output."""
    import openvino_genai as ov

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
    if grammar is not None:
        config.structured_output_config = ov.StructuredOutputConfig(grammar=grammar)
    return config


def build_pipeline(source: Path, model_dir: Path, settings) -> tuple[Any, dict[str, Any]]:
    """The pipeline on `source` (a GGUF file or an IR folder), sized by llmq's settings, and what
    the heartbeat says of it. `model_dir` is the model's Hugging Face folder (its config sizes
    the KV cache)."""
    import openvino_genai as ov

    cpus = len(os.sched_getaffinity(0))
    props = plugin_properties(settings.dtype, cpus, settings.openvino_activation_group)
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
            "step_tokens": scheduler.max_num_batched_tokens, "prefix_caching": scheduler.enable_prefix_caching,
            "dtype": compute_dtype(props), "threads": cpus,
            "activation_group": props.get("DYNAMIC_QUANTIZATION_GROUP_SIZE", "default"),
            "prompt_lookup": {"tokens": lookup[0], "ngram": lookup[1]} if lookup else False}
    return pipeline, info
