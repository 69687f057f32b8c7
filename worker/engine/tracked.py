"""The requests of an engine that schedules and samples on its own (vLLM, OpenVINO GenAI).

Such an engine hands back each step's new token ids and, at the end, why it stopped; llmq turns
them into text itself, with one `IncrementalDetokenizer` per request, so stop strings, UTF-8
handling, usage and finish reasons are the same whichever engine runs. A stop string is found
here, not by the engine: the adapter then drops the request from its engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from worker.engine.detokenizer import Decoder, IncrementalDetokenizer
from worker.engine.engine import EngineStats
from worker.engine.sequence import EngineRequest, RequestOutput


@dataclass
class Tracked:
    request: EngineRequest
    detok: IncrementalDetokenizer
    seen: int = 0  # output token ids received so far


class TrackedRequests:
    """The adapter's requests in flight, keyed by llmq's request id."""

    def __init__(self, tokenizer: Decoder, stats: EngineStats):
        self.tokenizer = tokenizer
        self.stats = stats
        self._tracked: dict[str, Tracked] = {}

    def check_new(self, request: EngineRequest) -> None:
        """The guards every engine applies before it takes a request (ValueError: fail it alone)."""
        if request.request_id in self._tracked:
            raise ValueError(f"request {request.request_id} is already in the engine")
        if not request.prompt_token_ids:
            raise ValueError("empty prompt")

    def add(self, request: EngineRequest) -> None:
        self._tracked[request.request_id] = Tracked(
            request, IncrementalDetokenizer(self.tokenizer, request.sampling.stop))

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._tracked

    def __len__(self) -> int:
        return len(self._tracked)

    def ids(self) -> list[str]:
        return list(self._tracked)

    def is_new(self, request_id: str) -> bool:
        """No token received yet: its next step is its prefill."""
        return not self._tracked[request_id].seen

    def advance(self, request_id: str, new_ids: list[int], engine_reason: str | None) -> RequestOutput:
        """This step's tokens of one request; `engine_reason` is why the engine ended it (None:
        still running). An output that ends with `finish_reason='stop'` while `engine_reason` is
        None hit a stop string: the caller drops it from its engine."""
        tracked = self._tracked[request_id]
        tracked.seen += len(new_ids)
        self.stats.tokens_generated += len(new_ids)
        text = ""
        for token in new_ids:
            text += tracked.detok.add(token)
            if tracked.detok.stopped:  # nothing after a stop string counts, even in this step
                return self.finish(request_id, "stop", text, new_ids)
        if engine_reason is not None:
            return self.finish(request_id, engine_reason, text + tracked.detok.flush(), new_ids)
        return self._output(tracked, text, new_ids, None)

    def finish(self, request_id: str, reason: str, text: str = "", new_ids: list[int] | None = None,
               error: str | None = None) -> RequestOutput:
        out = self._output(self._tracked.pop(request_id), text, new_ids or [], reason)
        out.error = error
        return out

    def fail_all(self, message: str) -> list[RequestOutput]:
        """An engine-level failure: every request in flight ends with this error."""
        return [self.finish(request_id, "error", error=message) for request_id in self.ids()]

    def _output(self, tracked: Tracked, text: str, new_ids: list[int], reason: str | None) -> RequestOutput:
        return RequestOutput(
            request_id=tracked.request.request_id, text=text, new_token_ids=new_ids,
            finished=reason is not None, finish_reason=reason,
            prompt_tokens=len(tracked.request.prompt_token_ids), completion_tokens=tracked.seen,
            batch_size=self.stats.last_batch_size)
