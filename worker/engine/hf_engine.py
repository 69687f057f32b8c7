"""The HF engine: schedule -> run the model -> sample, in plain Python and torch.

The reference engine, and the one that serves any model transformers loads. Text, stop strings
and finish reasons come from the shared `output.OutputProcessor`; JSON output (response_format)
is enforced here, by masking logits with an xgrammar matcher per request. A request that
continues an answer (`EngineRequest.continued`) prefills its prompt and the tokens generated
before, its matcher advanced over them: the same tokens a run that was never interrupted decodes.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import torch

from common.schemas import FinishReason
from worker.engine.detokenizer import Decoder
from worker.engine.output import OutputProcessor
from worker.engine.protocol import ContinuationRefused, EngineStats
from worker.engine.sampler import make_generator, raw_logprobs, sample, token_logprobs
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import EngineRequest, RequestOutput, Sequence, TokenLogprobs, model_request

if TYPE_CHECKING:
    from xgrammar import GrammarMatcher

    from worker.engine.structured import StructuredOutput

log = logging.getLogger(__name__)


class ModelRunner(Protocol):
    """What the engine needs from a runner (HF on CPU, or a test double)."""

    eos_token_ids: set[int]

    def prefill(self, request_ids: list[str], prompts: list[list[int]]) -> torch.Tensor: ...
    def decode(self, last_tokens: dict[str, int]) -> torch.Tensor: ...
    def release(self, request_ids: list[str]) -> None: ...

    rows: list[str]


class HFEngine:
    """The engine protocol (`protocol.Engine`) on a `ModelRunner`; the step is the model's own
    computation, so it is always `ready`."""

    def __init__(self, runner: ModelRunner, tokenizer: Decoder, max_batch_size: int = 16,
                 kv_budget_tokens: int = 1 << 20, max_prefill_tokens: int = 1 << 30,
                 structured: StructuredOutput | None = None):
        self.runner = runner
        self.structured = structured  # JSON output (response_format); None: such requests are refused
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(max_batch_size, kv_budget_tokens, max_prefill_tokens,
                                   getattr(runner, "prefill_tokens", len))
        self.stats = EngineStats()
        self.processor = OutputProcessor(tokenizer, self.stats, runner.eos_token_ids)
        self._generators: dict[str, torch.Generator] = {}
        self._seqs: dict[str, Sequence] = {}
        self._matchers: dict[str, GrammarMatcher] = {}  # request id -> its grammar matcher (JSON output)
        self._earlier: dict[str, list[int]] = {}  # a continued request's tokens generated before

    # --- requests -------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        detok = self.processor.check_new(request)
        matcher = self._matcher_for(request)
        seq = Sequence(model_request(request))
        self.scheduler.add(seq)
        if matcher is not None:
            self._matchers[seq.id] = matcher
        if request.continued is not None:  # the penalties count the tokens generated before too
            self._earlier[seq.id] = list(request.continued.token_ids)
        self._seqs[seq.id] = seq
        self._generators[seq.id] = make_generator(request.sampling)
        self.processor.add(request, detok)

    def _matcher_for(self, request: EngineRequest):
        """The request's grammar matcher; for a continued request, advanced over the tokens
        generated before, so the JSON goes on where it stopped."""
        fmt = request.sampling.response_format
        if fmt is None:
            return None
        if self.structured is None:
            raise ValueError("this engine does not support response_format (structured output)")
        matcher = self.structured.matcher(fmt)
        for token in request.continued.token_ids if request.continued else ():
            if not matcher.accept_token(token):
                raise ContinuationRefused(f"token {token} generated before does not fit the grammar")
        return matcher

    def abort_request(self, request_id: str) -> None:
        self.processor.cancel(request_id)

    def has_unfinished(self) -> bool:
        return self.processor.has_unfinished()

    def ready(self) -> bool:
        return True

    def on_ready(self, wake) -> None:
        """Nothing to announce: this engine is always ready."""

    def close(self) -> None:
        """Nothing outlives the process: the model is in it."""

    # --- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = self.processor.take_cancelled()
        for out in outputs:
            self._drop(out)
        batch = self.scheduler.schedule()
        if batch.empty:
            return outputs
        by_id = {seq.id: seq for seq in batch.prefill or batch.decode}
        try:
            logits, order = self._run(batch)
            ordered = [by_id[rid] for rid in order]
            tokens, logprobs = self._sample(logits, ordered)
        except Exception as exc:  # engine-level failure: fail every in-flight request
            log.exception("model step failed; failing %d requests", len(self._seqs))
            return outputs + self.fail_all(f"engine error: {exc}")
        self.stats.record_step(len(self.runner.rows), prefill=bool(batch.prefill))
        for seq, token, computed in zip(ordered, tokens, logprobs):
            out = self._advance(seq, token, computed)
            if out.finished:
                self._drop(out)
            outputs.append(out)
        return outputs

    def _run(self, batch) -> tuple[torch.Tensor, list[str]]:
        if batch.prefill:
            ids = [seq.id for seq in batch.prefill]
            return self.runner.prefill(ids, [seq.request.prompt_token_ids for seq in batch.prefill]), ids
        logits = self.runner.decode({seq.id: seq.last_token for seq in batch.decode})
        return logits, list(self.runner.rows)

    @torch.inference_mode()  # the runner's logits are inference tensors; masks edit them in place
    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprobs | None]]:
        """JSON grammar masks, then penalties and one token per row (`sampler.sample`); the
        logprobs of the rows that asked for them, from the logits as the model gave them."""
        logits = logits.float()
        params = [s.sampling for s in seqs]
        raw = raw_logprobs(logits, params)  # before the masks, which edit `logits` in place
        if self._matchers:
            self.structured.mask(logits, [self._matchers.get(s.id) for s in seqs])
        tokens = sample(logits, params, [self._generators[s.id] for s in seqs],
                        [self._earlier.get(s.id, []) + s.output_token_ids if s.id in self._earlier
                         else s.output_token_ids for s in seqs])
        return tokens, [token_logprobs(raw[row], token, p.top_logprobs) if p.logprobs else None
                        for row, (token, p) in enumerate(zip(tokens, params))]

    def _advance(self, seq: Sequence, token: int, computed: TokenLogprobs | None = None) -> RequestOutput:
        """The grammar has its say first; the rest (EOS, stop strings, max_tokens) is the output
        processor's. A completed JSON document ends the request as EOS would."""
        seq.output_token_ids.append(token)
        matcher = self._matchers.get(seq.id)
        if matcher is not None and not matcher.accept_token(token):
            return self.processor.finish(seq.id, FinishReason.ERROR, new_ids=[token],
                                       error=f"structured output: token {token} does not fit the grammar")
        done = matcher is not None and matcher.is_terminated()
        return self.processor.advance(seq.id, [token], FinishReason.STOP if done else None,
                                      [computed] if computed is not None else None)

    def fail_all(self, message: str) -> list[RequestOutput]:
        outputs = self.processor.fail_all(message)
        for out in outputs:
            self._drop(out)
        self.runner.release(list(self.runner.rows))
        return outputs

    def _drop(self, out: RequestOutput) -> None:
        """A request ended: out of the scheduler, and its runner row freed."""
        seq = self._seqs.pop(out.request_id)
        self.scheduler.finish(seq, out.finish_reason)
        self.runner.release([seq.id])
        self._generators.pop(seq.id, None)
        self._matchers.pop(seq.id, None)
        self._earlier.pop(seq.id, None)


