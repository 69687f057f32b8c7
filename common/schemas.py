"""Request and job schemas shared by the API (validation) and the worker (reading job records)."""
from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"
    TIMEOUT = "timeout"


# Job priorities -> Celery message priorities (on Redis, 0 is served first).
Priority = Literal["high", "normal", "low"]
PRIORITY_LEVELS: dict[str, int] = {"high": 0, "normal": 3, "low": 6}


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1)


class SamplingParams(BaseModel):
    """Per-request decoding parameters; the engine honours each one per sequence."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=8)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value):
        if isinstance(value, str):
            return [value]
        return value if value is not None else []

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must be non-empty")
        return value

    @property
    def deterministic(self) -> bool:
        """Same request, same answer: greedy decoding or a fixed seed."""
        return self.temperature == 0 or self.seed is not None


class JobRequest(SamplingParams):
    """Body of POST /v1/jobs: either chat `messages` or a raw `prompt`."""

    messages: list[Message] | None = Field(None, min_length=1)
    prompt: str | None = Field(None, min_length=1)
    model: str | None = None
    stream: bool = False
    cache: bool = True
    priority: Priority | None = Field(None, description="default: the API key's tier, else normal")
    queue_timeout: float | None = Field(None, gt=0, le=7 * 86400,
                                        description="seconds the job may wait in the queue")
    run_timeout: float | None = Field(None, gt=0, le=7 * 86400,
                                      description="seconds the generation may run")

    @model_validator(mode="after")
    def _one_input(self) -> "JobRequest":
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' or 'prompt'")
        return self

    def sampling(self) -> SamplingParams:
        return SamplingParams(**self.model_dump(include=set(SamplingParams.model_fields)))
