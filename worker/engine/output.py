"""Token ids to llmq's outputs, the same for every engine.

Each engine hands over each step's new token ids per request (and, where it decides that itself,
why a request ended); this processor turns them into text with one `IncrementalDetokenizer` per
request and decides the end: EOS, a stop string, `max_tokens`, a cancel, an error. So text, usage
and finish reasons are identical whichever engine runs. A request that continues an answer
(`EngineRequest.continued`) is tracked as the whole request: its counts and `max_tokens` include
the tokens generated before, and its text starts after the text already sent. A request that ends here while its engine
would go on (a stop string) must then be dropped by the engine: `advance` says so.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.schemas import FinishReason
from worker.engine.detokenizer import Decoder, IncrementalDetokenizer
from worker.engine.protocol import ContinuationRefused, EngineStats
from worker.engine.sequence import EngineRequest, RequestOutput, Sampling, TokenLogprobs
from worker.engine.token_text import TokenTexts


@dataclass
class _Tracked:
    request: EngineRequest
    detok: IncrementalDetokenizer
    seen: int = 0  # output token ids so far (a continued request's earlier ones included)
    start: int = 0  # of which generated before this engine took it (a continued request)


class OutputProcessor:
    """An engine's requests in flight, keyed by request id, and the outputs they produce.

    `eos_token_ids` end a request with `stop` (engines that detect EOS themselves report it as
    their reason instead and may leave it empty)."""

    def __init__(self, tokenizer: Decoder, stats: EngineStats, eos_token_ids: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.stats = stats
        self.eos_token_ids = frozenset(eos_token_ids)
        self.texts = TokenTexts(tokenizer)  # tokens as logprobs entries show them
        self._tracked: dict[str, _Tracked] = {}
        self._cancelled: list[str] = []

    # --- requests ---------------------------------------------------------------------------
    def check_new(self, request: EngineRequest) -> IncrementalDetokenizer:
        """The guards every engine applies before it takes a request (ValueError: fail it alone),
        and the request's detokenizer, which a continued request's generated tokens have
        already been through (`ContinuationRefused` if they do not give its text)."""
        if request.request_id in self._tracked:
            raise ValueError(f"request {request.request_id} is already in the engine")
        if not request.prompt_token_ids:
            raise ValueError("empty prompt")
        detok = IncrementalDetokenizer(self.tokenizer, request.sampling.stop)
        if request.continued is not None:
            if len(request.continued.token_ids) >= request.sampling.max_tokens:
                raise ContinuationRefused("its max_tokens are spent")
            if not detok.resume(request.continued.token_ids, request.continued.text):
                raise ContinuationRefused("its token ids do not decode to the text sent")
        return detok

    def add(self, request: EngineRequest, detok: IncrementalDetokenizer) -> None:
        """Track a request the engine has taken, with the detokenizer `check_new` made for it."""
        seen = len(request.continued.token_ids) if request.continued else 0
        self._tracked[request.request_id] = _Tracked(request, detok, seen, seen)

    def cancel(self, request_id: str) -> bool:
        """Mark a request cancelled; its end is reported by `take_cancelled`. False if it is not
        in flight or already marked (nothing for the engine to do)."""
        if request_id not in self._tracked or request_id in self._cancelled:
            return False
        self._cancelled.append(request_id)
        return True

    def take_cancelled(self) -> list[RequestOutput]:
        """The end (`cancelled`) of every request marked since the last call."""
        outputs = [self.finish(rid, FinishReason.CANCELLED) for rid in self._cancelled if rid in self._tracked]
        self._cancelled.clear()
        return outputs

    def has_cancelled(self) -> bool:
        """A cancel whose end `take_cancelled` has yet to report."""
        return bool(self._cancelled)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._tracked

    def __len__(self) -> int:
        return len(self._tracked)

    def ids(self) -> list[str]:
        return list(self._tracked)

    def has_unfinished(self) -> bool:
        return bool(self._tracked) or bool(self._cancelled)

    def sampling(self, request_id: str) -> Sampling:
        return self._tracked[request_id].request.sampling

    def is_new(self, request_id: str) -> bool:
        """No token received yet: its next step is its prefill."""
        tracked = self._tracked[request_id]
        return tracked.seen == tracked.start

    # --- outputs ----------------------------------------------------------------------------
    def advance(self, request_id: str, new_ids: list[int], engine_reason: FinishReason | None = None,
                logprobs: list[TokenLogprobs] | None = None) -> RequestOutput:
        """This step's tokens of one request; `engine_reason` is why the engine ended it (None:
        still running). A finished output while `engine_reason` is None ended here (EOS, stop
        string, max_tokens): the caller drops the request from its engine. `logprobs`: what the
        engine computed for each of `new_ids`, when the request asked for them."""
        tracked = self._tracked[request_id]
        tracked.seen += len(new_ids)
        self.stats.tokens_generated += len(new_ids)
        text = ""
        for used, token in enumerate(new_ids, 1):
            if token in self.eos_token_ids:
                return self._end(request_id, FinishReason.STOP, text + tracked.detok.flush(), new_ids,
                                 self._entries(tracked, new_ids[:used], logprobs))
            text += tracked.detok.add(token)
            if tracked.detok.stopped:  # nothing after a stop string counts, even in this step
                return self._end(request_id, FinishReason.STOP, text, new_ids,
                                 self._entries(tracked, new_ids[:used], logprobs))
        if engine_reason is None and tracked.seen >= tracked.request.sampling.max_tokens:
            engine_reason = FinishReason.LENGTH
        entries = self._entries(tracked, new_ids, logprobs)
        if engine_reason is not None:
            return self._end(request_id, engine_reason, text + tracked.detok.flush(), new_ids, entries)
        return self._output(tracked, text, new_ids, None, entries)

    def _entries(self, tracked: _Tracked, ids: list[int], logprobs: list[TokenLogprobs] | None) -> list[dict] | None:
        """The logprobs entries of these tokens (special tokens have none); None when not asked."""
        if not tracked.request.sampling.logprobs:
            return None
        entries = (self.texts.entry(token, computed) for token, computed in zip(ids, logprobs or ()))
        return [entry for entry in entries if entry is not None]

    def finish(self, request_id: str, reason: FinishReason, error: str | None = None,
               new_ids: list[int] | None = None) -> RequestOutput:
        """End a request without text: a cancel, or an error (`new_ids`: tokens it made whose
        text is dropped, still counted)."""
        new_ids = new_ids or []
        self._tracked[request_id].seen += len(new_ids)
        self.stats.tokens_generated += len(new_ids)
        out = self._end(request_id, reason, "", new_ids)
        out.error = error
        return out

    def fail_all(self, message: str) -> list[RequestOutput]:
        """An engine-level failure: every request in flight ends with this error."""
        self._cancelled.clear()
        return [self.finish(request_id, FinishReason.ERROR, message) for request_id in self.ids()]

    def _end(self, request_id: str, reason: FinishReason, text: str, new_ids: list[int],
             entries: list[dict] | None = None) -> RequestOutput:
        return self._output(self._tracked.pop(request_id), text, new_ids, reason, entries)

    def _output(self, tracked: _Tracked, text: str, new_ids: list[int],
                reason: FinishReason | None, entries: list[dict] | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=tracked.request.request_id, text=text, new_token_ids=new_ids,
            finished=reason is not None, finish_reason=reason,
            prompt_tokens=len(tracked.request.prompt_token_ids), completion_tokens=tracked.seen,
            batch_size=self.stats.last_batch_size, logprobs=entries)