def build(settings, model) -> tuple[HFEngine, dict]:
    """The HF engine for the worker, sized by llmq's settings, and what the heartbeat says of it."""
    from transformers import AutoTokenizer

    from worker.engine.prefix_cache import PrefixCache
    from worker.engine.runner_hf import HFModelRunner
    from worker.engine.structured import StructuredOutput
    from worker.pinning import set_torch_threads

    threads = set_torch_threads(settings)
    runner = HFModelRunner(model.path, settings.dtype, settings.max_batch_size, settings.max_model_len)
    per_token = runner.kv_bytes_per_token
    if settings.prefix_cache_mb:
        runner.prefix = PrefixCache(settings.prefix_block_size, settings.prefix_cache_mb * 2**20 // per_token)
    budget = settings.kv_cache_mb * 2**20 // per_token
    log.info("engine: dtype=%s, KV budget %d MB = %d tokens, prefix cache %d MB", runner.dtype,
             settings.kv_cache_mb, budget, settings.prefix_cache_mb)
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    structured = StructuredOutput.from_tokenizer(tokenizer, runner.config.vocab_size, runner.eos_token_ids)
    engine = HFEngine(runner, tokenizer, settings.max_batch_size, budget, settings.max_prefill_tokens,
                       structured)
    return engine, {"dtype": str(runner.dtype).removeprefix("torch."), "kv_capacity_tokens": budget,
                    "prefix_caching": runner.prefix is not None, "torch_threads": threads}
