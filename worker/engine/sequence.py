"""Per-request state as the engine sees it."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from common.schemas import FinishReason


@dataclass(frozen=True)
class ResponseFormat:
    """Constrain the output to JSON: `json_object` (any object) or `json_schema` (`schema` is the
    schema as JSON text)."""

    kind: str
    schema: str | None = None


@dataclass(frozen=True)
class Sampling:
    """Decoding parameters of one request (the engine's copy; no pydantic here)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    response_format: ResponseFormat | None = None
    logprobs: bool = False  # each token's logprob (common/logprobs.py) ...
    top_logprobs: int = 0  # ... and this many most likely alternatives


@dataclass(frozen=True)
class Continued:
    """The start of an answer that a lost attempt generated, for this request to continue: its
    token ids and the text clients already received from them (common/continuation.py)."""

    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling = Sampling()
    continued: Continued | None = None


def model_request(request: EngineRequest) -> EngineRequest:
    """The request the model runs: a continued one's generated tokens join its prompt and its
    `max_tokens` shrinks by as many. Its text, usage and finish are still the whole request's
    (`output.OutputProcessor` tracks the request itself)."""
    if request.continued is None:
        return request
    ids = request.continued.token_ids
    return EngineRequest(request.request_id, [*request.prompt_token_ids, *ids],
                         replace(request.sampling, max_tokens=request.sampling.max_tokens - len(ids)))


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """A request inside the engine: its tokens so far and where it stands."""

    request: EngineRequest
    state: SeqState = SeqState.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def id(self) -> str:
        return self.request.request_id

    @property
    def sampling(self) -> Sampling:
        return self.request.sampling

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.output_token_ids)

    @property
    def last_token(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.request.prompt_token_ids[-1]

    @property
    def reserved_tokens(self) -> int:
        """KV slots this sequence may need by the end: admission reserves them up front."""
        return self.prompt_len + self.sampling.max_tokens


@dataclass
class RequestOutput:
    """What one step produced for one request: new text, and the final state when it ends."""

    request_id: str
    text: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    batch_size: int = 1
    error: str | None = None
    error_type: str = "engine_error"  # "invalid_request" when the engine refused the request itself
    logprobs: list[dict] | None = None  # with Sampling.logprobs: one entry per token (common/logprobs.py)


@dataclass(frozen=True)
class TokenLogprobs:
    """What an engine computed for one generated token: its logprob and the top alternatives
    as (token id, logprob), most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
