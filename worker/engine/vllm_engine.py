"""The GPU engine: vLLM's engine behind llmq's engine interface (`LLMEngine`'s methods).

`LLMEngine` (CPU) and `VLLMEngine` (GPU) both offer `add_request`, `abort_request`,
`has_unfinished`, `step() -> list[RequestOutput]` and `stats`, so `EngineLoop`, the job runner and
the metrics do not know which one runs. vLLM does the scheduling, paged KV cache and sampling;
this adapter asks vLLM for token-id deltas only (no text: vLLM's own detokenizer would be a
second one) and turns them into llmq's per-step text deltas with our own
`IncrementalDetokenizer`, so stop strings and UTF-8 handling match the CPU engine exactly (a stop
string found here aborts the vLLM request).

vLLM is imported only when an engine is built (`LLMQ_ENGINE=vllm`), never at module import, so the
rest of llmq installs and runs without it. Tests pass a fake `core` to check the adaptation logic
on machines without a GPU.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from worker.engine.detokenizer import Decoder, load_tokenizer
from worker.engine.engine import EngineStats
from worker.engine.sequence import EngineRequest, RequestOutput, Sampling
from worker.engine.tracked import TrackedRequests

log = logging.getLogger(__name__)

_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


def vllm_sampling_params(sampling: Sampling) -> Any:
    """llmq's `Sampling` as vLLM `SamplingParams`. Stop strings are applied by us, not by vLLM;
    `response_format` goes to vLLM's structured outputs (xgrammar, as in the HF engine). vLLM
    returns each step's new token ids only and does not detokenize: the adapter does that once."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    kwargs: dict[str, Any] = dict(max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                                  top_p=sampling.top_p, seed=sampling.seed,
                                  presence_penalty=sampling.presence_penalty,
                                  frequency_penalty=sampling.frequency_penalty,
                                  detokenize=False, output_kind=RequestOutputKind.DELTA)
    if sampling.top_k > 0:  # leave vLLM's own "disabled" default otherwise (-1 or 0 by version)
        kwargs["top_k"] = sampling.top_k
    fmt = sampling.response_format
    if fmt is not None:
        constraint = {"json": fmt.schema} if fmt.kind == "json_schema" and fmt.schema else {"json_object": True}
        kwargs["structured_outputs"] = StructuredOutputsParams(**constraint)
    return SamplingParams(**kwargs)


def vllm_dtype(name: str) -> str:
    """llmq's dtype setting as vLLM's: the same choice the HF engine makes, so float32 stays
    float32 (vLLM's own "auto" would run bfloat16 on CPU) and "auto" means bfloat16 only where the
    CPU computes it natively."""
    import torch

    from worker.engine.runner_hf import resolve_dtype

    if name == "auto" and torch.cuda.is_available():
        return "auto"  # the model's own dtype on a GPU
    return str(resolve_dtype(name)).removeprefix("torch.")


