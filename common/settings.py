"""The one typed settings object. Every environment variable llmq reads is declared here."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


class Settings(BaseSettings):
    """Configuration for API and workers, read from `LLMQ_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore")

    # Redis / Celery
    redis_url: str = "redis://127.0.0.1:6379/0"
    namespace: str = Field("llmq", description="prefix of every Redis key, queue and channel")
    visibility_timeout_s: int = Field(
        3600, description="Redis broker redelivery delay for unacked jobs; must exceed the longest job"
    )

    # Model
    model: str = Field(DEFAULT_MODEL, description="HF model name or local path")
    model_cache_dir: Path = Path.home() / ".cache" / "llmq" / "models"
    allow_download: bool = Field(True, description="try the HF hub when the model is not local")
    max_model_len: int = Field(4096, description="context cap (prompt + completion), below the model's own")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"

    # Engine / worker
    engine: Literal["hf", "vllm"] = "hf"
    max_batch_size: int = Field(16, ge=1, le=256)
    max_batch_tokens: int = Field(32768, description="KV tokens reserved by running sequences, at most")
    cpus: str | None = Field(None, description="CPU set for the worker, e.g. '0-1' or '0,2'")
    torch_threads: int | None = None
    cancel_poll_s: float = 0.1
    heartbeat_s: float = 5.0
    max_attempts: int = Field(3, description="deliveries of one job before it is failed as poison")

    # API limits
    max_tokens_cap: int = Field(2048, description="largest max_tokens a request may ask for")
    default_max_tokens: int = 256
    max_queue: int = Field(1000, description="queued jobs above which POST answers 429")
    max_body_bytes: int = 1_000_000
    sse_heartbeat_s: float = 10.0
    health_ping_timeout_s: float = 1.0

    # Retention
    job_ttl_s: int = Field(7 * 86400, description="how long job records and token logs are kept after finishing")
    cache_ttl_s: int = Field(86400, description="result cache TTL; 0 disables the cache")
    events_maxlen: int = 20000

    # Logging
    log_level: str = "INFO"
    log_json: bool = False

    # OpenAI-compatible API (issue 3)
    cancel_on_disconnect: bool = Field(
        True, description="a client leaving an OpenAI streaming request cancels its job")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
