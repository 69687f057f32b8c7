"""The one typed settings object. Every environment variable llmq reads is declared here."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


class Settings(BaseSettings):
    """Configuration for API and workers, read from `LLMQ_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore")

    # Redis / Celery
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_sentinels: str = Field(
        "", description="'host:port,host:port' of Redis Sentinels; set: every client follows the "
                        "master they name (redis_url then gives only the db number and password)")
    redis_master_name: str = Field("llmq", description="the master's name in the sentinels' config")
    namespace: str = Field("llmq", description="prefix of every Redis key, queue and channel")
    visibility_timeout_s: int = Field(
        120, description="Redis broker redelivery delay for jobs of a lost worker; live workers "
                         "renew their jobs every heartbeat, so it need not exceed the longest job"
    )

    # Model
    model: str = Field(DEFAULT_MODEL, description="HF model name or local path")
    catalog: Path | None = Field(
        None, description="TOML or JSON file naming the models served (name -> source, engine "
                          "settings); unset: one model, `model` (common/catalog.py)")
    model_cache_dir: Path = Path.home() / ".cache" / "llmq" / "models"
    allow_download: bool = Field(True, description="try the HF hub when the model is not local")
    max_model_len: int = Field(4096, description="context cap (prompt + completion), below the model's own")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "auto", description="auto: bfloat16 where the CPU has native BF16 (AVX512-BF16/AMX), else float32")

    # Engine / worker
    engine: Literal["auto", "openvino", "vllm", "hf"] = Field(
        "auto", description="auto: vllm on a CUDA machine where vllm is installed, else openvino "
                            "where openvino-genai is installed, else hf (the reference engine, "
                            "and the fallback when OpenVINO cannot read or export the model)")
    weights: Literal["auto", "int8", "int4", "bf16", "gguf"] = Field(
        "auto", description="weights the OpenVINO engine computes with: a model exported once to "
                            "OpenVINO IR in int8, int4 (groups of 64) or bf16; or 'gguf': a GGUF "
                            "model's own file as OpenVINO reads it (no export, but it drifts from "
                            "the model's float weights as far as int4 does: docs/engines.md); auto: "
                            "what `python -m worker.tune` measured fastest here, else int8")
    tuning_dir: Path | None = Field(None, description="where `python -m worker.tune` records the engine and "
                                                  "weights it measured fastest per model; default: "
                                                  "LLMQ_MODEL_CACHE_DIR/tuning")
    openvino_export_python: Path | None = Field(
        None, description="Python of the environment that holds optimum-intel, which exports "
                          "models to OpenVINO IR; default: .venv-export beside the running "
                          "environment (ops/common.sh makes it)")
    openvino_activation_group: int | None = Field(
        None, ge=0, description="int8/int4 weights on the OpenVINO engine: the CPU plugin quantizes "
                                "activations to int8 in groups of this many values (OpenVINO's "
                                "DYNAMIC_QUANTIZATION_GROUP_SIZE); larger groups step faster on CPUs "
                                "with VNNI and round a little more, 0 leaves activations unquantized "
                                "(no int8 dot products); unset: the plugin's default (docs/engines.md)")
    prompt_lookup: bool = Field(
        False, description="prompt-lookup (n-gram) speculative decoding on the OpenVINO and vLLM "
                           "engines: draft tokens are copied from the prompt where its last tokens "
                           "occurred before, and the model checks them all in one step; the same "
                           "answer, faster when answers quote their input (edits, extraction, "
                           "summaries), slower otherwise (docs/engines.md)")
    prompt_lookup_tokens: int = Field(4, ge=1, le=16, description="draft tokens proposed per step")
    prompt_lookup_ngram: int = Field(3, ge=1, le=8, description="longest n-gram matched to find a draft")
    max_batch_size: int = Field(16, ge=1, le=256)
    kv_cache_mb: int = Field(2048, ge=1, description="KV cache memory budget per worker; admission keeps "
                             "running rows x their longest reservation (prompt + max_tokens) inside it")
    prefix_cache_mb: int = Field(256, ge=0, description="memory for reusable prompt-prefix KV blocks; 0 = off")
    prefix_block_size: int = Field(32, ge=4, description="tokens per prefix-cache block")
    max_prefill_tokens: int = Field(768, ge=1, description="padded prompt tokens computed per prefill "
                                    "step (a single longer prompt still runs alone)")
    worker_max_models: int = Field(
        1, ge=1, description="catalog models one worker holds at once; it loads a model that has "
                             "queued jobs and no live worker, unloading an idle one if it has no room")
    worker_memory_mb: int = Field(
        0, ge=0, description="memory a worker's models may take together (weights on disk plus "
                             "their KV cache); 0: only worker_max_models bounds them")
    model_idle_s: float = Field(
        60.0, ge=0, description="how long a model a worker holds must have had no queued or running "
                                "job before the worker may unload it for another")
    cpus: str | None = Field(None, description="CPU set for the worker, e.g. '0-1' or '0,2'")
    torch_threads: int | None = Field(None, description="threads an engine on torch (hf, vllm's "
                                                     "parent process) computes with; default: one per "
                                                     "core of the worker's CPU set")
    cancel_poll_s: float = Field(0.1, gt=0, description="how often a worker looks for cancels of the "
                                                    "jobs it runs (one read for all of them)")
    heartbeat_s: float = 5.0
    max_attempts: int = Field(3, description="deliveries of one job before it is failed as poison")

    # API limits
    max_tokens_cap: int = Field(2048, description="largest max_tokens a request may ask for")
    default_max_tokens: int = 256
    max_queue: int = Field(1000, description="queued jobs above which POST answers 429")
    max_body_bytes: int = 1_000_000
    sse_heartbeat_s: float = 10.0
    max_streams_per_process: int = Field(
        10_000, ge=1, description="open streams one API process holds (SSE and OpenAI streams, and "
                                  "OpenAI requests waiting for their whole answer); above it a new "
                                  "one is answered 503 with Retry-After, before any job is queued")
    max_streams_per_key: int = Field(
        1000, ge=0, description="open streams of one API key across every API process (a key's "
                                "`streams=N` overrides it); above it 429 with Retry-After; 0: no limit")
    queue_place_interval_s: float = Field(
        1.0, gt=0, description="how often the API works out the queue position of every job its "
                               "streams wait on")
    queue_place_every_s: float = Field(
        5.0, gt=0, description="a waiting stream hears its place when it changes and at least this often")
    health_ping_timeout_s: float = 1.0

    # Retention
    job_ttl_s: int = Field(7 * 86400, description="how long job records and token logs are kept after finishing")
    cache_ttl_s: int = Field(86400, description="result cache TTL; 0 disables the cache")
    events_maxlen: int = 20000

    # Logging
    log_level: str = "INFO"
    log_json: bool = False

    # Operations: worker metrics, Flower privacy, the vLLM engine
    metrics_port: int = Field(0, ge=0, le=65535, description="worker's Prometheus port; 0 disables it")
    metrics_host: str = Field("127.0.0.1", description="address the worker's metrics server binds")
    private_task_events: bool = Field(
        False, description="keep job ids out of Celery events and Flower: random task ids, args shown "
                           "as the model only (a job id is enough to read a job when auth is off)")
    stream_interval_ms: float = Field(
        100.0, ge=0, le=1000, description="how long a running job's new text gathers before it is "
                                          "relayed (one Redis write and one SSE event for all of it, "
                                          "so about 10 events a second); the first text goes out at "
                                          "once; 0: every decode step")
    stream_writes_per_s: float = Field(
        100.0, ge=0, description="about how many times a second a worker's running jobs relay text, "
                                 "all together: past that many jobs per stream_interval_ms, each job's "
                                 "text gathers longer (up to 1 s), so that the writes and SSE events "
                                 "leave the CPU to the engine; 0: stream_interval_ms for every job")
    vllm_gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    vllm_enforce_eager: bool = Field(False, description="skip CUDA graphs: faster start, slower steps")
    vllm_tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs (on CPU: groups of the worker's cores) each layer of the model is "
                             "split over; a worker owns tensor x pipeline parallel GPUs "
                             "(ops/workers.sh --gpu-groups)")
    vllm_pipeline_parallel_size: int = Field(
        1, ge=1, description="stages the model's layers are split into, one GPU group each")
    vllm_cpu_reserved_cores: int = Field(
        0, ge=0, description="on CPU, cores of the worker's CPU set that vLLM's compute threads leave "
                             "to its scheduler, the job threads, the API and Redis (at least one core "
                             "always computes); 0: vLLM computes on all of them")
    vllm_relay_nice: int = Field(
        0, ge=0, le=19, description="on CPU, the niceness the worker's own threads (the token relay to "
                                    "Redis) and, from ops/run.sh, the API take beside vLLM; 10 pays "
                                    "with a core reserved (vllm_cpu_reserved_cores), where the relay "
                                    "shares it with vLLM's engine core; 0: equal priority")
    vllm_max_batched_tokens: int = Field(
        0, ge=0, description="prompt and answer tokens vLLM computes in one step (its "
                             "max_num_batched_tokens): the running answers' next tokens, then chunks of "
                             "the waiting prompts, oldest first; 0: what vLLM's own OpenAI server takes "
                             "on this hardware (2048 on a CPU, where a larger step prefills several "
                             "long prompts together and each waits for all)")
    vllm_relay_delay_ms: float = Field(
        0.0, ge=0, le=20, description="on CPU, how long the worker holds each step's tokens before "
                                      "relaying them, so that vLLM's engine core schedules the next "
                                      "step before the relay (worker, Redis, API) takes the core; "
                                      "0: relay at once (see worker.pinning.relay_delay_s)")

    # Faults, deadlines, auth, rate limits, priorities
    broker_restore_interval_s: float = Field(
        10.0, description="how often a worker looks for unacked jobs past the visibility timeout")
    queue_timeout_s: float = Field(3600.0, ge=0, description="a job queued longer expires; 0: never")
    run_timeout_s: float = Field(600.0, ge=0, description="a job running longer is stopped "
                                                           "(finish reason 'timeout'); 0: never")
    redis_retry_s: float = Field(60.0, description="how long a worker keeps retrying Redis writes "
                                                  "of a running job during an outage")
    api_keys: str = Field("", description="comma-separated 'id:sha256hex[:tier=..][:rpm=..]"
                                          "[:concurrent=..]' entries; empty (and no file): no auth")
    api_keys_file: Path | None = Field(None, description="file of key entries, one per line")
    rate_limit_rpm: int = Field(0, ge=0, description="job submissions per key per minute; 0: no limit")
    rate_limit_concurrent: int = Field(0, ge=0, description="queued+running jobs per key; 0: no limit")

    # Coalescing
    coalesce: bool = Field(True, description="an identical deterministic request (same model, prompt "
                           "and sampling, cache allowed) attaches to a queued or running one")

    # OpenAI-compatible API
    cancel_on_disconnect: bool = Field(
        True, description="a client leaving an OpenAI streaming request cancels its job")

    # Webhooks: signed callbacks when a job (or a batch) changes state; see common/webhooks.py
    webhook_secrets: str = Field(
        "", repr=False, description="space-separated signing secrets 'whsec_<base64>'; every delivery is signed "
                        "with each (rotation: add the new one, drop the old one later); empty: "
                        "webhooks are off and requests naming one are refused")
    webhook_allow_networks: str = Field(
        "", description="comma-separated CIDRs a webhook may reach although they are not public "
                        "(private, loopback, link-local...), e.g. '10.1.0.0/16'; empty: public only")
    webhook_timeout_s: float = Field(10.0, gt=0, description="the most one delivery attempt takes "
                                     "in all: lookup, connect, send and the answer's headers")
    webhook_dns_timeout_s: float = Field(2.0, gt=0, description="how long the API waits for a "
                                         "webhook's host to resolve when a job names it (then 422)")
    webhook_backoff_s: float = Field(5.0, gt=0, description="delay before the first retry; doubles "
                                     "each attempt (with jitter), up to webhook_backoff_max_s")
    webhook_backoff_max_s: float = Field(3600.0, gt=0)
    webhook_retry_horizon_s: float = Field(
        86400.0, gt=0, description="no attempt is scheduled later than this after the event")
    control_concurrency: int = Field(8, ge=1, description="tasks (webhook deliveries, batch steps) a "
                                     "control worker runs at once")

    @property
    def heartbeat_ttl_s(self) -> int:
        """Seconds what a worker renews on its heartbeat (its registry entry, job leases, free-slot
        count, model-load lock) outlives its last one: three heartbeats, at least 3."""
        return max(3, int(3 * self.heartbeat_s))

    @field_validator("catalog", mode="before")
    @classmethod
    def _no_catalog_when_empty(cls, value):
        return value or None  # LLMQ_CATALOG= (as compose passes an unset one): no catalog

    @field_validator("webhook_secrets")
    @classmethod
    def _secrets_decode(cls, value: str) -> str:
        from common.webhook_rules import secret_keys

        secret_keys(value)  # a bad secret stops the process at start, not at the first delivery
        return value

    @field_validator("webhook_allow_networks")
    @classmethod
    def _networks_parse(cls, value: str) -> str:
        from common.webhook_rules import allowed_networks

        allowed_networks(value)  # 'not a network' is a start-up error
        return value

    # Files and batches (OpenAI's /v1/files and /v1/batches)
    file_max_bytes: int = Field(200 * 1024 * 1024, ge=1, description="largest uploaded file (OpenAI: 200 MB)")
    file_max_lines: int = Field(50_000, ge=1, description="most lines in a batch input file (OpenAI: 50,000)")
    file_ttl_s: int = Field(30 * 86400, ge=60, description="how long uploaded files and batch output "
                                                           "files are kept in Redis")
    batch_window_s: float = Field(86400.0, gt=0, description="what completion_window '24h' means: a batch "
                                  "not done this long after creation expires (tests shorten it)")
    batch_ttl_s: int = Field(30 * 86400, ge=60, description="how long batch records are kept after they end")
    batch_poll_s: float = Field(1.0, gt=0, description="how often a batch's progress is collected")
    batch_max_share: float = Field(
        0.5, gt=0, le=1, description="share of a worker's slots batch lines may hold while interactive "
                                     "jobs run there (or did within batch_yield_window_s); the other "
                                     "slots wait free for them; 1: batch lines may take every slot")
    batch_yield_window_s: float = Field(
        10.0, ge=0, description="how long after its last interactive job a worker keeps slots free "
                                "of batch lines")
    prefix_affinity_wait_s: float = Field(
        0.5, ge=0, description="longest a job at the head of its queue is kept for a worker that recently "
                               "served its prompt's leading tokens (and likely still caches them), while "
                               "that worker says it has a free slot; 0 = prefix affinity off")
    batch_cancel_grace_s: float = Field(60.0, ge=0, description="how long a cancelling batch waits for its "
                                        "running lines to stop before it records them as cancelled")


def subprocess_env(settings: Settings, base: dict[str, str]) -> dict[str, str]:
    """`base` (an environment) with its LLMQ_* variables replaced by `settings`: what makes a
    process started with it see these settings."""
    env = {k: v for k, v in base.items() if not k.startswith("LLMQ_")}
    env.update({f"LLMQ_{name.upper()}": str(value) for name, value in settings.model_dump().items()
                if value is not None})
    return env


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