def cpu_binding_env(cpus: set[int], reserved: int) -> dict[str, str]:
    """vLLM's CPU thread binding, taken from the worker's CPU set rather than the whole machine:
    its compute threads go to the compute cores (`worker.pinning.service_and_compute`), and the
    `reserved` service cores are left to everything else llmq runs beside the model: vLLM's own
    scheduler process, the worker's job threads writing text to Redis, and on a small machine the
    API and Redis. With none reserved those preempt the compute threads now and then, and the
    lock-step matrix work waits for the slowest one; but on a 2-core worker a reserved core is half
    the compute, and once the relay writes in bunches (`stream_interval_ms`) that costs far more
    (Qwen2.5-0.5B size, 16 clients: 1.4x the tokens/s with both cores computing). So by default
    nothing is reserved."""
    from worker.pinning import format_cpus, service_and_compute

    _, compute = service_and_compute(cpus, reserved)
    return {"VLLM_CPU_OMP_THREADS_BIND": format_cpus(compute),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": str(len(cpus) - len(compute))}


def keep_off_the_compute_cores(reserved: int) -> None:
    """Once vLLM runs on CPU with cores reserved (`vllm_cpu_reserved_cores`): every thread of
    this process (the job threads and their Redis writes, Celery's, the engine loop) moves to the
    service cores, off the compute cores where vLLM bound its compute threads. Left to float,
    they land on the compute core whenever the service core is busy, and each time they do, the
    model's step waits (about 4% of tokens/s on 2 cores). With nothing reserved there is nowhere
    else to go, and nothing moves.

    vLLM's own processes stay where vLLM put them, as under vLLM's own server: the compute process
    on the compute cores, the engine core free to run on any core of the worker. Between steps the
    compute process only waits, yielding its core, and that is exactly when the engine core must
    schedule the next step while the relay keeps the service core busy; confined to the service
    core it waited for the relay instead (interleaved, 135M model, against vLLM's own server:
    0.94x / 0.96x / 0.97x at 1 / 8 / 16 clients free, 0.94x / 0.94x / 0.95x confined).

    It changes the whole process's placement, so the worker's entry point calls it, not the
    engine (which tests also build inside the test process)."""
    import torch

    from worker.pinning import confine_to, service_and_compute

    if torch.cuda.is_available():
        return
    service, compute = service_and_compute(os.sched_getaffinity(0), reserved)
    if service == compute:
        return
    moved = confine_to(service, compute, [os.getpid()])
    log.info("vLLM computes on cores %s; %d worker threads moved to service cores %s", compute, moved, service)


def yield_to_the_engine_core(nice: int) -> None:
    """Once vLLM runs on CPU: this process's own threads (the job threads relaying tokens to
    Redis, Celery's, the engine loop's) take niceness `nice`; vLLM's processes keep theirs.

    Each decode step waits on vLLM's engine core, which schedules the next step on a service core
    as soon as the last one's tokens are out. That is exactly when the job threads wake to write
    those tokens, with the API relaying them beside, and with equal priority the kernel shares the
    core between them and every step waits (16 clients on 2 cores: 0.80x of vLLM's own server's
    tokens/s at equal priority, 0.95x at niceness 10).
    The relay can lose a few milliseconds without anyone noticing; the step cannot. vLLM's
    children were started before this, so they keep the priority the worker started with.
    That holds with a core reserved for the relay and the engine core. With vLLM computing on
    every core (the default) the relay had to wait for the compute threads instead, and each job
    ended later: 135M at 8 / 16 clients, 310 / 544 tokens/s at niceness 10 against 338 / 591 at 0,
    so the default is 0."""
    import torch

    from worker.pinning import lower_priority

    if torch.cuda.is_available() or nice <= 0:
        return
    changed = lower_priority(os.getpid(), nice)
    log.info("worker threads at niceness %d (%d changed), below vLLM's engine core", nice, changed)


def relay_delay_s(settings) -> float:
    """How long each step's tokens wait in the worker before they are relayed (CPU only).

    vLLM's engine core sends a step's tokens out and only then schedules the next step. Between
    steps it waits for the compute process by spinning on `sched_yield`, and each yield hands its
    turn to any runnable thread on the core, whatever their niceness. So the relay that the tokens
    wake (vLLM's output thread here, the job threads, Redis, the API) runs first, and the next step
    starts only when the relay is done: every step is longer by the relay's time. Holding the
    tokens a moment leaves the core to the engine core while it schedules; the relay then runs
    while the next step computes. Interleaved on the 135M model at 16 clients, against vLLM's own
    server: 0.91x without the delay, 0.93x at 2 ms, 0.95x at 5 ms (a token reaches its client 5 ms
    later; no change for a single client). Those runs carried the wrapper frame that made vLLM's
    steps 10% longer (see `child_hygiene`); without it the delay no longer paid (16 clients: 0.98x
    at 5 ms, 0.99x without), so it is off by default and kept as a knob for other hosts."""
    import torch

    if settings is None or torch.cuda.is_available():
        return 0.0
    return settings.vllm_relay_delay_ms / 1000


def build_vllm_core(model_path: str, settings) -> Any:
    """vLLM's synchronous `LLMEngine`, sized by llmq's settings (KV memory, batch, context, dtype).

    vLLM runs its engine core (and on CPU its executor) in child processes; `child_hygiene` ties
    them to this worker so that none outlives it, SIGKILL included. On CPU the children bind their
    threads to the worker's CPU set."""
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.update(cpu_binding_env(os.sched_getaffinity(0), settings.vllm_cpu_reserved_cores))
    from worker.engine import child_hygiene

    child_hygiene.install()
    from vllm import EngineArgs, LLMEngine as VllmLLMEngine

    kv_bytes = None if on_gpu else settings.kv_cache_mb * 2**20
    args = EngineArgs(model=str(model_path), dtype=vllm_dtype(settings.dtype),
                      max_model_len=settings.max_model_len, max_num_seqs=settings.max_batch_size,
                      gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
                      kv_cache_memory_bytes=kv_bytes, enable_prefix_caching=settings.prefix_cache_mb > 0,
                      enforce_eager=settings.vllm_enforce_eager, seed=0, disable_log_stats=True)
    return VllmLLMEngine.from_engine_args(args)


def describe_core(core: Any) -> dict[str, Any]:
    """What the heartbeat reports of this engine: dtype and KV capacity in tokens."""
    config = getattr(core, "vllm_config", None)
    if config is None:  # a test double
        return {}
    cache = config.cache_config
    blocks = cache.num_gpu_blocks or 0
    return {"dtype": str(config.model_config.dtype).removeprefix("torch."),
            "kv_capacity_tokens": blocks * cache.block_size, "prefix_caching": bool(cache.enable_prefix_caching)}


class VLLMEngine:
    """Same interface as `worker.engine.engine.LLMEngine`, backed by vLLM."""

    def __init__(self, model_path, settings=None, *, core: Any = None, tokenizer: Decoder | None = None,
                 sampling_params=vllm_sampling_params):
        if core is None:
            started = time.monotonic()
            log.info("starting vLLM on %s (dtype %s, KV %s MB); this takes 20-90 s", model_path,
                     vllm_dtype(settings.dtype), settings.kv_cache_mb)
            core = build_vllm_core(model_path, settings)
            log.info("vLLM ready in %.1f s: %s", time.monotonic() - started, describe_core(core))
        self.core = core
        self.info = describe_core(core)
        self.tokenizer = tokenizer or load_tokenizer(model_path)
        self.sampling_params = sampling_params
        self.stats = EngineStats()
        self.relay_delay_s = relay_delay_s(settings)
        self._tracked = TrackedRequests(self.tokenizer, self.stats)
        self._cancelled: list[str] = []
        self._outputs_queue = None  # vLLM's queue of engine-core outputs, once `on_ready` found it

    # --- requests -------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        self._tracked.check_new(request)
        try:
            self.core.add_request(request.request_id, {"prompt_token_ids": list(request.prompt_token_ids)},
                                  self.sampling_params(request.sampling))
        except Exception as exc:  # vLLM refused this request (e.g. too long): fail it alone
            raise ValueError(f"vLLM rejected the request: {exc}") from exc
        self._tracked.add(request)

    def abort_request(self, request_id: str) -> None:
        """Remove it from vLLM now; the next `step` reports it finished with reason 'cancelled'."""
        if request_id in self._tracked:
            self.core.abort_request([request_id])
            self._cancelled.append(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._tracked) or bool(self._cancelled)

    def on_ready(self, wake) -> None:
        """Call `wake` whenever vLLM's engine core delivers a step's outputs.

        vLLM's engine core runs its steps in its own process; its client here receives each
        step's outputs on a thread of its own and queues them, and `LLMEngine.step` blocks on
        that queue. A loop blocked there could not hand over a request that arrives meanwhile:
        the engine core would schedule the next step without it, and every new request would
        wait one step more than with vLLM's own server (about 1% of tokens/s, and of TTFT).
        So the queue also wakes the loop, which then waits for either. Where vLLM has no such
        queue (another client, a test double), `step` simply blocks as before."""
        outputs_queue = getattr(getattr(self.core, "engine_core", None), "outputs_queue", None)
        if outputs_queue is None:
            return
        put_nowait = outputs_queue.put_nowait

        def put_and_wake(item):
            put_nowait(item)
            wake()
        outputs_queue.put_nowait = put_and_wake  # vLLM's receiving thread calls this per step
        self._outputs_queue = outputs_queue

    def ready(self) -> bool:
        """Whether `step` can run without waiting: a cancel to report, or vLLM's next outputs in."""
        return bool(self._cancelled) or not self._step_running()

    def _step_running(self) -> bool:
        """vLLM's engine core is still computing the next step (known only once `on_ready` found
        its outputs queue; without it, `step` blocks until the outputs come)."""
        return self._outputs_queue is not None and self._outputs_queue.empty()

    # --- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = [self._tracked.finish(rid, "cancelled") for rid in dict.fromkeys(self._cancelled)
                   if rid in self._tracked]
        self._cancelled.clear()
        if not self._tracked or self._step_running():
            return outputs  # nothing more, or vLLM's step is still running: do not block on it
        try:
            results = self.core.step()
        except Exception as exc:  # engine-level failure: fail every in-flight request
            log.exception("vLLM step failed; failing %d requests", len(self._tracked))
            return outputs + self.fail_all(f"engine error: {exc}")
        results = [r for r in results if r.request_id in self._tracked]
        if results:
            if self.relay_delay_s:
                time.sleep(self.relay_delay_s)  # the engine core's turn first: see `relay_delay_s`
            self._record(len(results), prefill=any(self._tracked.is_new(r.request_id) for r in results))
        for result in results:
            outputs.append(self._advance(result))
        return outputs

    def _advance(self, result: Any) -> RequestOutput:
        completion = result.outputs[0]  # this step's tokens only (RequestOutputKind.DELTA)
        reason = _REASONS.get(completion.finish_reason or "stop", "stop") if result.finished else None
        out = self._tracked.advance(result.request_id, list(completion.token_ids), reason)
        if out.finished and reason is None:  # a stop string: vLLM would go on without us
            self.core.abort_request([result.request_id])
        return out

    def fail_all(self, message: str) -> list[RequestOutput]:
        if len(self._tracked):
            self.core.abort_request(self._tracked.ids())
        return self._tracked.fail_all(message)

    def _record(self, batch_size: int, prefill: bool) -> None:
        """vLLM does not report its batch; the requests that advanced this step stand for it."""
        self.stats.record_step(batch_size, prefill)
