"""The engine step: schedule -> run the model -> sample -> detokenize -> outputs.

Single-threaded by design; `loop.EngineLoop` drives it for callers on other threads. A failure of
one request (bad params) fails that request only; a failure of the model step fails every
in-flight request, and the engine stays usable for the next ones.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from worker.engine.detokenizer import Decoder, IncrementalDetokenizer
from worker.engine.sampler import make_generator, sample
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import EngineRequest, RequestOutput, Sequence

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


@dataclass
class EngineStats:
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


class LLMEngine:
    def __init__(self, runner: ModelRunner, tokenizer: Decoder, max_batch_size: int = 16,
                 kv_budget_tokens: int = 1 << 20, max_prefill_tokens: int = 1 << 30,
                 structured: StructuredOutput | None = None):
        self.runner = runner
        self.structured = structured  # JSON output (response_format); None: such requests are refused
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(max_batch_size, kv_budget_tokens, max_prefill_tokens,
                                   getattr(runner, "prefill_tokens", len))
        self.stats = EngineStats()
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._generators: dict[str, torch.Generator] = {}
        self._seqs: dict[str, Sequence] = {}
        self._matchers: dict[str, GrammarMatcher] = {}  # request id -> its grammar matcher (JSON output)
        self._aborted: list[str] = []

    # --- requests -------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        if request.request_id in self._seqs:
            raise ValueError(f"request {request.request_id} is already in the engine")
        if not request.prompt_token_ids:
            raise ValueError("empty prompt")
        matcher = self._matcher_for(request)
        seq = Sequence(request)
        self.scheduler.add(seq)
        if matcher is not None:
            self._matchers[seq.id] = matcher
        self._seqs[seq.id] = seq
        self._detok[seq.id] = IncrementalDetokenizer(self.tokenizer, request.sampling.stop)
        self._generators[seq.id] = make_generator(request.sampling)

    def _matcher_for(self, request: EngineRequest):
        fmt = request.sampling.response_format
        if fmt is None:
            return None
        if self.structured is None:
            raise ValueError("this engine does not support response_format (structured output)")
        return self.structured.matcher(fmt)

    def abort_request(self, request_id: str) -> None:
        """Mark for removal; the next `step` reports it finished with reason 'cancelled'."""
        if request_id in self._seqs:
            self._aborted.append(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or bool(self._aborted)

    def ready(self) -> bool:
        """Whether `step` has something to do without waiting: always here, where the step is the
        model's computation itself (vLLM's adapter waits for another process's step)."""
        return True

    def on_ready(self, wake) -> None:
        """Nothing to announce: this engine is always ready (see `ready`)."""

    # --- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = self._retire_aborted()
        batch = self.scheduler.schedule()
        if batch.empty:
            return outputs
        by_id = {seq.id: seq for seq in batch.prefill or batch.decode}
        try:
            logits, order = self._run(batch)
            ordered = [by_id[rid] for rid in order]
            tokens = self._sample(logits, ordered)
        except Exception as exc:  # engine-level failure: fail every in-flight request
            log.exception("model step failed; failing %d requests", len(self._seqs))
            return outputs + self.fail_all(f"engine error: {exc}")
        self.stats.record_step(len(self.runner.rows), prefill=bool(batch.prefill))
        for seq, token in zip(ordered, tokens):
            outputs.append(self._advance(seq, token))
        self.runner.release([o.request_id for o in outputs if o.finished])
        return outputs

    def _run(self, batch) -> tuple[torch.Tensor, list[str]]:
        if batch.prefill:
            ids = [seq.id for seq in batch.prefill]
            return self.runner.prefill(ids, [seq.request.prompt_token_ids for seq in batch.prefill]), ids
        logits = self.runner.decode({seq.id: seq.last_token for seq in batch.decode})
        return logits, list(self.runner.rows)

    @torch.inference_mode()  # the runner's logits are inference tensors; masks edit them in place
    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """JSON grammar masks, then penalties and one token per row (`sampler.sample`)."""
        logits = logits.float()
        if self._matchers:
            self.structured.mask(logits, [self._matchers.get(s.id) for s in seqs])
        return sample(logits, [s.sampling for s in seqs], [self._generators[s.id] for s in seqs],
                      [s.output_token_ids for s in seqs])

    def _advance(self, seq: Sequence, token: int) -> RequestOutput:
        seq.output_token_ids.append(token)
        self.stats.tokens_generated += 1
        detok = self._detok[seq.id]
        reason = None
        matcher = self._matchers.get(seq.id)
        if matcher is not None and not matcher.accept_token(token):
            self._finish(seq, "error")
            out = self._output(seq, "", [token], "error")
            out.error = f"structured output: token {token} does not fit the grammar"
            return out
        if token in self.runner.eos_token_ids:
            reason = "stop"
            text = detok.flush()
        else:
            text = detok.add(token)
            if detok.stopped:
                reason = "stop"
            elif matcher is not None and matcher.is_terminated():
                reason = "stop"  # the JSON is complete
                text += detok.flush()
            elif len(seq.output_token_ids) >= seq.sampling.max_tokens:
                reason = "length"
                text += detok.flush()
        if reason:
            self._finish(seq, reason)
        return self._output(seq, text, [token], reason)

    def _retire_aborted(self) -> list[RequestOutput]:
        outputs = []
        for request_id in dict.fromkeys(self._aborted):
            seq = self._seqs.get(request_id)
            if seq is not None:
                self._finish(seq, "cancelled")
                self.runner.release([request_id])
                outputs.append(self._output(seq, "", [], "cancelled"))
        self._aborted.clear()
        return outputs

    def fail_all(self, message: str) -> list[RequestOutput]:
        outputs = []
        for seq in list(self._seqs.values()):
            self._finish(seq, "error")
            out = self._output(seq, "", [], "error")
            out.error = message
            outputs.append(out)
        self.runner.release(list(self.runner.rows))
        return outputs

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        self._seqs.pop(seq.id, None)
        self._detok.pop(seq.id, None)
        self._generators.pop(seq.id, None)
        self._matchers.pop(seq.id, None)

    def _output(self, seq: Sequence, text: str, new_ids: list[int], reason: str | None) -> RequestOutput:
        return RequestOutput(
            request_id=seq.id, text=text, new_token_ids=new_ids, finished=reason is not None,
            finish_reason=reason, prompt_tokens=seq.prompt_len,
            completion_tokens=len(seq.output_token_ids), batch_size=self.stats.last_batch_size,
        )
